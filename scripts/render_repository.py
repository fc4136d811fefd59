#!/usr/bin/env python
"""Render model_repository/ for another deployment: capacity lives in config.pbtxt.

Triton reads batching policy from config.pbtxt, which cannot read our TOML, so the
deployment's [engine] capacity is written into `dit` (max_batch_size and
max_candidate_sequences) and into the instance count of the public models (an instance
serves one generation at a time). The committed repository is
the render of the default deployment; a test keeps them equal.

    python scripts/render_repository.py --deployment configs/pixart-sigma-1024.toml --out /tmp/repo
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
from ditserve.deployment import load_deployment  # noqa: E402

# Public models run one generation per instance at a time (see stages/generate.py).
PUBLIC_MODELS = ("txt2img", "txt2img_stream")


def render(template: Path, out: Path, capacity: int) -> None:
    if out.resolve() != template.resolve():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(template, out)
    dit = out / "dit" / "config.pbtxt"
    text = re.sub(r"^max_batch_size: \d+", f"max_batch_size: {capacity}", dit.read_text(), flags=re.M)
    text = re.sub(r"max_candidate_sequences: \d+", f"max_candidate_sequences: {capacity}", text)
    dit.write_text(text)
    for model in PUBLIC_MODELS:
        config = out / model / "config.pbtxt"
        config.write_text(re.sub(r"count: \d+", f"count: {capacity}", config.read_text()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", required=True)
    p.add_argument("--template", type=Path, default=ROOT / "model_repository")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    capacity = load_deployment(args.deployment).engine.capacity
    render(args.template, args.out, capacity)
    print(f"rendered {args.out} for {args.deployment} (capacity {capacity})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
