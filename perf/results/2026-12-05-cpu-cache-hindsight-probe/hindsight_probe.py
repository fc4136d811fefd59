"""Probe (kept with its results, not part of the server): correcting reused steps in hindsight.
A reused step feeds the solver an output whose error grows from nothing at the last computed
step t_c. At the next computed step t the error a reuse would have made *there* is measurable:
run the reused path at t too (front blocks + the cached residual + back block: a reused step's
work) and take e = output(t) - reused output(t). Assuming the error grew linearly, the j-th of
m reused steps was off by e * j / (m + 1); the probe replays the solver from t_c with those
outputs corrected (times DAMP), then takes step t from the corrected latents. Quality only;
speed projected from the reuse minus the extra reused-path work (3 of 28 blocks per correction
at PixArt-Sigma's size: 3/25 of a reuse's saving), with the H200 solo curve 1 - 0.753 x fraction.

    .venv/bin/python perf/results/2026-12-05-cpu-cache-hindsight-probe/hindsight_probe.py
"""
import copy
import math
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

DAMP = 0.0
original_denoise, original_step = base.FamilyAdapter.denoise, base.FamilyAdapter.scheduler_step


def denoise(self, states):
    # the reused path's output for every request that reused since its last computed step (its
    # cache not touched: a reuse only counts a hit, restored), then the step as shipped
    pending = [s for s in states if s.cache is not None and getattr(s, "reused_outputs", None)]
    forced = {}
    for s in pending:
        threshold, hits = s.cache.threshold, s.cache.hits
        s.cache.threshold = math.inf
        forced[s.key] = original_denoise(self, [s])[0]
        s.cache.threshold, s.cache.hits = threshold, hits
    before = [s.cache.hits if s.cache is not None else 0 for s in states]
    outputs = original_denoise(self, states)
    for s, hits, out in zip(states, before, outputs):
        s.hit_now = s.cache is not None and s.cache.hits > hits
        s.forced = forced.get(s.key)
    return outputs


def scheduler_step(self, state, model_output):
    if state.cache is None:
        return original_step(self, state, model_output)
    if state.hit_now:
        if getattr(state, "snapshot", None) is not None:
            state.reused_outputs.append((state.timestep, model_output))
        return original_step(self, state, model_output)
    if getattr(state, "reused_outputs", None) and state.forced is not None and DAMP:
        error = model_output - state.forced
        scheduler, latents, (t_c, out_c) = state.snapshot
        scheduler = copy.deepcopy(scheduler)
        latents = scheduler.step(out_c, t_c, latents, return_dict=False)[0]
        m = len(state.reused_outputs)
        for j, (t_k, out_k) in enumerate(state.reused_outputs, start=1):
            latents = scheduler.step(out_k + DAMP * error * j / (m + 1), t_k, latents, return_dict=False)[0]
        state.scheduler, state.latents = scheduler, latents
        state.corrections = getattr(state, "corrections", 0) + 1
    elif getattr(state, "reused_outputs", None):
        state.corrections = getattr(state, "corrections", 0) + 1   # the reused path ran (DAMP 0: a check)
    state.snapshot = (copy.deepcopy(state.scheduler), state.latents.clone(), (state.timestep, model_output))
    state.reused_outputs = []
    original_step(self, state, model_output)


base.FamilyAdapter.denoise, base.FamilyAdapter.scheduler_step = denoise, scheduler_step
steps = int(os.environ.get("STEPS", "20"))
thresholds = [float(t) for t in os.environ.get("THRESHOLDS", "0.14,0.2,0.3").split(",")]
stages, base_params, reference = probe_setup(thresholds, steps, scheduler_step="per_request")
from ditserve.engine import StepEngine  # noqa: E402
corrections, original_release = [], StepEngine.release


def release(self, key):
    state = original_release(self, key)
    corrections.append(getattr(state, "corrections", 0))
    return state


StepEngine.release = release
for DAMP in [float(d) for d in os.environ.get("DAMPS", "0,0.5,1").split(",")]:
    for threshold in thresholds:
        corrections.clear()
        _, images, hits = run_tier(stages, [replace(p, quality=f"t{threshold}") for p in base_params], 4)
        values = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
        eq = statistics.mean(hits) - (3 / 25) * statistics.mean(corrections) * (DAMP != 0)
        print(f"steps {steps} damp {DAMP} threshold {threshold}: reused {statistics.mean(hits):5.2f}, corrections"
              f" {statistics.mean(corrections):4.2f}, reuse-equivalent {eq:5.2f} / {steps}, projected solo"
              f" {1 / (1 - 0.753 * eq / steps):.2f}x, PSNR {statistics.mean(values):.2f} (min {min(values):.2f})",
              flush=True)
