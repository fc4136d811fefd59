"""Speed/quality frontier of the cache tiers (input `quality`) on trained weights, in process.

    python perf/cache_frontier.py --deployment configs/tiny-pixart-shapes.toml --prompts 12 --batch 4 \
        --out perf/results/2026-12-01-cpu-cache-frontier.json

For `lossless` and every tier of the deployment's [cache] (plus `--extra name=threshold` ones
to calibrate), the same prompts and seeds run through the step engine (the adapters of the
text_encoder, dit and vae_decode stages, no Triton) in step batches of `--batch` requests of
one tier. Recorded per tier: denoise seconds (sum over batches), speed-up against lossless,
steps reused per request, and the decoded images' PSNR and SSIM against lossless at the same
seed (mean and worst), the shapes score (scripts/shapes_dataset.py) as a content check, and
the fraction of transformer-block work left (a speed-up bound that a busy machine cannot blur).
A video deployment (a trained tiny Wan) is measured the same way on its clips: PSNR over the
whole clip, SSIM and the shapes score over its frames.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]

from accel_bench import psnr  # noqa: E402
from ditserve.adapters import adapter_for  # noqa: E402
from ditserve.deployment import LOSSLESS, load_deployment  # noqa: E402
from ditserve.engine import StepEngine  # noqa: E402
from ditserve.schema import GenerationParams, check_params  # noqa: E402
from ditserve.state import TextConditioning  # noqa: E402
import shapes_dataset  # noqa: E402


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two uint8 [H, W, C] images (11x11 Gaussian window, sigma 1.5, per channel)."""
    x, y = (torch.from_numpy(m).double().permute(2, 0, 1)[:, None] for m in (a, b))
    coords = torch.arange(11, dtype=torch.float64) - 5
    g = torch.exp(-coords ** 2 / (2 * 1.5 ** 2))
    window = (g[:, None] * g[None]) / g.sum() ** 2
    blur = lambda t: torch.nn.functional.conv2d(t, window[None, None])  # noqa: E731
    mx, my = blur(x), blur(y)
    vx, vy, cov = blur(x * x) - mx ** 2, blur(y * y) - my ** 2, blur(x * y) - mx * my
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    value = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    return float(value.mean())


def frames(media: np.ndarray) -> list[np.ndarray]:
    """The [H, W, C] pictures of a decoded image ([H, W, C]) or clip ([F, H, W, C])."""
    return list(media) if media.ndim == 4 else [media]


def clip_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of an image, or the mean over a clip's frames."""
    return statistics.mean(ssim(x, y) for x, y in zip(frames(a), frames(b)))


def load_stages(deployment) -> dict:
    """The text_encoder, dit and vae_decode adapters of `deployment`, in this process."""
    family = adapter_for(deployment.model.family)
    return {stage: family(deployment, stage) for stage in ("text_encoder", "dit", "vae_decode")}


def eval_params(deployment, prompts: int, steps: int | None = None) -> list[GenerationParams]:
    """The first `prompts` evaluation prompts of the shapes dataset at the deployment's defaults
    (`steps` denoise steps where given), seed = the prompt's index: the frontier's requests."""
    d = deployment.defaults
    clip = {"num_frames": d.num_frames} if deployment.is_video else {}
    return [check_params(GenerationParams(shapes_dataset.caption(*c), d.negative_prompt, d.height, d.width,
                                          steps or d.num_inference_steps, d.guidance_scale, seed, **clip), deployment)
            for seed, c in enumerate(shapes_dataset.eval_prompts()[:prompts])]


def probe_setup(thresholds: list[float], steps: int, prompts: int = 12,
                deployment: str = "configs/tiny-pixart-shapes.toml", **accel) -> tuple[dict, list, list]:
    """What a cache probe (perf/results/*-probe/) starts from: the deployment with one tier
    `t<threshold>` per threshold (and `accel` keys replaced), its stages in this process, the
    evaluation requests and their lossless images (step batches of 4)."""
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    dep = load_deployment(str(ROOT / deployment))
    dep = replace(dep, accel=replace(dep.accel, **accel),
                  cache=replace(dep.cache, tiers={f"t{t}": t for t in thresholds}, enabled=()))
    stages = load_stages(dep)
    params = eval_params(dep, prompts, steps)
    _, reference, _ = run_tier(stages, params, 4)
    return stages, params, reference


