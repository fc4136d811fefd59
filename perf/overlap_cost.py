"""What each arrival costs the requests already running, from one matched-control report.

    python perf/overlap_cost.py REPORT.json [--mode step:cost] [--control request_batch]

For every request of the trace: the requests that arrived while it was in `--mode` (from its
arrival to its end there), the ones still running when it arrived, and its latency in `--mode`
minus its latency in `--control` (same trace, same request). Requests that found the server
empty are then grouped by how many arrived during their life: the difference of the group with
none is what `--mode` costs a request by itself; each arrival more adds what a newcomer costs
the running request (in step mode, its first step taken at once inside the running forward).
Why: at 1024px step mode's median stays 3-9 % above request batching's while nearly every
forward runs one request (docs/scheduler.md, "Session 31").
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def overlaps(arrivals: list[float], latencies_ms: list[float]) -> list[tuple[int, int]]:
    """(arrived during its life, running when it arrived) per request; times in s, latencies in ms."""
    ends = [a + ms / 1000 for a, ms in zip(arrivals, latencies_ms)]
    return [(sum(1 for b in arrivals if a < b < end), sum(1 for b, e in zip(arrivals, ends) if b < a < e))
            for a, end in zip(arrivals, ends)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--mode", default="step:cost")
    parser.add_argument("--control", default="request_batch")
    args = parser.parse_args()
    data = json.loads(args.report.read_text())
    arrivals = [entry["t"] for entry in data["trace"]]
    mode, control = (data["reports"][name]["e2el_ms_by_request"] for name in (args.mode, args.control))
    print(f"{args.report.name}: {args.mode} minus {args.control}, ms, per request")
    print("request  arrival_s  arrived_during  running_at_arrival  control_ms  mode_ms  difference_ms")
    rows = []
    for i, ((during, running), a, c, m) in enumerate(zip(overlaps(arrivals, mode), arrivals, control, mode)):
        rows.append((during, running, m - c))
        print(f"{i:7d}  {a:9.2f}  {during:14d}  {running:18d}  {c:10.0f}  {m:7.0f}  {m - c:13.0f}")
    print("requests that found the server empty, by arrivals during their life:")
    for during in sorted({d for d, r, _ in rows if r == 0}):
        diffs = [x for d, r, x in rows if r == 0 and d == during]
        print(f"  {during} arrived: n {len(diffs)}, difference median {statistics.median(diffs):.0f} ms, "
              f"mean {statistics.mean(diffs):.0f} ms")


if __name__ == "__main__":
    main()
