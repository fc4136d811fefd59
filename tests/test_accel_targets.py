"""perf/accel_targets.py: issue 23's targets read from the accel summary (pure logic, no server)."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "perf"))
from accel_targets import standing  # noqa: E402


def row(name: str, ratio: float | None, target: float, run: int) -> dict:
    return {"row": name, "ratio": ratio, "target": target, "run": run}


def test_newest_run_decides_and_the_best_is_kept_per_direction():
    rows = [row("X 512x512 20 steps, one request", 0.51, 0.5, 4),
            row("X 512x512 20 steps, one request", 0.60, 0.5, 7),
            row("X 512x512 20 steps, closed loop at concurrency 16 (capacity 8)", 0.99, 1.3, 4),
            row("X 512x512 20 steps, closed loop at concurrency 32 (capacity 16)", 1.31, 1.3, 5),
            row("X 512x512: first request after READY vs warm solo p50", 1.02, 1.1, 4),
            row("Y 81x480x832, one request", None, 0.85, 0),
            {"row": "X 512x512: load", "ready_s": 200}]                      # no target: not a target row
    got = standing(rows)
    assert sorted(got) == ["X 512x512: first request after READY / warm", "X 512x512: one request",
                           "X 512x512: throughput", "Y 81x480x832: one request"]
    newest, best = got["X 512x512: one request"]
    assert (newest.run, newest.ratio, newest.met, best.ratio) == (7, 0.60, False, 0.51)   # lower is better
    newest, best = got["X 512x512: throughput"]                 # concurrencies are one target
    assert (newest.run, newest.met, best.ratio) == (5, True, 1.31)                          # higher is better
    assert got["Y 81x480x832: one request"][0].met is None


def test_the_committed_summary_reads_as_recorded():
    """Run 7 met the 1024 targets: whatever runs come later, the best stays at least that good."""
    rows = json.loads((ROOT / "perf" / "results" / "2026-12-02-h200-accel.json").read_text())["rows"]
    got = standing(rows)
    _, best = got["PixArt-Sigma 1024x1024: one request"]
    assert best.direction == "<=" and best.ratio <= 0.716 and best.met
    _, best = got["PixArt-Sigma 1024x1024: throughput"]
    assert best.direction == ">=" and best.ratio >= 1.414 and best.met


def test_psnr_rows_are_a_higher_is_better_target_and_unknown_kinds_are_refused():
    got = standing([row("T 64x64 float32, PSNR of the served image against eager", 66.3, 35.0, 8)])
    newest, _ = got["T 64x64 float32: PSNR against eager diffusers, dB"]
    assert newest.direction == ">=" and newest.met
    with pytest.raises(ValueError, match="names none of the kinds"):
        standing([row("T 64x64, something new", 1.0, 1.0, 8)])
