"""Probe (kept with its results, not part of the server): "half steps" between First-Block Cache
reuses. At 20 steps the `fast` tier reaches ~50 % reuse by reusing every other step; more needs
reuses in a row, and each such run costs 3-4 dB (docs/cache.md). Here a step the cache would
reuse right after another reuse may instead run one of two segments of the middle blocks (they
alternate) and take the other segment's residual from its last run, so that the reused residual
is refreshed half at a time instead of not at all. Quality only (CPU); the speed is projected
from the middle-block work with the H200's measured curve, solo latency 1 - 0.753 x (work saved
/ a fully reused step's), as docs/cache.md does for plain reuse.

POLICY (per lossy request, with the shipped decision: front-block residual against the one at
the last fully computed step, below the threshold = may reuse):
  plain     the shipped path (a check that this harness reproduces it)
  half      a reusable step right after a reused or half step is a half step
  halfall   every reusable step is a half step (no full reuse)
SPLIT = how many of the middle blocks segment A holds (the tiny model's F2B1 middle is 5 blocks).

    .venv/bin/python perf/results/2026-12-05-cpu-cache-half-step-probe/half_step_probe.py
"""
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from ditserve import cache as C  # noqa: E402
from cache_frontier import probe_setup, run_tier  # noqa: E402
from accel_bench import psnr  # noqa: E402

POLICY, SPLIT = "plain", 2


def _rest(self, hidden, *args, **kwargs):
    total, rows = hidden.shape[0], hidden.shape[0] // len(self.caches)
    blocks = C.middle(self.blocks, self.front, self.back)
    segments = (blocks[:SPLIT], blocks[SPLIT:])
    residual = hidden - self.first_in
    out = hidden.clone()
    for i, cache in enumerate(self.caches):
        sl = C.rows_of(i, rows)
        index = torch.arange(sl.start, sl.stop)
        a = tuple(C._rows(v, index, total) for v in args)
        k = {name: C._rows(v, index, total) for name, v in kwargs.items()}

        def run(segment, states):
            for block in segment:
                states = block(states, *a, **k)
            return states

        h = hidden[sl]
        if cache is None:
            out[sl] = run(blocks, h)
            continue
        if not hasattr(cache, "seg"):
            cache.seg, cache.last, cache.turn, cache.saved = [None, None], "compute", 0, 0.0
        change = None if cache.first_residual is None else float(C.relative_change(residual[sl], cache.first_residual))
        reusable = cache.reusable(change)
        half = reusable and (POLICY == "halfall" or (POLICY == "half" and cache.last in ("reuse", "half")))
        if not reusable:
            mid = run(segments[0], h)
            end = run(segments[1], mid)
            cache.seg = [mid - h, end - mid]
            cache.first_residual = residual[sl].clone()
            cache.last = "compute"
            out[sl] = end
        elif half:
            x = cache.turn
            cache.turn = 1 - x
            if x == 0:   # run A, reuse B's residual
                mid = run(segments[0], h)
                cache.seg[0] = mid - h
                out[sl] = mid + cache.seg[1]
            else:        # reuse A's residual, run B
                mid = h + cache.seg[0]
                end = run(segments[1], mid)
                cache.seg[1] = end - mid
                out[sl] = end
            cache.saved += 1 - len(segments[x]) / len(blocks)
            cache.hits += 1
            cache.last = "half"
        else:
            out[sl] = h + cache.seg[0] + cache.seg[1]
            cache.saved += 1.0
            cache.hits += 1
            cache.last = "reuse"
    return out


C._CachedBlocks._rest = _rest

steps = int(os.environ.get("STEPS", "20"))
thresholds = [float(t) for t in os.environ.get("THRESHOLDS", "0.14,0.2,0.3").split(",")]
stages, base_params, reference = probe_setup(thresholds, steps)
original_release = None
for policy in os.environ.get("POLICIES", "plain,half,halfall").split(","):
    for split in ([2] if policy == "plain" else [int(s) for s in os.environ.get("SPLITS", "2,3").split(",")]):
        for threshold in thresholds:
            POLICY, SPLIT = policy, split
            saved = []
            from ditserve.engine import StepEngine  # the probe reads each state's saved work at release
            if original_release is None:
                original_release = StepEngine.release

                def release(self, key, _orig=original_release):
                    state = _orig(self, key)
                    saved.append(getattr(state.cache, "saved", 0.0) if state.cache is not None else 0.0)
                    return state
                StepEngine.release = release
            _, images, hits = run_tier(stages, [replace(p, quality=f"t{threshold}") for p in base_params], 4)
            saved = saved[-len(images):]
            values = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
            r = statistics.mean(saved) / steps
            print(f"steps {steps} {policy:7s} split {split} threshold {threshold}: reused or half {statistics.mean(hits):5.2f},"
                  f" reuse-equivalent {statistics.mean(saved):5.2f} / {steps}, projected solo {1 / (1 - 0.753 * r):.2f}x,"
                  f" PSNR {statistics.mean(values):.2f} (min {min(values):.2f})", flush=True)
