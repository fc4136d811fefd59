"""Probe (kept with its results, not part of the server): does a higher-order solver on a shorter
schedule land closer to the 20-step DPM-Solver++(2M) images than the same 2M solver shortened?
(The shorter-2M rows are fewer_steps_probe.py's.) Each request's scheduler is the dit pipeline's,
swapped here for the solver under test (`from_config` of the deployment's), stepped per request
(the batched 2M solver is turned off); compared with the 20-step 2M lossless images.

    .venv/bin/python perf/results/2026-12-05-cpu-cache-fewer-steps-probe/solver_probe.py
"""
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from diffusers import DPMSolverMultistepScheduler, UniPCMultistepScheduler

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from cache_frontier import probe_setup, run_tier  # noqa: E402
from accel_bench import psnr  # noqa: E402

SOLVERS = {
    "DPM-Solver++(3M)": (DPMSolverMultistepScheduler, {"solver_order": 3}),
    "UniPC bh2, order 2": (UniPCMultistepScheduler, {"solver_order": 2}),
    "UniPC bh2, order 3": (UniPCMultistepScheduler, {"solver_order": 3}),
}

stages, params, reference = probe_setup([], 20)
adapter = stages["dit"]
original = adapter.pipe.scheduler
adapter.solver = None   # the batched step covers DPM-Solver++(2M) only: step each request's own
print(f"{'solver':<20} {'steps':>5} {'PSNR mean':>9} {'min':>6}   (vs the 20-step DPM-Solver++(2M) images)")
for name, (cls, options) in SOLVERS.items():
    adapter.pipe.scheduler = cls.from_config(original.config, **options)
    for steps in (10, 11, 12, 13, 14):
        _, images, _ = run_tier(stages, [replace(p, num_inference_steps=steps) for p in params], 4)
        each = [min(psnr(a, b), 99.0) for a, b in zip(images, reference)]
        print(f"{name:<20} {steps:>5} {statistics.mean(each):>9.2f} {min(each):>6.2f}", flush=True)
adapter.pipe.scheduler = original
