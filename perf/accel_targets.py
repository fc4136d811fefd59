"""Where issue 23's targets stand: the newest measured row of each target in the accel summary.

    python perf/accel_targets.py [perf/results/2026-12-02-h200-accel.json]

Every row of the summary with a `target` is one measurement (a run, a variant). Rows are grouped
into targets by what they measure: the model and size before the first comma, and the kind after
it (one request, closed loop, first request after READY, PSNR), so that closed loops at different
concurrencies count as one throughput target. For each target it prints the newest run's ratio
(ties: the best of that run), whether it met the target, and the best ratio any run reached.
Latency ratios must be <= the target, throughput ratios and PSNR (in `ratio`, dB) >= it. Exit status 0 either way: this
reports, the issue decides.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "results" / "2026-12-02-h200-accel.json"
KINDS = (("first request", "first request after READY / warm", "<="), ("one request", "one request", "<="),
         ("closed loop", "throughput", ">="), ("PSNR", "PSNR against eager diffusers, dB", ">="))


@dataclass
class Measured:
    """One row of the summary that carries a target."""

    target_name: str
    direction: str          # "<=" (latency) or ">=" (throughput)
    target: float
    ratio: float | None
    run: int | None
    variant: str

    @property
    def met(self) -> bool | None:
        if self.ratio is None:
            return None
        return self.ratio <= self.target if self.direction == "<=" else self.ratio >= self.target

    def better(self, other: "Measured") -> bool:
        """Whether this ratio beats `other`'s in the target's direction."""
        if other.ratio is None:
            return self.ratio is not None
        if self.ratio is None:
            return False
        return self.ratio < other.ratio if self.direction == "<=" else self.ratio > other.ratio


def classify(row: dict) -> Measured | None:
    """The target a summary row measures, or None for rows without one."""
    if "target" not in row:
        return None
    model = row["row"].partition(",")[0].split(":")[0].strip()
    for phrase, kind, direction in KINDS:
        if phrase in row["row"]:
            break
    else:
        raise ValueError(f"summary row {row['row']!r} has a target but names none of the kinds "
                         f"{[phrase for phrase, _, _ in KINDS]}: say which it measures")
    model = model.replace(" 20 steps", "")
    return Measured(f"{model}: {kind}", direction, row["target"], row.get("ratio"), row.get("run"),
                    row.get("variant", ""))


def standing(rows: list[dict]) -> dict[str, tuple[Measured, Measured]]:
    """target name -> (the newest run's best row, the best row of any run)."""
    out: dict[str, tuple[Measured, Measured]] = {}
    for measured in filter(None, map(classify, rows)):
        if measured.target_name not in out:
            out[measured.target_name] = (measured, measured)
            continue
        newest, best = out[measured.target_name]
        run, newest_run = measured.run or 0, newest.run or 0
        if run > newest_run or (run == newest_run and measured.better(newest)):
            newest = measured
        if measured.better(best):
            best = measured
        out[measured.target_name] = (newest, best)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summary", nargs="?", default=str(DEFAULT))
    args = ap.parse_args()
    rows = json.loads(Path(args.summary).read_text())["rows"]
    print("| target | newest run | ratio | met | best (run) |\n|---|---|---|---|---|")
    for name, (newest, best) in sorted(standing(rows).items()):
        met = {True: "yes", False: "no", None: "not measured"}[newest.met]
        variant = f" ({newest.variant})" if newest.variant else ""
        print(f"| {name} {newest.direction} {newest.target} | {newest.run}{variant} | {newest.ratio} | {met} "
              f"| {best.ratio} ({best.run}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
