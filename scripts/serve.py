#!/usr/bin/env python
"""Start tritonserver on model_repository/ in the foreground; Ctrl-C stops it cleanly.

    python scripts/serve.py [--deployment configs/tiny-pixart-sigma.toml] [--host 127.0.0.1]

Several deployments side by side, each a named pipeline whose models are prefixed with its
name (`pixart_txt2img`, `flux_txt2img_stream`, ...): the repository is rendered for them
into --render-dir and served from there. With --model-control-mode explicit, pipelines load and
unload one at a time through Triton's repository API (docs/pipelines.md):

    python scripts/serve.py --deployment pixart=configs/tiny-pixart-sigma.toml \
        --deployment flux=configs/tiny-flux.toml --model-control-mode explicit

Binds to localhost unless --host says otherwise. On Ctrl-C (or SIGTERM) the server
unloads its models, which ends every Python stub and frees its /dev/shm regions.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
from ditserve.deployment import load_deployment  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer  # noqa: E402
from ditserve.pipelines import split_model_name  # noqa: E402
from render_repository import parse_deployments, render_pipelines  # noqa: E402


def control_args(mode: str, load: list[str], repository: Path) -> list[str]:
    """tritonserver's model-control arguments: in explicit mode the models of the pipelines in
    `load` (every model when none is named) load at start; the rest wait for the repository API."""
    if mode == "none":
        return []
    if not load:
        return ["--model-control-mode=explicit", "--load-model=*"]
    models = sorted(m.name for m in repository.iterdir() if split_model_name(m.name)[0] in load)
    return ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", action="append", metavar="[NAME=]PATH",
                   help="deployment TOML (default: $DITSERVE_DEPLOYMENT or the tiny pipeline); NAME=PATH, "
                        "repeatable, serves each as pipeline NAME (models NAME_<model>)")
    p.add_argument("--model-repository", type=Path, default=ServerOptions.model_repository,
                   help="the repository to serve; with NAME=PATH deployments, the template rendered for them")
    p.add_argument("--render-dir", type=Path, default=ROOT / ".triton" / "repository",
                   help="where the repository for named deployments is rendered (replaced; default %(default)s)")
    p.add_argument("--model-control-mode", choices=("none", "explicit"), default="none",
                   help="explicit: load/unload models through the repository API")
    p.add_argument("--load-pipeline", action="append", default=[], metavar="NAME",
                   help="explicit mode: load only these pipelines at start (repeatable; default: all)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--log-file", type=Path, help="write the server log here instead of the terminal")
    args = p.parse_args(argv)
    try:
        single, named = parse_deployments(args.deployment or [])
    except ValueError as exc:
        p.error(str(exc))
    unknown = sorted(set(args.load_pipeline) - set(named))
    if unknown or (args.load_pipeline and args.model_control_mode != "explicit"):
        p.error(f"--load-pipeline {' '.join(unknown or args.load_pipeline)}: needs --model-control-mode explicit "
                f"and a pipeline named by --deployment NAME=PATH (named: {', '.join(named) or 'none'})")
    repository = args.model_repository
    if named:
        repository = args.render_dir
        render_pipelines(args.model_repository, repository,
                         {name: load_deployment(path) for name, path in named.items()})
        print(f"[serve] rendered {repository} for pipelines {', '.join(named)}", file=sys.stderr, flush=True)
    options = ServerOptions(repository, args.http_port, args.grpc_port, args.metrics_port, args.host, single,
                            args.log_verbose, control_args(args.model_control_mode, args.load_pipeline, repository))
    server = TritonServer(options, log_path=args.log_file)
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
