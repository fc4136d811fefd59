"""Probe (kept with its results, not part of the server): First-Block Cache decided per CFG row
instead of per request. Shipped, a request's two rows ([negative, prompt]) reuse or compute
together, on the mean change of both. Here each row decides on its own change and reuses alone,
so a step may run only the row whose features moved (the negative prompt is empty: its row may
move differently from the prompt's). Work is counted in rows: "reuse-equivalent" = row-steps
reused / 2, projected with the H200's solo curve (1 - 0.753 x fraction, docs/cache.md; a step
that runs one row costs about what it saves in a batch under load, less solo).
POLICY=request (the shipped rule, a check) or row.

    .venv/bin/python perf/results/2026-12-05-cpu-cache-per-row-probe/per_row_probe.py
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

POLICY = "request"
shipped = C.apply_first_block_cache


def per_row(first_in, first_out, caches, run_rest):
    if POLICY == "request":
        return shipped(first_in, first_out, caches, run_rest)
    rows = first_in.shape[0] // len(caches)
    residual = first_out - first_in
    reuse = []   # per batch row
    for i, cache in enumerate(caches):
        for r in range(rows):
            row = i * rows + r
            if cache is None or cache.first_residual is None:
                reuse.append(False)
                continue
            change = float(C.relative_change(residual[row:row + 1], cache.first_residual[r:r + 1]))
            reuse.append(change < cache.threshold)
    out = first_out.clone()
    compute = [row for row, hit in enumerate(reuse) if not hit]
    for row, hit in enumerate(reuse):
        if hit:
            cache, r = caches[row // rows], row % rows
            out[row] = first_out[row] + cache.rest_residual[r]
            cache.row_hits = getattr(cache, "row_hits", 0) + 1
    if compute:
        index = torch.tensor(compute, device=first_out.device)
        computed = run_rest(index, first_out.index_select(0, index))
        out.index_copy_(0, index, computed)
        for position, row in enumerate(compute):
            cache, r = caches[row // rows], row % rows
            if cache is None:
                continue
            if cache.first_residual is None:
                cache.first_residual = residual[row // rows * rows:(row // rows + 1) * rows].clone()
                cache.rest_residual = (computed[position:position + 1] - first_out[row:row + 1]).repeat(rows, 1, 1)
            cache.first_residual[r] = residual[row]
            cache.rest_residual[r] = computed[position] - first_out[row]
    return out


C.apply_first_block_cache = per_row
steps = int(os.environ.get("STEPS", "20"))
thresholds = [float(t) for t in os.environ.get("THRESHOLDS", "0.1,0.14,0.2").split(",")]
stages, base_params, reference = probe_setup(thresholds, steps)
from ditserve.engine import StepEngine  # noqa: E402
row_hits, original_release = [], StepEngine.release


def release(self, key):
    state = original_release(self, key)
    row_hits.append(getattr(state.cache, "row_hits", 2 * state.cache.hits) if state.cache is not None else 0)
    return state


StepEngine.release = release
for POLICY in os.environ.get("POLICIES", "request,row").split(","):
    for threshold in thresholds:
        row_hits.clear()
        _, images, hits = run_tier(stages, [replace(p, quality=f"t{threshold}") for p in base_params], 4)
        values = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
        eq = statistics.mean(row_hits) / 2
        print(f"steps {steps} {POLICY:7s} threshold {threshold}: reuse-equivalent {eq:5.2f} / {steps},"
              f" projected solo {1 / (1 - 0.753 * eq / steps):.2f}x, PSNR {statistics.mean(values):.2f}"
              f" (min {min(values):.2f})", flush=True)
