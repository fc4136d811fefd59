#!/usr/bin/env python
"""Render model_repository/ for another deployment: what Triton must know lives in config.pbtxt.

Triton reads batching policy from config.pbtxt, which cannot read our TOML, so the
deployment's [engine] capacity is written into `dit` (max_batch_size and
max_candidate_sequences) and its `in_flight` (default: the capacity) into the instance count of
the public models (an instance serves one generation at a time; generations past capacity wait,
encoded, in dit's sequence backlog). The public models are named for the family's task
(`txt2img` + `txt2img_stream`, `txt2vid` + `txt2vid_stream`), and every model but those
of the default deployment names its deployment (parameter `deployment`), so a plain
`tritonserver --model-repository DIR` serves the right checkpoint. The committed
repository is the render of the default deployment; a test keeps them equal.

The stages around dit are sized from the same capacity so that neither queues when dit runs
full (`stage_sizing`): at concurrency 16 on the H200, one text_encoder (max batch 8) and one
vae_decode (max batch 4) queued ~150 ms per request (DESIGN.md, 2026-12-01).

`--gpus N` (N > 0) places one instance of each device stage (text_encoder, dit, vae_decode)
on each of GPUs 0..N-1 (KIND_GPU; the stage then loads onto cuda:<model_instance_device_id>,
see ditserve.adapters.base.FamilyAdapter), and multiplies the public models' instance count
by N so that N * in_flight generations can be in flight. Each dit instance keeps its own
request table: Triton's sequence batcher (Oldest strategy) routes every request of a sequence
to the same model instance (Triton docs, architecture.md "Stateful Models"), so a generation's
state lives on the instance, and GPU, that admitted it. Default 0 keeps the committed KIND_CPU
groups (the deployment's [model] device places the weights).

    python scripts/render_repository.py --deployment configs/pixart-sigma-1024.toml --out /tmp/repo
    python scripts/render_repository.py --deployment configs/pixart-sigma-1024.toml --gpus 2 --out /tmp/repo2
    python scripts/render_repository.py --deployment configs/tiny-wan-t2v.toml --out /tmp/wan

Several deployments side by side in one repository: name each (`--deployment NAME=PATH`, once
per deployment). Every model of a named deployment gets the prefix `NAME_` (`pixart_txt2img`,
`pixart_dit`, ...; ditserve.pipelines decides the names) and names its deployment and pipeline
in its config.pbtxt, so the pipelines share nothing but the server (docs/pipelines.md):

    python scripts/render_repository.py --deployment pixart=configs/tiny-pixart-sigma.toml \
        --deployment flux=configs/tiny-flux.toml --out /tmp/multi
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
from ditserve.deployment import DEFAULT_DEPLOYMENT, REPO_ROOT, TASK_CONDITIONING, Deployment, load_deployment  # noqa: E402
from ditserve.pipelines import PipelineNames, check_pipeline_name  # noqa: E402

PUBLIC_STAGE = 'parameters { key: "stage" value: { string_value: "generate" } }'
# Stages that load weights onto a device: one instance per GPU with --gpus.
DEVICE_STAGES = ("text_encoder", "vae_encode", "dit", "vae_decode")
# Image-conditioned tasks (img2vid) add this model; the committed (text-to-image) repository has none.
VAE_ENCODE_CONFIG = """\
# Image conditioning (img2vid): input image -> the task's conditioning tensors for dit
# (CLIP image embeddings, first-frame VAE condition). Inputs/outputs come from the backend.
backend: "diffusion"
max_batch_size: 0
instance_group [{ count: 1, kind: KIND_CPU }]  # the deployment's [model] device places the weights
parameters { key: "stage" value: { string_value: "vae_encode" } }
"""


# Requests one instance batches per dynamic-batching execute before a second instance helps:
# a second one overlaps the host side of the next batch (tokenising, BLS transfer) with the
# current batch's forward.
STAGE_BATCH_PER_INSTANCE = 8
# The text encoder's batch stays at least this (its forward is cheap and prompts arrive in
# bursts); the committed repository's value.
MIN_TEXT_ENCODER_BATCH = 8


def stage_sizing(capacity: int, instances: int = 0) -> dict[str, tuple[int, int]]:
    """(instances per device, max_batch_size) of text_encoder and vae_decode for a dit capacity.

    A full dit batch that finishes together decodes in one vae_decode execute, and a burst of
    `capacity` arrivals encodes in one text_encoder execute; past STAGE_BATCH_PER_INSTANCE
    requests per batch each stage gets another instance, unless `instances` ([engine]
    stage_instances) fixes the count.
    """
    instances = instances or -(-capacity // STAGE_BATCH_PER_INSTANCE)
    return {"text_encoder": (instances, max(capacity, MIN_TEXT_ENCODER_BATCH)), "vae_decode": (instances, capacity)}


def gpu_instance_group(gpus: int, count: int = 1) -> str:
    groups = ", ".join(f"{{ count: {count}, kind: KIND_GPU, gpus: [{k}] }}" for k in range(gpus))
    return f"instance_group [{groups}]  # {count} instance(s) per GPU (render_repository.py --gpus {gpus})"


def deployment_reference(deployment: Deployment, always: bool = False) -> str | None:
    """What the `deployment` parameter says: a repo-relative path when it can, None for the
    default unless `always` (a named pipeline never falls back to $DITSERVE_DEPLOYMENT)."""
    path = Path(deployment.source).resolve()
    if path == (REPO_ROOT / DEFAULT_DEPLOYMENT).resolve() and not always:
        return None
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def public_models(repo: Path) -> list[Path]:
    """Model folders whose stage is `generate` (the public `<task>` / `<task>_stream` pair)."""
    return sorted(p for p in repo.iterdir() if (p / "config.pbtxt").exists()
                  and PUBLIC_STAGE in (p / "config.pbtxt").read_text())


def render(template: Path, out: Path, deployment: Deployment, gpus: int = 0, pipeline: str | None = None) -> None:
    """The repository of one deployment; with `pipeline`, its models carry that name (see
    render_pipelines)."""
    capacity = deployment.engine.capacity
    if out.resolve() != template.resolve():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(template, out)
    dit = out / "dit" / "config.pbtxt"
    text = re.sub(r"^max_batch_size: \d+", f"max_batch_size: {capacity}", dit.read_text(), flags=re.M)
    text = re.sub(r"max_candidate_sequences: \d+", f"max_candidate_sequences: {capacity}", text)
    dit.write_text(text)
    count = deployment.engine.generations * max(gpus, 1)   # public instances: generations in flight
    for model in public_models(out):
        config = model / "config.pbtxt"
        config.write_text(re.sub(r"count: \d+", f"count: {count}", config.read_text()))
        name = deployment.task + ("_stream" if model.name.endswith("_stream") else "")
        if model.name != name:
            model.rename(model.with_name(name))
    sizing = stage_sizing(capacity, deployment.engine.stage_instances)
    for model, (count, batch) in sizing.items():
        config = out / model / "config.pbtxt"
        text = re.sub(r"^max_batch_size: \d+", f"max_batch_size: {batch}", config.read_text(), flags=re.M)
        config.write_text(re.sub(r"count: \d+", f"count: {count}", text))
    vae_encode = out / "vae_encode"
    if deployment.task in TASK_CONDITIONING:
        (vae_encode / "1").mkdir(parents=True, exist_ok=True)
        (vae_encode / "config.pbtxt").write_text(VAE_ENCODE_CONFIG)
    else:
        shutil.rmtree(vae_encode, ignore_errors=True)
    reference = deployment_reference(deployment, always=pipeline is not None)
    for config in sorted(out.glob("*/config.pbtxt")):
        text = re.sub(r'^parameters \{ key: "(deployment|pipeline)".*\n', "", config.read_text(), flags=re.M)
        if reference:
            text += f'parameters {{ key: "deployment" value: {{ string_value: "{reference}" }} }}\n'
        if pipeline:
            text += f'parameters {{ key: "pipeline" value: {{ string_value: "{pipeline}" }} }}\n'
        config.write_text(text)
    if gpus > 0:
        for model in DEVICE_STAGES:
            config = out / model / "config.pbtxt"
            if not config.exists():  # vae_encode: image-conditioned tasks only
                continue
            count = sizing.get(model, (1, 0))[0]
            text, n = re.subn(r"^instance_group \[.*\].*$", gpu_instance_group(gpus, count), config.read_text(),
                              flags=re.M)
            if n != 1:
                raise ValueError(f"{config}: expected one single-line instance_group, found {n}")
            config.write_text(text)
    if pipeline:
        names = PipelineNames(pipeline)
        for model in sorted(p for p in out.iterdir() if p.is_dir()):
            model.rename(out / names.model(model.name))


def render_pipelines(template: Path, out: Path, pipelines: dict[str, Deployment], gpus: int = 0) -> None:
    """One repository serving several deployments side by side: each is rendered as its own
    pipeline, every model prefixed with the pipeline's name, so no two models collide and
    each pipeline can be loaded and unloaded alone (explicit model control)."""
    if not pipelines:
        raise ValueError("render_pipelines needs at least one named deployment")
    if out.resolve() == template.resolve():
        raise ValueError(f"--out {out} is the template itself; render several deployments into another folder")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name, deployment in pipelines.items():
            part = Path(scratch) / name
            render(template, part, deployment, gpus, pipeline=name)
            for model in sorted(part.iterdir()):
                shutil.move(model, out / model.name)


def parse_deployments(values: list[str]) -> tuple[str | None, dict[str, str]]:
    """`--deployment` values: one plain PATH (the single-deployment names), or one or more
    NAME=PATH (a named pipeline each). Returns (PATH or None, {NAME: PATH})."""
    named = [v.split("=", 1) for v in values if "=" in v]
    plain = [v for v in values if "=" not in v]
    if plain and (named or len(plain) > 1):
        raise ValueError(f"--deployment {' '.join(plain)}: with several deployments name each one, "
                         f"--deployment NAME=PATH (e.g. pixart=configs/tiny-pixart-sigma.toml)")
    pipelines: dict[str, str] = {}
    for name, path in named:
        if name in pipelines:
            raise ValueError(f"--deployment {name}=...: pipeline name {name!r} is given twice; names must differ")
        pipelines[check_pipeline_name(name)] = path
    return (plain[0] if plain else None), pipelines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", required=True, action="append", metavar="[NAME=]PATH",
                   help="deployment TOML; NAME=PATH (repeatable) renders each as a pipeline with "
                        "NAME_-prefixed model names")
    p.add_argument("--template", type=Path, default=ROOT / "model_repository")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpus", type=int, default=0,
                   help="one text_encoder/dit/vae_decode instance on each of GPUs 0..N-1 (KIND_GPU); "
                        "0 (default) keeps the committed KIND_CPU instance groups")
    args = p.parse_args(argv)
    if args.gpus < 0:
        p.error("--gpus must be >= 0")
    try:
        single, named = parse_deployments(args.deployment)
    except ValueError as exc:
        p.error(str(exc))
    if single:
        deployment = load_deployment(single)
        render(args.template, args.out, deployment, args.gpus)
        print(f"rendered {args.out} for {single} (task {deployment.task}, capacity "
              f"{deployment.engine.capacity}, gpus {args.gpus})")
        return 0
    pipelines = {name: load_deployment(path) for name, path in named.items()}
    render_pipelines(args.template, args.out, pipelines, args.gpus)
    for name, deployment in pipelines.items():
        print(f"rendered {args.out}: pipeline {name} = {named[name]} (models {name}_*, task {deployment.task}, "
              f"capacity {deployment.engine.capacity}, gpus {args.gpus})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
