"""Probe (kept with its results, not part of the server): the cache tiers on a shorter schedule,
against the 20-step lossless images. Work is counted as on PixArt-Sigma (28 blocks, 3 of them run
at every step, as docs/cache.md projects): (M - reused x 25/28) / 20 of the 20-step transformer
work; the bound is its inverse (fixed T5 / VAE costs not included).

    .venv/bin/python perf/results/2026-12-05-cpu-cache-fewer-steps-probe/combined_probe.py
"""
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from cache_frontier import probe_setup, run_tier  # noqa: E402
from accel_bench import psnr  # noqa: E402

THRESHOLDS = (0.07, 0.10, 0.14)
stages, params, reference = probe_setup(list(THRESHOLDS), 20)
print(f"{'steps':>5} {'tier':>6} {'reused':>6} {'work':>5} {'bound':>6} {'PSNR mean':>9} {'min':>6}")
for steps in (20, 18, 16, 14):
    for threshold in THRESHOLDS:
        runs = [replace(p, num_inference_steps=steps, quality=f"t{threshold}") for p in params]
        _, images, hits = run_tier(stages, runs, 4)
        each = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
        reused = statistics.mean(hits)
        work = (steps - reused * 25 / 28) / 20
        print(f"{steps:>5} {threshold:>6} {reused:>6.1f} {work:>5.3f} {1 / work:>5.2f}x {statistics.mean(each):>9.2f} "
              f"{min(each):>6.2f}", flush=True)
