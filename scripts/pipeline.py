#!/usr/bin/env python
"""List, load and unload the pipelines of a running server (explicit model control).

A repository rendered for several deployments (`--deployment NAME=PATH`) holds one pipeline per
deployment, models `NAME_<model>`. With `tritonserver --model-control-mode=explicit` (serve.py
`--model-control-mode explicit`), each pipeline loads and unloads on its own while the others
keep serving; this loads its stages before its public models and unloads in the reverse order
(ditserve.pipelines.RepositoryControl; docs/pipelines.md).

    python scripts/pipeline.py list
    python scripts/pipeline.py unload pixart
    python scripts/pipeline.py load pixart --url 127.0.0.1:8001
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from tritonclient.utils import InferenceServerException  # noqa: E402

from ditserve.pipelines import RepositoryControl  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("list", "load", "unload"))
    p.add_argument("pipeline", nargs="?", help="the pipeline to load or unload")
    p.add_argument("--url", default="127.0.0.1:8001", help="the server's gRPC address (default %(default)s)")
    args = p.parse_args(argv)
    if (args.action == "list") != (args.pipeline is None):
        p.error("load and unload take a pipeline name; list takes none")
    start = time.monotonic()
    try:
        with RepositoryControl(args.url) as control:
            if args.action == "list":
                for name, models in sorted(control.pipelines().items()):
                    states = ", ".join(f"{model} {state or 'not loaded'}" for model, state in sorted(models.items()))
                    print(f"{name}: {states}")
                return 0
            print(f"[pipeline] {args.action}ing {args.pipeline} ...", file=sys.stderr, flush=True)
            models = getattr(control, args.action)(args.pipeline)
    except (ValueError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except InferenceServerException as exc:
        print(f"error: {args.url}: {exc.message()}", file=sys.stderr)
        return 1
    print(f"{args.action}ed {args.pipeline} in {time.monotonic() - start:.1f} s: {', '.join(models)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
