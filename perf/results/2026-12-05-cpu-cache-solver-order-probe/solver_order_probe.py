"""Probe (kept with its results, not part of the server): does a reused step hurt through the
multistep solver's history? PixArt-Sigma's DPM-Solver++(2M) forms each update from the model's
output at this step and the last one; a reused step's output is an approximation, and 2M both
uses it in its own update's difference term and hands it on to the next step's. Here a lossy
request's solver step is forced to first order (`lower_order_nums = 0`, the solver's own switch)
  MODE=none    never (the shipped path; a check that this harness reproduces it)
  MODE=reused  on a step that reused the blocks
  MODE=after   on the computed step right after a reused one
  MODE=both    both
Lossless references are never touched (2M throughout). Trained tiny PixArt, 12 evaluation
prompts, 20 steps, step batches of 4, per-request solver steps, the shipped F2B1 cache.

    .venv/bin/python perf/results/2026-12-05-cpu-cache-solver-order-probe/solver_order_probe.py
"""
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from ditserve.adapters import base  # noqa: E402
from cache_frontier import probe_setup, run_tier  # noqa: E402
from accel_bench import psnr  # noqa: E402

MODE = "none"
original_denoise, original_step = base.FamilyAdapter.denoise, base.FamilyAdapter.scheduler_step


def denoise(self, states):
    before = [s.cache.hits if s.cache is not None else 0 for s in states]
    out = original_denoise(self, states)
    for s, hits in zip(states, before):
        s.hit_now = s.cache is not None and s.cache.hits > hits
    return out


def scheduler_step(self, state, model_output):
    if state.cache is not None:
        hit_prev, hit_now = getattr(state, "hit_prev", False), state.hit_now
        if ((MODE in ("reused", "both") and hit_now) or
                (MODE in ("after", "both") and hit_prev and not hit_now)):
            state.scheduler.lower_order_nums = 0
        state.hit_prev = hit_now
    original_step(self, state, model_output)


base.FamilyAdapter.denoise, base.FamilyAdapter.scheduler_step = denoise, scheduler_step

steps = int(os.environ.get("STEPS", "20"))
thresholds = [float(t) for t in os.environ.get("THRESHOLDS", "0.14,0.16,0.2").split(",")]
stages, base_params, reference = probe_setup(thresholds, steps, scheduler_step="per_request")
for threshold in thresholds:
    for MODE in os.environ.get("MODES", "none,reused,after,both").split(","):
        _, images, hits = run_tier(stages, [replace(p, quality=f"t{threshold}") for p in base_params], 4)
        values = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
        print(f"steps {steps} threshold {threshold} {MODE:6s}: reused {statistics.mean(hits):5.2f} / {steps}"
              f" PSNR {statistics.mean(values):.2f} (min {min(values):.2f})", flush=True)
