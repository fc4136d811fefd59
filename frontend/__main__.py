"""Start the front end: `python -m frontend --triton-url 127.0.0.1:8001 [--port 8080]`.

Binds 127.0.0.1 unless --host says otherwise. DITSERVE_API_KEY sets the key without
putting it on the command line (where `ps` shows it).
"""
from __future__ import annotations

import argparse
import os
import sys

import uvicorn

from .app import Settings, create_app


def parser() -> argparse.ArgumentParser:
    """The command line; tests/test_k8s_manifests.py parses the pod's command with it."""
    defaults = Settings()
    p = argparse.ArgumentParser(prog="python -m frontend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--triton-url", default=defaults.triton_url, help="tritonserver's gRPC address")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=os.environ.get("DITSERVE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $DITSERVE_API_KEY, else none)")
    p.add_argument("--max-n", type=int, default=defaults.max_n, help="most images one request may ask for")
    p.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    p.add_argument("--max-video-jobs", type=int, default=defaults.max_video_jobs)
    p.add_argument("--cors-origin", action="append", default=[], dest="cors_origins",
                   help="allow this origin cross-site (repeatable; default: none)")
    p.add_argument("--media-dir", help="folder of stored results served by URL (response_format url, video jobs); "
                                       "default: a new temporary folder, removed at exit")
    p.add_argument("--media-max-files", type=int, default=defaults.media_max_files,
                   help="most stored files; the oldest go first")
    p.add_argument("--media-max-bytes", type=int, default=defaults.media_max_bytes,
                   help="most bytes of stored files; the oldest go first")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = Settings(args.triton_url, args.api_key, args.max_n, args.max_body_bytes, args.max_video_jobs,
                        args.cors_origins, args.media_dir, args.media_max_files, args.media_max_bytes)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
        print(f"[frontend] warning: listening on {args.host} without an API key", file=sys.stderr)
    print(f"[frontend] page and API on http://{args.host}:{args.port}/ (tritonserver gRPC {args.triton_url})",
          file=sys.stderr, flush=True)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
