"""How long dit's cost profile takes at load on the CPU host, on the H200-emulating mixed deployment
(each size's H200 forward cost as sleeps): the server log's "cost curve measured at load in X s"."""
import sys, tempfile, re
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf")]
from ditserve.launcher import ServerOptions, TritonServer, free_ports
import matched_control
work = Path(tempfile.mkdtemp())
dep, _ = matched_control.write_mode_deployment(ROOT / "perf/deployments/tiny-pixart-sigma-h200-mixed.toml", "step:cost",
                                               None, work / "d.toml", {"warm_sizes": ["64x64", "96x96", "128x128"]})
matched_control.render_repository(dep, work / "repo")
h, g, m = free_ports(3)
srv = TritonServer(ServerOptions(model_repository=work / "repo", http_port=h, grpc_port=g, metrics_port=m, deployment=str(dep)),
                   log_path=work / "log")
with srv:   # __enter__ starts it
    srv.wait_ready(timeout_s=900)
line = [ln for ln in (work / "log").read_text().splitlines() if "cost curve measured at load" in ln][-1]
print(re.search(r"measured at load in [0-9.]+ s", line).group(0), "|", line.split("requests):", 1)[1][:400])
