"""Q1 evidence at 1024px / 0.5 load: who is co-stepped, and why (forced by the throughput floor/need, or
chosen by the latency cost), under current, plan-only (no first-step rule) and the probe's `without`."""
import sys; sys.path.insert(0, "perf/results/2026-12-03-sim-first-step-mechanism")
from collections import Counter
import numpy as np
from harness import *
from variants import plan_only, RULE_NO_FIRST
dedupe(True)
spec, seed = (sys.argv[1] if len(sys.argv) > 1 else "uniform:1024:0.5:20:4.5"), int(sys.argv[2]) if len(sys.argv) > 2 else 22
title, entries = trace(spec, seed)
print(title)

def traced(inner, log):
    def choose(self, candidates, model, rates=None):
        chosen = inner(self, candidates, model, rates)
        g = candidates[0].group
        cost = lambda k: model.estimate(g, k)
        rates_ = rates or {}
        need = self.needed({gg: s for gg, (_, s) in rates_.items()}, model).get(g, float("inf"))
        n = len(candidates)
        thr = {k: k / cost(k) for k in range(1, n + 1)}
        allowed = [k for k, t in thr.items() if t >= min(need, self.throughput_floor * max(thr.values()))]
        planned = RULE_NO_FIRST(self, candidates, model, rates)
        log.append(dict(n=n, k=len(chosen), k_plan=len(planned), forced=min(allowed) > 1,
                        need_ratio=need / thr[1], new_in_plan=sum(c.new for c in candidates if c.key in planned),
                        running=sum(1 for c in candidates if not c.new and c.key in chosen),
                        overdue=any(self.overdue(c, model) for c in candidates)))
        return chosen
    return choose

rb = run(entries, seed, None, True)
L0 = min(r.done_at - r.arrival for r in rb[1])
print(f"request_batch: p50 {rb[0]['p50_e2el_ms']:.0f} ms; solo latency L0 {L0*1000:.0f} ms; "
      f"{np.mean([r.done_at - r.arrival <= L0 + 1e-3 for r in rb[1]]):.1%} of requests at L0")
for name, pol in (("current", RULE), ("plan-only", plan_only), ("without", without)):
    log = []
    st, done, rounds, _ = run(entries, seed, traced(pol, log), log=True)
    lat = np.array([r.done_at - r.arrival for r in done])
    co = [r for r in log if r["k"] >= 2 and r["running"] >= 1]
    print(f"\n{name}: p50 {st['p50_e2el_ms']:.0f} ms ({st['p50_e2el_ms']/rb[0]['p50_e2el_ms']:.2f}x), at L0: {np.mean(lat <= L0 + 1e-3):.1%}, "
          f"<= L0+1 step: {np.mean(lat <= L0 + 0.08):.1%}, <= L0+3 steps: {np.mean(lat <= L0 + 0.23):.1%}")
    print(f"  rounds: {len(log)}; stepping a running request with others: {len(co)} "
          f"(forced by need/floor: {sum(r['forced'] for r in co)}, overdue present: {sum(r['overdue'] for r in co)}); by members n: "
          f"{sorted(Counter(r['n'] for r in co).items())}")
    print(f"  of those, with a new request in the policy's own plan: {sum(r['new_in_plan'] > 0 for r in co)}; "
          f"rounds where the plan holds a new request beside a running one but it was dropped: "
          f"{sum(1 for r in log if r['new_in_plan'] and r['k'] < r['k_plan'])}")
    print(f"  need / throughput(k=1) over rounds: p50 {np.percentile([r['need_ratio'] for r in log], 50):.2f}, "
          f"share > 1: {np.mean([r['need_ratio'] > 1 for r in log]):.1%}; rounds with n>=3: {sum(r['n'] >= 3 for r in log)}, forced: {sum(r['forced'] for r in log if r['n'] >= 3)}")
    # requests that never waited a round: how many were co-stepped
    total = {r.key: r.total_steps for r in done}
    skipped, costep = Counter(), Counter()
    for now, active, chosen in rounds:
        for k in active:
            if k not in chosen: skipped[k] += 1
            elif len(chosen) > 1: costep[k] += 1
    nw = [k for k in total if not skipped[k]]
    print(f"  requests never held back: {len(nw)}, co-stepped at least once: {sum(1 for k in nw if costep[k])}; "
          f"co-steps per such request: {sorted(Counter(costep[k] for k in nw).items())}")
