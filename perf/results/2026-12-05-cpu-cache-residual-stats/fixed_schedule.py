"""Fixed reuse schedule: plain reuse vs first-order forecast of the middle residual (isolates the predictor from the decision)."""
import os, sys, json, statistics
from dataclasses import replace
from pathlib import Path
import numpy as np, torch
ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from ditserve import cache as C
from ditserve.adapters import adapter_for
from ditserve.deployment import load_deployment
from ditserve.schema import GenerationParams, check_params
import shapes_dataset
from cache_frontier import run_tier
from accel_bench import psnr

MODE = os.environ.get("MODE", "plain"); DAMP = float(os.environ.get("DAMP", "1"))
SCHED = set()

def apply(first_in, first_out, caches, run_rest):
    rows = first_in.shape[0] // len(caches)
    residual = first_out - first_in
    reuse = []
    for c in caches:
        c.k = getattr(c, "k", 0) + 1
        reuse.append(c is not None and c.rest_residual is not None and c.k in SCHED)
    out = first_out.clone()
    for i, hit in enumerate(reuse):
        if hit:
            c = caches[i]; c.hits += 1
            pred = c.rest_residual
            if MODE == "taylor" and getattr(c, "r_prev", None) is not None:
                pred = pred + DAMP * (c.k - c.k_ref) * (c.rest_residual - c.r_prev) / (c.k_ref - c.k_prev)
            out[C.rows_of(i, rows)] += pred
    compute = [i for i, h in enumerate(reuse) if not h]
    if compute:
        index = C.request_rows(compute, rows, first_out.device)
        computed = run_rest(index, first_out.index_select(0, index))
        out.index_copy_(0, index, computed)
        for pos, i in enumerate(compute):
            c = caches[i]
            if c.rest_residual is not None:
                c.r_prev, c.k_prev = c.rest_residual, c.k_ref
            c.first_residual = residual[C.rows_of(i, rows)].clone()
            c.rest_residual = computed[C.rows_of(pos, rows)] - first_out[C.rows_of(i, rows)]
            c.k_ref = c.k
    return out
C.apply_first_block_cache = apply

torch.set_grad_enabled(False); torch.set_num_threads(1)
dep = load_deployment(str(ROOT / "configs/tiny-pixart-shapes.toml"))
dep = replace(dep, cache=replace(dep.cache, tiers={"x": 0.0}, enabled=()))
fam = adapter_for(dep.model.family)
stages = {s: fam(dep, s) for s in ("text_encoder", "dit", "vae_decode")}
d = dep.defaults
base = [check_params(GenerationParams(shapes_dataset.caption(*c), d.negative_prompt, d.height, d.width, 20, d.guidance_scale, seed), dep)
        for seed, c in enumerate(shapes_dataset.eval_prompts()[:12])]
_, ref, _ = run_tier(stages, base, 4)
schedules = {
 "every other from 5 (8/20)": {5,7,9,11,13,15,17,19},
 "2 of 3 from 5 (10/20)": {5,6,8,9,11,12,14,15,17,18},
 "2 of 3 from 4 (11/20)": {4,5,7,8,10,11,13,14,16,17,19},
 "2 of 3 from 3, 12/20": {3,4,6,7,9,10,12,13,15,16,18,19},
}
for name, s in schedules.items():
    SCHED.clear(); SCHED.update(s)
    for mode, damp in (("plain", 1), ("taylor", 1), ("taylor", 0.5)):
        MODE, DAMP = mode, damp
        _, imgs, hits = run_tier(stages, [replace(p, quality="x") for p in base], 4)
        ps = [min(psnr(a, b), 99) for a, b in zip(imgs, ref)]
        print(f"{name:28s} {mode:6s} damp {damp}: hits {statistics.mean(hits):.1f} PSNR {statistics.mean(ps):.2f} (min {min(ps):.2f})", flush=True)
