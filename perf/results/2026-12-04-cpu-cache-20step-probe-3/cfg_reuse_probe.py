"""Probe (kept with its results, not part of the server): FasterCache-style "CFG reuse" on top of
the per-request First-Block Cache, quality only, via perf/cache_frontier.py (run unchanged).

On a CFG-reuse step a lossy request's unconditional (negative-prompt) noise prediction is not
taken from the transformer but estimated from its conditional one:

    uncond_est = cond_now - delta,   delta = cond - uncond at the last step whose two rows both ran

(CFG_DELTA=hold), or delta extrapolated to first order in the step index from the last two such
steps (CFG_DELTA=lin), times CFG_DSCALE (default 1). Served, that step would drop the negative
row's transformer work; here both rows still run (one batch, as shipped) and the negative row's
output is overwritten in `guide`. So that nothing computed on the dropped row leaks into later
steps, the probe also
  - decides a CFG-reuse step's block reuse on the text row's front-block residual alone, and
  - on a CFG-reuse step that runs the middle blocks, refreshes only the text row's cached
    residuals (the negative row keeps those of the last step it ran),
which is what a version that drops the row would see. CFG_FAITHFUL=0 turns both off (the block
cache then sees the negative row that this probe still runs: an optimistic bound, not servable).
CFG_FAITHFUL=front: the negative row runs its front blocks on every step (served: 2 of the
transformer's blocks for that row), so the decision reads both rows as shipped and the negative
row's front residual is refreshed; its middle blocks' residual still only where it ran them.
`lossless` requests are never touched.

Policies (CFG_POLICY), for every lossy tier of the run (an `--extra t0=0` tier never reuses a
block, so it shows CFG reuse alone):
  none       the shipped path, through this file's copy of apply_first_block_cache (a check)
  alt        steps W, W+2, W+4, ... (0-based) reuse CFG; W = CFG_WARMUP
  oncompute  every step >= W whose middle blocks run (the block cache did not reuse it)
  last       the last K steps (K = CFG_LAST), whether the block cache reuses them or not
  every      every step >= W
  altcompute every other step >= W whose middle blocks run: a step whose middle blocks run
             drops the negative row if the last such step kept it
CFG_DELTA_SRC=all (default): delta is refreshed at every step whose two rows both went through
the transformer, block-reused ones included; =computed: only at steps whose middle blocks ran.

Per-request state lives on the request's RowCache (state.cache.cfg), freed with its state. After
the run the per-tier counts (steps by kind: both rows / text row only x blocks run / reused) are
added to the output JSON under "cfg_probe".
"""
import json
import os
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]   # the repository (this file sits in perf/results/<run>/)
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT / "scripts")]
from ditserve import cache as C  # noqa: E402
from ditserve.adapters import base  # noqa: E402

POLICY = os.environ.get("CFG_POLICY", "none")
WARMUP = int(os.environ.get("CFG_WARMUP", "4"))
LAST = int(os.environ.get("CFG_LAST", "6"))
DELTA = os.environ.get("CFG_DELTA", "hold")
DSCALE = float(os.environ.get("CFG_DSCALE", "1.0"))
DELTA_SRC = os.environ.get("CFG_DELTA_SRC", "all")
FAITHFUL = os.environ.get("CFG_FAITHFUL", "1")
assert FAITHFUL in ("0", "1", "front"), FAITHFUL
assert POLICY in ("none", "alt", "oncompute", "last", "every", "altcompute"), POLICY
assert DELTA in ("hold", "lin"), DELTA
assert DELTA_SRC in ("all", "computed"), DELTA_SRC


@dataclass
class CfgState:
    quality: str
    eligible: bool = False          # this step may drop the negative row (policy)
    now: bool = False               # this step did drop it (decided in the block cache)
    hits_before: int = 0
    last_compute_full: bool = True  # altcompute: the last step whose middle blocks ran kept both rows
    history: list = field(default_factory=list)   # [(step, delta)] of the last two full steps
    kinds: dict = field(default_factory=lambda: {"full_compute": 0, "full_reuse": 0, "cfg_compute": 0, "cfg_reuse": 0})
    cfg_at: list = field(default_factory=list)     # step indices that dropped the negative row
    hit_at: list = field(default_factory=list)     # step indices whose middle blocks were reused
    diag: list = field(default_factory=list)       # [(step, |true - est| / |true|, best scale)], see guide


