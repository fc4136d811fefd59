#!/usr/bin/env python
"""Liveness probe: fail when a model instance's Python stub process is gone.

Triton 2.51 keeps reporting the server and every model READY after a Python stub dies.
Requests routed to the dead instance then fail ("Stub process '<instance>' is not
healthy"), and a decoupled (`*_stream`) instance is never restarted (docs/reliability.md).
This probe compares, for each loaded model, the instances its config asks for with the live
stub processes under tritonserver. It exits 1 naming each model that is short, so an
orchestrator can restart the container (or an operator can reload the model through the
repository API). Run it where tritonserver runs (same PID namespace):

    python3 scripts/check_stubs.py                       # server at 127.0.0.1:8000
    python3 scripts/check_stubs.py --url 127.0.0.1:8000 --server-pid 1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from ditserve.stages.liveness import stub_pids  # noqa: E402


def _http(url: str, path: str, body: bytes | None = None):
    request = urllib.request.Request(f"http://{url}{path}", data=body, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read() or b"null")


def expected_instances(config: dict) -> int:
    """Instances Triton creates for a model config: `count` per group, on each listed GPU."""
    return sum(int(group.get("count", 1)) * max(1, len(group.get("gpus") or []))
               for group in config.get("instance_group") or [{}])


def server_pid() -> int:
    """The tritonserver process in this PID namespace."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == "tritonserver":
                    pids.append(int(entry))
            except OSError:
                continue
    if len(pids) != 1:
        raise SystemExit(f"check_stubs: found {len(pids)} tritonserver processes ({pids}); pass --server-pid")
    return pids[0]


def short_models(url: str, server: int) -> dict[str, tuple[int, int]]:
    """{model: (live stubs, expected instances)} for every READY model that is short of stubs."""
    short = {}
    for model in _http(url, "/v2/repository/index", b"{}"):
        if model.get("state") != "READY":
            continue
        name = model["name"]
        config = _http(url, f"/v2/models/{name}/config")
        if config.get("backend") not in ("python", "diffusion"):
            continue
        live, expected = len(stub_pids(name, server)), expected_instances(config)
        if live < expected:
            short[name] = (live, expected)
    return short


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8000", help="tritonserver's HTTP address (default 127.0.0.1:8000)")
    ap.add_argument("--server-pid", type=int, default=None, help="default: the one tritonserver process found")
    args = ap.parse_args(argv)
    try:
        short = short_models(args.url, args.server_pid or server_pid())
    except OSError as exc:
        print(f"check_stubs: cannot query tritonserver at {args.url}: {exc}", file=sys.stderr)
        return 1
    for name, (live, expected) in sorted(short.items()):
        print(f"check_stubs: model '{name}' has {live} of its {expected} stub processes; restart the server or "
              f"reload the model (POST /v2/repository/models/{name}/unload, then /load)", file=sys.stderr)
    if not short:
        print("check_stubs: every model has all its stub processes")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
