#!/usr/bin/env python
"""Main job: start tritonserver on the default deployment, generate one image, stop.

    python scripts/quickstart.py ["a prompt"] [--output outputs/quickstart.png]

The server log goes to outputs/quickstart-server.log.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT / "scripts"))
import generate  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="a photo of a red cat sitting on a blue sofa")
    p.add_argument("--output", default=str(ROOT / "outputs" / "quickstart.png"))
    p.add_argument("--seed", default="1")
    args = p.parse_args()
    log = ROOT / "outputs" / "quickstart-server.log"
    log.parent.mkdir(exist_ok=True)
    print(f"[quickstart] starting tritonserver (log: {log})", file=sys.stderr, flush=True)
    with TritonServer(ServerOptions(), log_path=log) as server:
        server.wait_ready(timeout_s=600, progress=True)
        print(f"\n[quickstart] server ready on {server.grpc_url}; generating", file=sys.stderr, flush=True)
        return generate.main([args.prompt, "--seed", args.seed, "--output", args.output, "--url", server.grpc_url])


if __name__ == "__main__":
    sys.exit(main())
