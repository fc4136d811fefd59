"""The table: p50, p99, TTFS p50 of each first-step variant over request_batch, per trace and seed.
    cd /work/main && .venv/bin/python perf/results/2026-12-03-sim-first-step-mechanism/evaluate.py [seeds...] > /tmp/results.txt"""
import json, sys; sys.path.insert(0, "perf/results/2026-12-03-sim-first-step-mechanism")
from harness import *
from variants import plan_only, cheap, wait_bound, gate
dedupe(True)   # arrivals registered once per request (a no-op for `current`)
TRACES = ["uniform:1024:0.5:20:4.5", "uniform:1024:0.8:20:4.5", "uniform:1024:0.95:20:4.5", "mixed:512,768,1024:0.8",
          "uniform:512:0.8:20:4.5", "uniform:512:0.5:20:4.5", "uniform:512:0.95:20:4.5"]
POLICIES = {"current": RULE, "without(probe)": without, "plan-only": plan_only, "V1 cheap(0.5)": cheap(0.5),
            "V2 wait(0.25)": wait_bound(0.25), "V2 wait(0.5)": wait_bound(0.5), "V2 wait(1.0)": wait_bound(1.0),
            "V3 gate(0.5)": gate(0.5), "V3 gate(1.0)": gate(1.0)}
seeds = [int(s) for s in sys.argv[1:] if s.isdigit()] or [22, 23]
TRACES = [a for a in sys.argv[1:] if not a.isdigit()] or TRACES
out = []
for seed in seeds:
    for spec in TRACES:
        title, entries = trace(spec, seed)
        rb = run(entries, seed, None, True)[0]
        print(f"\n{spec} seed {seed}: request_batch p50 {rb['p50_e2el_ms']:.0f} p99 {rb['p99_e2el_ms']:.0f} TTFS p50 {rb['p50_ttfs_ms']:.0f} ms", flush=True)
        for name, pol in POLICIES.items():
            r = run(entries, seed, pol)[0]
            row = dict(trace=spec, seed=seed, policy=name, p50=r["p50_e2el_ms"] / rb["p50_e2el_ms"],
                       p99=r["p99_e2el_ms"] / rb["p99_e2el_ms"], ttfs=r["p50_ttfs_ms"] / rb["p50_ttfs_ms"],
                       ttfs_ms=r["p50_ttfs_ms"], ttfs_mean_ms=r["mean_ttfs_ms"], mean=r["mean_e2el_ms"] / rb["mean_e2el_ms"],
                       batch=r["mean_step_batch_size"])
            out.append(row)
            print(f"  {name:15s} p50 {row['p50']:.2f}x p99 {row['p99']:.2f}x mean {row['mean']:.2f}x TTFS p50 {row['ttfs']:.2f}x "
                  f"({r['p50_ttfs_ms']:.0f} ms, mean {r['mean_ttfs_ms']:.0f}) batch {r['mean_step_batch_size']:.2f}", flush=True)
json.dump(out, open(f"/tmp/first-step-results-{'-'.join(map(str, seeds))}{'-sub' if len(TRACES) < 7 else ''}.json", "w"), indent=1)
