"""Probe (kept with its results, not part of the server): First-Block Cache whose reuse forecasts the cached residuals to
first order and whose decision measures the front blocks' residual against ITS forecast
(FC_MODE=fa), against the old forecast probe (FC_MODE=stale: forecast the rest, decide against
the stale reference) and plain (FC_MODE=plain), via perf/cache_frontier.py."""
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]   # the repository (this file sits in perf/results/<run>/)
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from ditserve import cache as C  # noqa: E402

MODE = os.environ.get("FC_MODE", "fa")
DAMP = float(os.environ.get("FC_DAMP", "1.0"))


def forecast(ref, prev, k, k_ref, k_prev):
    if prev is None or MODE == "plain":
        return ref
    return ref + (ref - prev) * (DAMP * (k - k_ref) / (k_ref - k_prev))


def apply_fbc(first_in, first_out, caches, run_rest):
    rows = first_in.shape[0] // len(caches)
    residual = first_out - first_in
    reuse, preds = [], []
    for i, c in enumerate(caches):
        if c is None:
            reuse.append(False); preds.append(None); continue
        c.k = getattr(c, "k", 0) + 1
        if c.first_residual is None:
            reuse.append(False); preds.append(None); continue
        f_prev, r_prev = getattr(c, "f_prev", None), getattr(c, "r_prev", None)
        k_ref, k_prev = c.k_ref, getattr(c, "k_prev", None)
        f_ref_for_decision = forecast(c.first_residual, f_prev, c.k, k_ref, k_prev) if MODE == "fa" else c.first_residual
        change = float(C.relative_change(residual[C.rows_of(i, rows)], f_ref_for_decision))
        hit = c.reusable(change)
        reuse.append(hit)
        preds.append(forecast(c.rest_residual, r_prev, c.k, k_ref, k_prev) if hit else None)
    out = first_out.clone()
    for i, hit in enumerate(reuse):
        if hit:
            caches[i].hits += 1
            out[C.rows_of(i, rows)] += preds[i]
    compute = [i for i, hit in enumerate(reuse) if not hit]
    if not compute:
        return out
    index = C.request_rows(compute, rows, first_out.device)
    computed = run_rest(index, first_out.index_select(0, index))
    out.index_copy_(0, index, computed)
    for position, i in enumerate(compute):
        c = caches[i]
        if c is None:
            continue
        if c.first_residual is not None:
            c.f_prev, c.r_prev, c.k_prev = c.first_residual, c.rest_residual, c.k_ref
        c.first_residual = residual[C.rows_of(i, rows)].clone()
        c.rest_residual = computed[C.rows_of(position, rows)] - first_out[C.rows_of(i, rows)]
        c.k_ref = c.k
    return out


C.apply_first_block_cache = apply_fbc
sys.argv = ["cache_frontier.py", *sys.argv[1:]]
runpy.run_path(str(ROOT / "perf" / "cache_frontier.py"), run_name="__main__")
