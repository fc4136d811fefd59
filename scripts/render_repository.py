#!/usr/bin/env python
"""Render model_repository/ for another deployment: capacity lives in config.pbtxt.

Triton reads batching policy from config.pbtxt, which cannot read our TOML, so the
deployment's [engine] capacity is written into `dit` (max_batch_size and
max_candidate_sequences) and into the instance count of the public models (an instance
serves one generation at a time). The committed repository is
the render of the default deployment; a test keeps them equal.

`--gpus N` (N > 0) places one instance of each device stage (text_encoder, dit, vae_decode)
on each of GPUs 0..N-1 (KIND_GPU; the stage then loads onto cuda:<model_instance_device_id>,
see ditserve.adapters.base.FamilyAdapter), and multiplies the public models' instance count
by N so that N * capacity generations can be in flight. Each dit instance keeps its own
request table: Triton's sequence batcher (Oldest strategy) routes every request of a sequence
to the same model instance (Triton docs, architecture.md "Stateful Models"), so a generation's
state lives on the instance, and GPU, that admitted it. Default 0 keeps the committed KIND_CPU
groups (the deployment's [model] device places the weights).

    python scripts/render_repository.py --deployment configs/pixart-sigma-1024.toml --out /tmp/repo
    python scripts/render_repository.py --deployment configs/pixart-sigma-1024.toml --gpus 2 --out /tmp/repo2
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
# Stages that load weights onto a device: one instance per GPU with --gpus.
DEVICE_STAGES = ("text_encoder", "dit", "vae_decode")


def gpu_instance_group(gpus: int) -> str:
    groups = ", ".join(f"{{ count: 1, kind: KIND_GPU, gpus: [{k}] }}" for k in range(gpus))
    return f"instance_group [{groups}]  # one instance per GPU (render_repository.py --gpus {gpus})"


def render(template: Path, out: Path, capacity: int, gpus: int = 0) -> None:
    if out.resolve() != template.resolve():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(template, out)
    dit = out / "dit" / "config.pbtxt"
    text = re.sub(r"^max_batch_size: \d+", f"max_batch_size: {capacity}", dit.read_text(), flags=re.M)
    text = re.sub(r"max_candidate_sequences: \d+", f"max_candidate_sequences: {capacity}", text)
    dit.write_text(text)
    for model in PUBLIC_MODELS:
        config = out / model / "config.pbtxt"
        config.write_text(re.sub(r"count: \d+", f"count: {capacity * max(gpus, 1)}", config.read_text()))
    if gpus > 0:
        for model in DEVICE_STAGES:
            config = out / model / "config.pbtxt"
            text, n = re.subn(r"^instance_group \[.*\].*$", gpu_instance_group(gpus), config.read_text(), flags=re.M)
            if n != 1:
                raise ValueError(f"{config}: expected one single-line instance_group, found {n}")
            config.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", required=True)
    p.add_argument("--template", type=Path, default=ROOT / "model_repository")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpus", type=int, default=0,
                   help="one text_encoder/dit/vae_decode instance on each of GPUs 0..N-1 (KIND_GPU); "
                        "0 (default) keeps the committed KIND_CPU instance groups")
    args = p.parse_args(argv)
    if args.gpus < 0:
        p.error("--gpus must be >= 0")
    capacity = load_deployment(args.deployment).engine.capacity
    render(args.template, args.out, capacity, args.gpus)
    print(f"rendered {args.out} for {args.deployment} (capacity {capacity}, gpus {args.gpus})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
