#!/usr/bin/env python
"""Main job: start tritonserver on the trained tiny PixArt-Sigma, generate one image, stop.

    python scripts/quickstart.py ["a prompt"] [--output outputs/quickstart.png]

The model (configs/tiny-pixart-shapes.toml, docs/tiny-model.md) knows one shape (circle,
square, triangle) of one colour on a background of another (red, green, blue, yellow,
orange, purple, white, black), at 64x64, so the picture shows whether the server works.
The repository rendered for it goes to outputs/quickstart-repo, the server log to
outputs/quickstart-server.log.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT / "scripts"))
import generate  # noqa: E402
from ditserve.deployment import load_deployment  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, stop_servers_on_signals  # noqa: E402
from render_repository import render  # noqa: E402

DEPLOYMENT = ROOT / "configs" / "tiny-pixart-shapes.toml"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="a red circle on a blue background")
    p.add_argument("--output", default=str(ROOT / "outputs" / "quickstart.png"))
    p.add_argument("--seed", default="1")
    args = p.parse_args()
    outputs = ROOT / "outputs"
    outputs.mkdir(exist_ok=True)
    repo, log = outputs / "quickstart-repo", outputs / "quickstart-server.log"
    render(ROOT / "model_repository", repo, load_deployment(DEPLOYMENT))
    # The server runs in its own session: a SIGTERM (e.g. `timeout`) must stop it too.
    stop_servers_on_signals()
    print(f"[quickstart] starting tritonserver on {DEPLOYMENT.relative_to(ROOT)} (log: {log})", file=sys.stderr,
          flush=True)
    with TritonServer(ServerOptions(model_repository=repo, deployment=str(DEPLOYMENT)), log_path=log) as server:
        server.wait_ready(timeout_s=600, progress=True)
        print(f"\n[quickstart] server ready on {server.grpc_url}; generating", file=sys.stderr, flush=True)
        return generate.main([args.prompt, "--seed", args.seed, "--output", args.output, "--url", server.grpc_url])


if __name__ == "__main__":
    sys.exit(main())
