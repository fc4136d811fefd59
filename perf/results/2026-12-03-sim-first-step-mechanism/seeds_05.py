"""1024px / 0.5 load over seeds 22-29: the p50 is the edge of the solo-latency atom (requests that ran alone,
latency L0), so it jumps with the atom's share; the mean and nearby quantiles do not."""
import sys; sys.path.insert(0, "perf/results/2026-12-03-sim-first-step-mechanism")
import numpy as np
from harness import *
from variants import plan_only, wait_bound, gate
dedupe(True)
P = {"current": RULE, "without(probe)": without, "plan-only": plan_only, "V2 wait(0.5)": wait_bound(0.5), "V3 gate(1.0)": gate(1.0)}
agg = {k: [] for k in P}
for seed in range(22, 30):
    _, entries = trace("uniform:1024:0.5:20:4.5", seed)
    st, done, _, _ = run(entries, seed, None, True)
    rb = np.array([r.done_at - r.arrival for r in done]); L0 = rb.min()
    q = lambda a, p: np.percentile(a, p)
    print(f"seed {seed}: request_batch p50 {q(rb,50)*1000:.0f} ms, at L0 {np.mean(rb <= L0 + 1e-3):.1%}")
    for name, pol in P.items():
        st, done, _, _ = run(entries, seed, pol)
        a = np.array([r.done_at - r.arrival for r in done])
        row = [q(a, p) / q(rb, p) for p in (40, 50, 60)] + [a.mean() / rb.mean(), np.mean(a <= L0 + 1e-3), st["mean_ttfs_ms"]]
        agg[name].append(row)
        print(f"  {name:15s} p40 {row[0]:.2f}x p50 {row[1]:.2f}x p60 {row[2]:.2f}x mean {row[3]:.3f}x at L0 {row[4]:.1%} TTFS mean {row[5]:.0f} ms")
print("\nmean over seeds 22-29 (ratios over request_batch):")
for name, rows in agg.items():
    m = np.mean(rows, axis=0)
    print(f"  {name:15s} p40 {m[0]:.3f}x p50 {m[1]:.3f}x (min {min(r[1] for r in rows):.2f} max {max(r[1] for r in rows):.2f}) p60 {m[2]:.3f}x mean {m[3]:.3f}x at L0 {m[4]:.1%} TTFS mean {m[5]:.0f} ms")