ALL: list[CfgState] = []
_current: list = []   # stack of the step batches inside denoise


def eligible(step: int, steps: int) -> bool:
    if POLICY == "none":
        return False
    if POLICY == "alt":
        return step >= WARMUP and (step - WARMUP) % 2 == 0
    if POLICY in ("oncompute", "every", "altcompute"):
        return step >= WARMUP
    return step >= steps - LAST   # last


def delta_estimate(st: CfgState, step: int) -> torch.Tensor:
    k1, d1 = st.history[-1]
    if DELTA == "lin" and len(st.history) == 2:
        k0, d0 = st.history[0]
        d1 = d1 + (d1 - d0) * ((step - k1) / (k1 - k0))
    return d1 * DSCALE


# ---- the block cache: the shipped apply_first_block_cache, with the two changes above -------------
def apply_fbc(first_in, first_out, caches, run_rest):
    rows = first_in.shape[0] // len(caches)
    residual = first_out - first_in
    reuse = []
    for i, c in enumerate(caches):
        if c is None or c.first_residual is None:
            reuse.append(False)
            continue
        st, sl = getattr(c, "cfg", None), C.rows_of(i, rows)
        if FAITHFUL == "1" and st is not None and st.eligible and rows == 2:   # the text row alone decides
            change = C.relative_change(residual[sl][1:], c.first_residual[1:])
        else:
            change = C.relative_change(residual[sl], c.first_residual)
        reuse.append(c.reusable(float(change)))
    for i, (c, hit) in enumerate(zip(caches, reuse)):
        st = getattr(c, "cfg", None) if c is not None else None
        if st is not None:
            st.now = st.eligible and (POLICY not in ("oncompute", "altcompute") or not hit)
    compute = [i for i, hit in enumerate(reuse) if not hit]
    reused = [i for i, hit in enumerate(reuse) if hit]
    out = first_out.clone()
    if reused:
        out.index_copy_(0, C.request_rows(reused, rows, out.device), C.reused_hidden(first_out, caches, reused, rows))
    if not compute:
        return out
    if len(compute) == len(caches):
        out = computed = run_rest(None, first_out)
    else:
        index = C.request_rows(compute, rows, first_out.device)
        computed = run_rest(index, first_out.index_select(0, index))
        out.index_copy_(0, index, computed)
    for position, i in enumerate(compute):
        c = caches[i]
        if c is None:
            continue
        st = getattr(c, "cfg", None)
        first = residual[C.rows_of(i, rows)]
        rest = computed[C.rows_of(position, rows)] - first_out[C.rows_of(i, rows)]
        if FAITHFUL != "0" and st is not None and st.now and c.first_residual is not None:   # the negative row did not run
            if FAITHFUL == "front":
                c.first_residual = first.clone()
            else:
                c.first_residual[1:] = first[1:]
            c.rest_residual[1:] = rest[1:]
        else:
            c.first_residual, c.rest_residual = first.clone(), rest
    return out


C.apply_first_block_cache = apply_fbc

# ---- guidance: where the two rows' predictions meet (FamilyAdapter.denoise -> guide) --------------
original_denoise, original_guide = base.FamilyAdapter.denoise, base.FamilyAdapter.guide


def denoise(self, states):
    for s in states:
        c = s.cache
        if c is None or not s.params.do_cfg:
            continue
        if not hasattr(c, "cfg"):
            c.cfg = CfgState(s.params.quality)
            ALL.append(c.cfg)
        st = c.cfg
        st.eligible = eligible(s.step_index, s.total_steps) and bool(st.history)
        if POLICY == "altcompute":
            st.eligible = st.eligible and st.last_compute_full
        st.now, st.hits_before = False, c.hits
    _current.append(states)
    try:
        out = original_denoise(self, states)
    finally:
        _current.pop()
    for s in states:
        st = getattr(s.cache, "cfg", None) if s.cache is not None else None
        if st is None:
            continue
        hit = s.cache.hits > st.hits_before
        if not hit:
            st.last_compute_full = not st.now
        st.kinds[("cfg_" if st.now else "full_") + ("reuse" if hit else "compute")] += 1
        if st.now:
            st.cfg_at.append(s.step_index)
        if hit:
            st.hit_at.append(s.step_index)
    return out


