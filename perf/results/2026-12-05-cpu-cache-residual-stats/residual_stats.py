"""Probe (kept with its results, not part of the server): how the middle blocks' residual of the
trained tiny PixArt changes from step to step when every step computes, and how well a scalar
(MagCache's magnitude ratio), a first-order forecast (TaylorSeer) or an oracle two-term fit
would predict a reused step from computed ones.

    .venv/bin/python perf/results/2026-12-05-cpu-cache-residual-stats/residual_stats.py --steps 20 --out OUT.json

12 calibration prompts (training combinations that are not in the evaluation set), seeds 100+,
step batches of 4, the shipped F2B1 split; a tier with threshold -1 keeps a cache per request
but never reuses, so every step's front and middle residuals are recorded along the lossless
trajectory. Errors are relative L2: |prediction - actual| / |actual| over a request's rows."""
import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from ditserve import cache as C  # noqa: E402
from ditserve.adapters import adapter_for  # noqa: E402
from ditserve.deployment import load_deployment  # noqa: E402
from ditserve.schema import GenerationParams, check_params  # noqa: E402
import shapes_dataset  # noqa: E402
from cache_frontier import run_tier  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--out", required=True)
args = ap.parse_args()

recorded: dict[int, list] = {}   # id(RowCache) -> [(front residual, middle residual) per step]
shipped_remember = C.remember


def remember(caches, compute, residual, first_out, rest_out, rows):
    shipped_remember(caches, compute, residual, first_out, rest_out, rows)
    for i in compute:
        recorded.setdefault(id(caches[i]), []).append((caches[i].first_residual.float().flatten(),
                                                       caches[i].rest_residual.float().flatten()))


C.remember = remember
torch.set_grad_enabled(False)
torch.set_num_threads(1)
dep = load_deployment(str(ROOT / "configs/tiny-pixart-shapes.toml"))
dep = replace(dep, cache=replace(dep.cache, tiers={"never": -1.0}, enabled=()))
family = adapter_for(dep.model.family)
stages = {s: family(dep, s) for s in ("text_encoder", "dit", "vae_decode")}
evaluation = set(shapes_dataset.eval_prompts())
calibration = [c for c in shapes_dataset.TRAIN_COMBOS if c not in evaluation][::7][:12]
d = dep.defaults
params = [check_params(GenerationParams(shapes_dataset.caption(*c), d.negative_prompt, d.height, d.width, args.steps,
                                        d.guidance_scale, 100 + i, quality="never"), dep)
          for i, c in enumerate(calibration)]
run_tier(stages, params, 4)
seqs = list(recorded.values())


def rel(prediction, actual):
    return float((prediction - actual).norm() / actual.norm())


per_step = []
for t in range(1, args.steps):
    rows = []
    for seq in seqs:
        (f0, r0), (f1, r1) = seq[t - 1], seq[t]
        alpha = float((r0 @ r1) / (r0 @ r0))   # the best scalar on r0 (least squares)
        row = {"reuse": rel(r0, r1), "best_scalar": alpha, "best_scalar_error": rel(alpha * r0, r1),
               "middle_magnitude_ratio": float(r1.abs().mean() / r0.abs().mean()),
               "front_magnitude_ratio": float(f1.abs().mean() / f0.abs().mean()),
               "front_change": float(C.relative_change(f1, f0))}
        if t >= 2:
            r2 = seq[t - 2][1]
            basis = torch.stack([r0, r2], 1)
            fit = basis @ torch.linalg.lstsq(basis, r1[:, None]).solution
            row.update(taylor=rel(2 * r0 - r2, r1), oracle_two_term=rel(fit[:, 0], r1))
        rows.append(row)
    per_step.append({"step": t + 1, **{k: round(statistics.mean(r[k] for r in rows), 4) for k in rows[-1]},
                     "best_scalar_sd": round(statistics.pstdev(r["best_scalar"] for r in rows), 4)})
# A reused step k steps after the last computed one, forecast from that one and the computed one s steps before.
spaced = {}
for s in (1, 2, 3):
    for k in (1, 2):
        plain, taylor = [], []
        for seq in seqs:
            for t in range(max(4, s), args.steps - k):
                r_t, r_s, r_k = seq[t][1], seq[t - s][1], seq[t + k][1]
                plain.append(rel(r_t, r_k))
                taylor.append(rel(r_t + k * (r_t - r_s) / s, r_k))
        spaced[f"spacing {s}, {k} ahead"] = {"plain": round(statistics.mean(plain), 4), "taylor": round(statistics.mean(taylor), 4)}
for row in per_step:
    print(json.dumps(row))
print(json.dumps(spaced, indent=1))
Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "steps": args.steps, "requests": len(seqs),
                                      "per_step": per_step, "forecast_by_spacing": spaced}, indent=1) + "\n")
