#!/usr/bin/env python
"""Start tritonserver and the OpenAI-compatible front end together; Ctrl-C stops both.

    python scripts/web.py                      # the trained tiny PixArt (as the quickstart); open the printed address
    python scripts/web.py --deployment configs/tiny-wan-t2v.toml      # videos, on the tiny Wan2.1

The repository is rendered for the deployment into outputs/web-repo (unless
--model-repository names one). Everything binds to 127.0.0.1. Logs: outputs/web-server.log
(Triton), outputs/web-frontend.log. Extra arguments after `--` go to the front end
(`python -m frontend --help`).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from ditserve.deployment import load_deployment  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, stop_servers_on_signals  # noqa: E402
from frontend.launcher import FrontendProcess  # noqa: E402
from render_repository import render  # noqa: E402

# The model a person should see a picture from: the quickstart's (docs/tiny-model.md).
DEPLOYMENT = ROOT / "configs" / "tiny-pixart-shapes.toml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", type=Path, default=DEPLOYMENT,
                   help="deployment TOML (default: the trained tiny PixArt-Sigma, configs/tiny-pixart-shapes.toml)")
    p.add_argument("--model-repository", type=Path,
                   help="a repository rendered for the deployment (default: rendered into outputs/web-repo)")
    p.add_argument("--port", type=int, default=8080, help="the front end's port (page and API)")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("frontend_args", nargs="*", help="after --: more options for python -m frontend")
    args = p.parse_args(argv)
    logs = ROOT / "outputs"
    logs.mkdir(exist_ok=True)
    repository = args.model_repository
    if repository is None:
        repository = logs / "web-repo"
        render(ROOT / "model_repository", repository, load_deployment(args.deployment))
    options = ServerOptions(repository, grpc_port=args.grpc_port, deployment=str(args.deployment))
    print(f"[web] starting tritonserver on {args.deployment} (log: {logs / 'web-server.log'})", file=sys.stderr,
          flush=True)
    stop_servers_on_signals()   # SIGTERM stops both as Ctrl-C does, the server even while it loads
    with TritonServer(options, log_path=logs / "web-server.log") as server:
        server.wait_ready(timeout_s=600, progress=True)
        with FrontendProcess(server.grpc_url, args.port, args.frontend_args, log_path=logs / "web-frontend.log") as fe:
            print(f"\n[web] ready: open {fe.url}/  (OpenAI base_url {fe.url}/v1; Ctrl-C stops)", file=sys.stderr,
                  flush=True)
            try:
                while server.process.poll() is None and fe.process.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
            print("\n[web] stopping the front end and tritonserver...", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
