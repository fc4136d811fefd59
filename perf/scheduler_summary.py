#!/usr/bin/env python
"""Issue 22's summary: every load of one or more matched-control ladders in one JSON and one table.

Each input is what perf/gpu_recipe.sh's scheduler stage brings back: a folder holding matched-control
reports (`*-matched-control*.json`), or the `control_all.tgz` it packs them in. Per trace and load it
keeps both modes' throughput, p50, p99, mean, time to first step and mean step batch, and the ratios
of the compared mode to the first one, so a summary is regenerated from the raw files, not typed.
Where the reports hold each request's latency (loadgen since 2026-12-03, session 21), the p50 and
mean ratios get 95 % paired-bootstrap intervals (shown in brackets).

    python perf/scheduler_summary.py --out perf/results/2026-12-03-h200-scheduler.json \\
        "1024px, floor 0.95=perf/results/2026-12-03-h200-s21/call1-sched-1024" ...
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tarfile
from pathlib import Path

METRICS = {"throughput_req_s": "request_throughput", "p50_ms": "p50_e2el_ms", "p99_ms": "p99_e2el_ms",
           "mean_ms": "mean_e2el_ms", "ttfs_p50_ms": "p50_ttfs_ms", "ttfs_p99_ms": "p99_ttfs_ms",
           "mean_step_batch": "mean_step_batch_size", "completed": "completed_requests",
           "failed": "failed_requests", "lost": "lost", "duplicated": "duplicated",
           "mean_step_ms": "mean_step_duration_ms",
           "ttfs_split_ms": "ttfs_split_ms",   # since session 22
           "dit_holds": "dit_holds"}           # since session 37
RATIOS = ("p50_ms", "p99_ms", "mean_ms", "throughput_req_s", "ttfs_p50_ms")
RESAMPLES = 2000


def paired_interval(base: list, other: list, stat, resamples: int = RESAMPLES, seed: int = 0) -> list[float] | None:
    """95 % interval of stat(other) / stat(base) over the requests of one trace, resampled in pairs
    (request i of both runs together: the same arrival, shape and seed), so that a 1.05x median
    from 40 requests says whether it is more than the draw. None when the runs do not pair up."""
    pairs = [(b, o) for b, o in zip(base, other) if b is not None and o is not None]
    if len(base) != len(other) or len(pairs) < 10:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(stat([o for _, o in sample]) / stat([b for b, _ in sample]))
    ratios.sort()
    return [round(ratios[int(0.025 * resamples)], 3), round(ratios[int(0.975 * resamples) - 1], 3)]


def read_reports(source: Path) -> list[dict]:
    """The matched-control reports in a folder (its tarballs included) or in one tarball."""
    tarballs = [source] if source.is_file() else sorted(source.glob("*.tgz"))
    reports = [json.loads(path.read_text()) for path in
               (sorted(source.glob("*matched-control*.json")) if source.is_dir() else [])]
    for tarball in tarballs:
        with tarfile.open(tarball) as tar:
            reports += [json.load(tar.extractfile(member)) for member in tar.getmembers()
                        if member.isfile() and "matched-control" in member.name and member.name.endswith(".json")]
    # The recipe copies the newest report beside the tarball that also holds it: one per load.
    found = {json.dumps(report.get("load"), sort_keys=True): report for report in reports}
    if not found:
        raise SystemExit(f"no matched-control report (*matched-control*.json) in {source}: pass the folder "
                         "the recipe's scheduler stage wrote, or its control_all.tgz")
    return sorted(found.values(), key=lambda r: (r.get("load") or {}).get("fraction") or 0.0)


def compare(report: dict, runs: dict, base: str, other: str) -> tuple[dict, dict]:
    """`other`'s ratios to `base` ({"other/base": {metric: ratio}}) and their 95 % paired-bootstrap
    intervals (reports written since 2026-12-03, session 21, hold each request's latency)."""
    by_request = [report["reports"][mode].get("e2el_ms_by_request") for mode in (base, other)]
    intervals = {}
    if all(by_request):
        intervals = {"p50_ms": paired_interval(*by_request, statistics.median),
                     "mean_ms": paired_interval(*by_request, statistics.fmean)}
    a, b = runs[base], runs[other]
    return {f"{other}/{base}": {key: round(b[key] / a[key], 3) if a[key] and b[key] is not None else None
                                for key in RATIOS}}, intervals


def summarise(label: str, report: dict) -> dict:
    """One trace at one load: each mode's numbers, the last mode's ratios to the first, and with
    three modes or more the last one's to the one before it (an A/B of one setting, e.g.
    `request_batch,step:cost,step:cost+late_queue_ms=2`)."""
    modes = report["modes"]
    runs = {mode: {key: report["reports"][mode].get(src) for key, src in METRICS.items()} for mode in modes}
    for run in runs.values():   # issue 22's bound: time to first step p50 <= one step + 50 ms
        if run["ttfs_p50_ms"] is not None and run["mean_step_ms"] is not None:
            run["ttfs_p50_over_one_step_ms"] = round(run["ttfs_p50_ms"] - run["mean_step_ms"], 1)
    load = report.get("load") or {}
    ratios, intervals = compare(report, runs, modes[0], modes[-1])
    ab, ab_intervals = compare(report, runs, modes[-2], modes[-1]) if len(modes) > 2 else ({}, {})
    return {
        "ladder": label,
        "trace": report["reports"][modes[0]].get("source"),
        "load_fraction": load.get("fraction"),
        "saturation": load.get("saturation"),
        "offered_req_s": report["reports"][modes[0]].get("offered_request_rate"),
        "command": report.get("command"),
        "runs": runs,
        "ratios": ratios,
        "ratio_intervals_95": intervals,
        "ab_ratios": ab,
        "ab_ratio_intervals_95": ab_intervals,
    }


def table(rows: list[dict], kind: str = "ratio") -> str:
    """The ratios (`kind` "ratio": last mode / first) or the A/B (`kind` "ab_ratio": last / the one before)."""
    lines = ["| ladder | load (offered req/s) | p50 | p99 | mean | throughput | TTFS p50 | TTFS p50 ms | "
             "TTFS p50 - one step, ms (bound 50) | mean step batch | late-queue holds / joins / overran | overtakes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(row: dict, ratios: dict, key: str) -> str:
        if ratios[key] is None:
            return "-"
        interval = row[f"{kind}_intervals_95"].get(key)
        return f"{ratios[key]:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")

    for row in rows:
        (pair, r), = row[f"{kind}s"].items()
        base, other = (row["runs"][m] for m in pair.split("/")[::-1])
        fraction = row["load_fraction"]
        lines.append(
            f"| {row['ladder']} | {fraction if fraction is not None else '-'} ({row['offered_req_s']}) | "
            + " | ".join(cell(row, r, k) for k in RATIOS)
            + f" | {other['ttfs_p50_ms']:.0f} ({base['ttfs_p50_ms']:.0f}) | "
              f"{other.get('ttfs_p50_over_one_step_ms', '-')} ({base.get('ttfs_p50_over_one_step_ms', '-')}) | "
              f"{other['mean_step_batch']:.2f} ({base['mean_step_batch']:.2f}) | {late_queue(other)} | "
              f"{(other.get('dit_holds') or {}).get('overtakes', '-')} |")
    return "\n".join(lines)


def late_queue(run: dict) -> str:
    """The compared mode's late-queue counters ("-" for a report older than the counter)."""
    holds = run.get("dit_holds") or {}
    if not holds.get("late"):
        return "-"
    return " / ".join(str(holds.get(key, "-")) for key in ("late", "late_joins", "late_overran"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ladders", nargs="+", metavar="LABEL=PATH",
                        help="a label for the ladder, '=', and the folder or control_all.tgz holding its reports")
    parser.add_argument("--out", type=Path, help="write the summary JSON here (the table goes to stdout)")
    parser.add_argument("--note", action="append", default=[], metavar="KEY=TEXT",
                        help="a top-level field of the JSON, e.g. machine=..., code=...")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.ladders:
        label, sep, path = spec.rpartition("=")
        if not sep or not label:
            parser.error(f"{spec!r}: expected LABEL=PATH, e.g. '1024px=perf/results/.../call1-sched-1024'")
        rows += [summarise(label, report) for report in read_reports(Path(path))]
    print(table(rows))
    if any(row["ab_ratios"] for row in rows):
        print("\nA/B: the last mode against the one before it\n")
        print(table([row for row in rows if row["ab_ratios"]], "ab_ratio"))
    if args.out:
        notes = dict(note.split("=", 1) for note in args.note)
        args.out.write_text(json.dumps({**notes, "traces": rows}, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
