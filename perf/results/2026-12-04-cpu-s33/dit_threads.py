"""The dit stub's CPU ticks over 10 lone 100-step requests, by mode: the process's against its live threads'
(tiny PixArt, CPU host; perf/results/2026-12-04-h200-scheduler-s33.md). Usage: .venv/bin/python THIS request_batch step:cost"""
import sys
import tempfile
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf")]
from ditserve.launcher import ServerOptions, TritonServer, free_ports
from ditserve.client import DitClient, GenerationRequest
import matched_control
def ticks(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
def live(pid):
    tot = 0; n = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        f = (t / "stat").read_text().rsplit(")", 1)[1].split(); tot += int(f[11]) + int(f[12]); n += 1
    return tot, n
for mode in sys.argv[1:]:
    work = Path(tempfile.mkdtemp())
    dep, _ = matched_control.write_mode_deployment(ROOT / "configs/tiny-pixart-sigma.toml", mode, None, work / "d.toml")
    matched_control.render_repository(dep, work / "repo")
    h, g, m = free_ports(3)
    srv = TritonServer(ServerOptions(model_repository=work / "repo", http_port=h, grpc_port=g, metrics_port=m, deployment=str(dep)), log_path=work / "log")
    with srv:   # __enter__ starts it
        srv.wait_ready(timeout_s=300)
        dit = [p for p in srv.stub_pids() if b"/dit/" in Path(f"/proc/{p}/cmdline").read_bytes()][0]
        c = DitClient(srv.grpc_url, protocol="grpc-stream"); c.generate(GenerationRequest("w", num_inference_steps=5, seed=1))
        p0, (l0, n0) = ticks(dit), live(dit)
        for i in range(10): c.generate(GenerationRequest("a cat", num_inference_steps=100, seed=i))
        p1, (l1, n1) = ticks(dit), live(dit)
        print(mode, "process ticks", p1 - p0, "live threads' ticks", l1 - l0, "threads", n0, "->", n1)
