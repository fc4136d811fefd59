"""Probe (kept with its results, not part of the server): at PixArt-Sigma's default of 20 steps,
is a shorter schedule a better way to save work than the cache tiers? The `fast` tier reuses ~38 %
of 20 steps at 33.5 dB against lossless (docs/cache.md: 1.62x projected on the H200); 1.8x needs
~60 % and costs 26-28 dB. Here the same 12 prompts and seeds run lossless at M < 20 steps (the
same DPM-Solver++ schedule, shorter) and are compared with the 20-step lossless images: the work
left is M/20 of the transformer's, with no cache at all.

    .venv/bin/python perf/results/2026-12-05-cpu-cache-fewer-steps-probe/fewer_steps_probe.py
"""
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from cache_frontier import probe_setup, run_tier  # noqa: E402
from accel_bench import psnr  # noqa: E402
import shapes_dataset  # noqa: E402

stages, params, reference = probe_setup([], 20)
combos = shapes_dataset.eval_prompts()[:len(params)]
print(f"{'steps':>5} {'work':>5} {'PSNR mean':>9} {'min':>6}  shapes score (colours, shapes)")
for steps in (8, 10, 11, 12, 13, 14, 16, 18):
    _, images, _ = run_tier(stages, [replace(p, num_inference_steps=steps) for p in params], 4)
    each = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
    score = shapes_dataset.score(images, combos)
    print(f"{steps:>5} {steps / 20:>5.2f} {statistics.mean(each):>9.2f} {min(each):>6.2f}  "
          f"({score.colours}, {score.shapes})", flush=True)
print("reference: 20 steps lossless, shapes score", shapes_dataset.score(reference, combos))
