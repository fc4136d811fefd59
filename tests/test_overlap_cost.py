"""perf/overlap_cost.py: which requests overlapped which, from arrival times and latencies."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ditserve_perf_overlap_cost", ROOT / "perf" / "overlap_cost.py")
overlap_cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(overlap_cost)


def test_counts_arrivals_during_a_life_and_requests_running_at_arrival():
    # request 0 runs 0-1.5 s; 1 arrives at 1.0 (during 0's life) and runs to 2.0; 2 arrives at 3.0 alone
    counts = overlap_cost.overlaps([0.0, 1.0, 3.0], [1500.0, 1000.0, 500.0])
    assert counts == [(1, 0), (0, 1), (0, 0)]


def test_a_request_ending_as_another_arrives_does_not_overlap_it():
    assert overlap_cost.overlaps([0.0, 1.0], [1000.0, 1000.0]) == [(0, 0), (0, 0)]
