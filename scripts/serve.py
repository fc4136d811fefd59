#!/usr/bin/env python
"""Start tritonserver on model_repository/ in the foreground; Ctrl-C stops it cleanly.

    python scripts/serve.py [--deployment configs/tiny-pixart-sigma.toml] [--host 127.0.0.1]

Binds to localhost unless --host says otherwise. On Ctrl-C (or SIGTERM) the server
unloads its models, which ends every Python stub and frees its /dev/shm regions.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from ditserve.launcher import ServerOptions, TritonServer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", help="deployment TOML (default: $DITSERVE_DEPLOYMENT or the tiny pipeline)")
    p.add_argument("--model-repository", type=Path, default=ServerOptions.model_repository)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--log-file", type=Path, help="write the server log here instead of the terminal")
    args = p.parse_args(argv)

    server = TritonServer(ServerOptions(args.model_repository, args.http_port, args.grpc_port, args.metrics_port,
                                        args.host, args.deployment, args.log_verbose), log_path=args.log_file)
    stopping = False

    def stop(signum, frame):
        # Only signal here: the main thread is inside process.wait() and reaps the server.
        nonlocal stopping
        if stopping:
            print("\n[serve] second interrupt: killing tritonserver and its stubs", file=sys.stderr, flush=True)
            server.kill()
            return
        stopping = True
        print("\n[serve] stopping tritonserver (unloading models; Ctrl-C again to kill)...", file=sys.stderr,
              flush=True)
        server.request_stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    server.start()
    try:
        server.wait_ready(timeout_s=600, progress=args.log_file is not None)
    except (RuntimeError, TimeoutError) as exc:
        if stopping:  # interrupted while loading: a clean stop, not a failure
            return 0 if server.process.wait() == 0 else 1
        print(f"[serve] tritonserver failed to start: {exc}", file=sys.stderr)
        server.stop()
        return 1
    print(f"[serve] ready: HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}"
          "  (Ctrl-C to stop)", file=sys.stderr, flush=True)
    code = server.process.wait()
    return 0 if stopping else code


if __name__ == "__main__":
    sys.exit(main())
