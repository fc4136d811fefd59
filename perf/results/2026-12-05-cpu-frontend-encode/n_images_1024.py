"""One front-end request of n images at 1024x1024 (tiny random PixArt-Sigma, 1 step, so the
encoder's share is large), PNG and JPEG, median of 5: run once at the commit before the threaded
encoding (git stash) and once after, alternating. Run from the repo root:
    .venv/bin/python perf/results/2026-12-05-cpu-frontend-encode/n_images_1024.py
"""
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT)]
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from frontend.launcher import FrontendProcess  # noqa: E402

work = Path(tempfile.mkdtemp())
config = (ROOT / "configs" / "tiny-pixart-sigma.toml").read_text()
config = config.replace("max_size = 256", "max_size = 1024").replace('path = "models/', f'path = "{ROOT}/models/')
(work / "big.toml").write_text(config)
subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", str(work / "big.toml"),
                "--out", str(work / "repo")], check=True, capture_output=True)
http, grpc, metrics = free_ports(3)
server = TritonServer(ServerOptions(model_repository=work / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics,
                                    deployment=str(work / "big.toml")), log_path=work / "server.log")
server.start()
server.wait_ready(timeout_s=120)
frontend = FrontendProcess(server.grpc_url, free_ports(1)[0], log_path=work / "frontend.log").start()


def post(n: int, output_format: str) -> float:
    body = json.dumps({"prompt": "a red fox", "size": "1024x1024", "seed": 1, "n": n, "num_inference_steps": 1,
                       "guidance_scale": 1.0, "output_format": output_format}).encode()
    start = time.perf_counter()
    request = urllib.request.Request(frontend.url + "/v1/images/generations", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()
    return (time.perf_counter() - start) * 1000


try:
    post(1, "png"), post(4, "png")
    for n in (1, 4):
        png, jpeg = (statistics.median(post(n, f) for _ in range(5)) for f in ("png", "jpeg"))
        print(f"n={n}: png {png:.0f} ms, jpeg {jpeg:.0f} ms", flush=True)
finally:
    frontend.stop()
    server.stop()