def guide(self, uncond, text, scales):
    states = _current[-1] if _current else None
    if states is not None and len(states) == uncond.shape[0]:
        uncond = uncond.clone()
        for i, s in enumerate(states):
            st = getattr(s.cache, "cfg", None) if s.cache is not None else None
            if st is None:
                continue
            hit = s.cache.hits > st.hits_before
            if st.now:
                est = delta_estimate(st, s.step_index).to(text.dtype)
                if not hit:   # diagnostic: this probe still ran the negative row through all blocks
                    true = (text[i] - uncond[i]).float()
                    e = est.float()
                    st.diag.append((s.step_index, float((true - e).norm() / true.norm()),
                                    float((true * e).sum() / (e * e).sum())))
                uncond[i] = text[i] - est
            elif DELTA_SRC == "all" or not hit:
                st.history = (st.history + [(s.step_index, (text[i] - uncond[i]).float().clone())])[-2:]
    return original_guide(self, uncond, text, scales)


base.FamilyAdapter.denoise = denoise
base.FamilyAdapter.guide = guide

sys.argv = ["cache_frontier.py", *sys.argv[1:]]
runpy.run_path(str(ROOT / "perf" / "cache_frontier.py"), run_name="__main__")

# ---- counts per tier into the output JSON -------------------------------------------------------
out_path = Path(sys.argv[sys.argv.index("--out") + 1])
record = json.loads(out_path.read_text())
per_tier = {}
for tier in record["tiers"]:
    group = [st for st in ALL if st.quality == tier]
    if not group:
        continue
    n = len(group)
    kinds = {k: round(sum(st.kinds[k] for st in group) / n, 3) for k in group[0].kinds}
    steps = sum(kinds.values())
    cfg_hist, hit_hist = [0] * int(round(steps)), [0] * int(round(steps))
    for st in group:
        for k in st.cfg_at:
            cfg_hist[k] += 1
        for k in st.hit_at:
            hit_hist[k] += 1
    per_tier[tier] = {
        "requests": n, "steps_by_kind_mean": kinds,
        "block_reuse_fraction": round((kinds["full_reuse"] + kinds["cfg_reuse"]) / steps, 4),
        "cfg_reuse_step_fraction": round((kinds["cfg_compute"] + kinds["cfg_reuse"]) / steps, 4),
        "cfg_rows_saved_fraction": round((kinds["cfg_compute"] + kinds["cfg_reuse"]) / (2 * steps), 4),
        "requests_dropping_negative_row_at_step": cfg_hist, "requests_reusing_blocks_at_step": hit_hist,
    }
    diag = [d for st in group for d in st.diag]
    if diag:   # at text-row-only steps that ran all blocks: the estimated delta against the one computed
        per_tier[tier]["delta_estimate_vs_computed"] = {
            "relative_error_mean": round(sum(d[1] for d in diag) / len(diag), 4),
            "best_scale_mean": round(sum(d[2] for d in diag) / len(diag), 4),
            "by_step": {k: [round(sum(d[1] for d in diag if d[0] == k) / n_k, 4),
                            round(sum(d[2] for d in diag if d[0] == k) / n_k, 4), n_k]
                        for k in sorted({d[0] for d in diag}) for n_k in [sum(d[0] == k for d in diag)]},
        }
record["cfg_probe"] = {"policy": POLICY, "warmup": WARMUP, "last": LAST, "delta": DELTA, "delta_scale": DSCALE,
                       "delta_src": DELTA_SRC, "faithful": FAITHFUL, "tiers": per_tier}
out_path.write_text(json.dumps(record, indent=1) + "\n")
print(f"cfg_probe: {json.dumps(record['cfg_probe']['tiers'])}")