def run_tier(stages: dict, params: list[GenerationParams], batch: int) -> tuple[float, list[np.ndarray], list[int]]:
    """Denoise seconds, uint8 images and cache hits of `params`, stepped `batch` at a time."""
    engine, seconds, images, hits = StepEngine(stages["dit"]), 0.0, [], []
    for start in range(0, len(params), batch):
        keys = []
        for offset, p in enumerate(params[start:start + batch]):
            texts = [p.negative_prompt, p.prompt] if p.do_cfg else [p.prompt]
            embeds, mask = stages["text_encoder"].encode_text(texts)
            keys.append(f"r{start + offset}")
            engine.admit(keys[-1], p, TextConditioning(embeds, mask))
        began = time.monotonic()
        while any(not engine.table[k].done for k in keys):
            report = engine.step([k for k in keys if not engine.table[k].done])
            if report.failed:
                raise RuntimeError(f"denoise failed: {report.failed}")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds += time.monotonic() - began
        for key in keys:
            state = engine.release(key)
            media, _ = stages["vae_decode"].decode(state.latents)
            images.append(media[0].cpu().numpy())
            hits.append(state.cache.hits if state.cache is not None else 0)
    return seconds, images, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", default="configs/tiny-pixart-shapes.toml")
    ap.add_argument("--prompts", type=int, default=12, help="evaluation prompts (shapes_dataset.eval_prompts)")
    ap.add_argument("--batch", type=int, default=4, help="requests per step batch")
    ap.add_argument("--steps", type=int, default=None, help="denoise steps (default: the deployment's)")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per tier, interleaved; the median counts")
    ap.add_argument("--extra", nargs="*", default=[], help="more tiers to try, name=threshold")
    ap.add_argument("--back-blocks", type=int, default=None,
                    help="[cache] back_blocks for every tier (default: the deployment's)")
    ap.add_argument("--front-blocks", type=int, default=None,
                    help="[cache] front_blocks for every tier (default: the deployment's)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)

    deployment = load_deployment(args.deployment)
    tiers = {**deployment.cache.tiers, **{k: float(v) for k, v in (e.split("=") for e in args.extra)}}
    back = deployment.cache.back_blocks if args.back_blocks is None else args.back_blocks
    front = deployment.cache.front_blocks if args.front_blocks is None else args.front_blocks
    deployment = replace(deployment, cache=replace(deployment.cache, tiers=tiers, enabled=(), back_blocks=back,
                                                   front_blocks=front))
    stages = load_stages(deployment)
    combos = shapes_dataset.eval_prompts()[:args.prompts]
    d = deployment.defaults
    base = eval_params(deployment, args.prompts, args.steps)
    run_tier(stages, base[:1], 1)   # warm-up: first-call costs out of the timings
    order = (LOSSLESS, *sorted(tiers, key=tiers.get))
    runs = {tier: [] for tier in order}
    for repeat in range(args.repeats):   # interleaved, so a busy spell of the machine hits every tier
        for tier in order:
            runs[tier].append(run_tier(stages, [replace(p, quality=tier) for p in base], args.batch))
            print(f"pass {repeat + 1}/{args.repeats} {tier}: {runs[tier][-1][0]:.2f} s", flush=True)
    reference, results = runs[LOSSLESS][0][1], {}
    dit = stages["dit"]
    blocks, steps = len(getattr(dit.pipe.transformer, dit.cache_blocks)), base[0].num_inference_steps
    for tier in order:
        seconds = statistics.median(run[0] for run in runs[tier])
        _, images, hits = runs[tier][0]
        psnrs = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
        ssims = [clip_ssim(a, b) for a, b in zip(images, reference)]
        per_frame = [(frame, combo) for media, combo in zip(images, combos) for frame in frames(media)]
        score = shapes_dataset.score([f for f, _ in per_frame], [c for _, c in per_frame])
        # Transformer blocks run / blocks a lossless run needs: machine-independent work left. The
        # front and the back blocks run at every step; the others on the steps that compute.
        work = statistics.mean((steps * (front + back) + (steps - h) * (blocks - front - back)) / (steps * blocks)
                               for h in hits)
        results[tier] = {
            "threshold": tiers.get(tier), "denoise_seconds_median": round(seconds, 3),
            "denoise_seconds_all": [round(run[0], 3) for run in runs[tier]],
            "speedup_vs_lossless": round(results[LOSSLESS]["denoise_seconds_median"] / seconds, 3) if results else 1.0,
            "cache_hits_mean": round(statistics.mean(hits), 2), "steps": steps,
            "block_work_fraction": round(work, 3),
            "psnr_db_mean": round(statistics.mean(psnrs), 2), "psnr_db_min": round(min(psnrs), 2),
            # identical outputs count as 99 dB in the mean: where a tier reuses little, read these
            "identical": sum(p >= 99.0 for p in psnrs), "psnr_db_each": [round(p, 2) for p in psnrs],
            "ssim_mean": round(statistics.mean(ssims), 4), "ssim_min": round(min(ssims), 4),
            "shapes_colours": score.colours, "shapes_shapes": score.shapes,
        }
        print(f"{tier:>10}: {json.dumps(results[tier])}", flush=True)
    record = {"command": " ".join(sys.argv), "deployment": args.deployment, "prompts": len(base),
              "batch": args.batch, "repeats": args.repeats, "transformer_blocks": blocks, "size": f"{d.height}x{d.width}", "device": str(stages["dit"].device),
              "torch_threads": torch.get_num_threads(), "back_blocks": back, "front_blocks": front, "tiers": results,
              "note": "psnr 99 = identical; speed-up = median lossless denoise seconds / the tier's, same run, interleaved"}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
