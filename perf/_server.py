"""Run a tritonserver for a perf measurement until SIGTERM/SIGINT (used by run_perf_analyzer.sh).

    python perf/_server.py --ready-file F [--log F] [--deployment configs/x.toml]

Picks free ports, starts the server through `ditserve.launcher`, waits until it is ready,
then writes `<grpc host:port> <http host:port>` to the ready file. On SIGTERM/SIGINT it
stops the server (SIGINT to Triton, SIGKILL of its process group as a last resort) and
exits, so the caller's trap leaves no orphan tritonserver or stub behind.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "backends"))

from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--log", default=None)
    ap.add_argument("--deployment", default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="readiness wait, seconds")
    args = ap.parse_args()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())

    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        ServerOptions(http_port=http, grpc_port=grpc, metrics_port=metrics, deployment=args.deployment),
        log_path=Path(args.log) if args.log else None,
    )
    server.start()
    try:
        server.wait_ready(timeout_s=args.timeout)
        Path(args.ready_file).write_text(f"{server.grpc_url} {server.http_url}\n")
        print(f"[_server] ready: grpc {server.grpc_url} http {server.http_url} (pid {server.process.pid})",
              file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            if server.process.poll() is not None:
                print(f"[_server] tritonserver exited on its own with code {server.process.returncode}",
                      file=sys.stderr, flush=True)
                return 1
        return 0
    except Exception as exc:  # readiness failure: report, then clean up below
        print(f"[_server] {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
