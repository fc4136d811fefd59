"""perf/scheduler_summary.py: issue 22's summary JSON is computed from matched-control reports."""
from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ditserve_perf_scheduler_summary", ROOT / "perf" / "scheduler_summary.py")
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)


def report(fraction: float, base_p50: float, step_p50: float) -> dict:
    """A matched-control report reduced to the fields the summary reads."""
    def mode(p50: float, throughput: float) -> dict:
        return {"source": "poisson n=4", "offered_request_rate": 2.0, "request_throughput": throughput,
                "p50_e2el_ms": p50, "p99_e2el_ms": 2 * p50, "mean_e2el_ms": p50, "p50_ttfs_ms": 100.0,
                "p99_ttfs_ms": 200.0, "mean_step_batch_size": 1.5, "completed_requests": 4,
                "failed_requests": 0, "lost": 0, "duplicated": 0, "mean_step_duration_ms": 40.0,
                "ttfs_split_ms": {"encode": 30.0, "admission_wait": 20.0, "admission": 2.0, "first_step_and_rest": 48.0}}
    return {"modes": ["request_batch", "step:cost"], "command": "python perf/matched_control.py ...",
            "load": {"name": f"load{fraction}", "fraction": fraction, "saturation": {"rps": 4.0}},
            "reports": {"request_batch": mode(base_p50, 2.0), "step:cost": mode(step_p50, 1.9)}}


def test_reports_in_a_folder_and_its_tarball_count_once_per_load(tmp_path: Path) -> None:
    loads = {0.95: report(0.95, 1000.0, 800.0), 0.5: report(0.5, 500.0, 550.0)}
    (tmp_path / "control_x-matched-control-load0p95.json").write_text(json.dumps(loads[0.95]))
    with tarfile.open(tmp_path / "control_all.tgz", "w:gz") as tar:
        for fraction, body in loads.items():
            data = json.dumps(body).encode()
            info = tarfile.TarInfo(f"x-matched-control-load{fraction}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "summary.json"
    assert summary.main(["512px=" + str(tmp_path), "--out", str(out), "--note", "machine=test"]) == 0
    written = json.loads(out.read_text())
    assert written["machine"] == "test"
    assert [row["load_fraction"] for row in written["traces"]] == [0.5, 0.95]
    ratios = written["traces"][1]["ratios"]["step:cost/request_batch"]
    assert ratios["p50_ms"] == 0.8 and ratios["throughput_req_s"] == 0.95
    assert written["traces"][0]["runs"]["request_batch"]["p50_ms"] == 500.0
    assert written["traces"][0]["runs"]["step:cost"]["ttfs_split_ms"]["admission_wait"] == 20.0   # carried as reported
    assert written["traces"][0]["runs"]["step:cost"]["ttfs_p50_over_one_step_ms"] == 60.0   # 100 ms - a 40 ms step
    assert written["traces"][0]["ratio_intervals_95"] == {}   # no per-request latencies: no interval


def test_three_modes_give_the_last_ones_ratios_to_the_first_and_to_the_one_before(tmp_path: Path, capsys) -> None:
    """`request_batch,step:cost,step:cost+late_queue_ms=2`: issue 22's ratios and the A/B of one key."""
    body = report(0.8, 1000.0, 800.0)
    late = {**body["reports"]["step:cost"], "p50_e2el_ms": 720.0, "p50_ttfs_ms": 80.0,
            "dit_holds": {"arrival": 0, "late": 40, "late_joins": 4, "late_overran": 1, "late_starved": 0,
                          "overtakes": 3}}
    body = {**body, "modes": [*body["modes"], "step:cost+late_queue_ms=2"],
            "reports": {**body["reports"], "step:cost+late_queue_ms=2": late}}
    (tmp_path / "x-matched-control-load0p8.json").write_text(json.dumps(body))
    out = tmp_path / "summary.json"
    assert summary.main(["mixed=" + str(tmp_path), "--out", str(out)]) == 0
    row, = json.loads(out.read_text())["traces"]
    assert row["ratios"]["step:cost+late_queue_ms=2/request_batch"]["p50_ms"] == 0.72
    assert row["ab_ratios"]["step:cost+late_queue_ms=2/step:cost"]["p50_ms"] == 0.9
    assert row["ab_ratios"]["step:cost+late_queue_ms=2/step:cost"]["ttfs_p50_ms"] == 0.8
    printed = capsys.readouterr().out
    assert "A/B: the last mode against the one before it" in printed
    assert "| 40 / 4 / 1 | 3 |" in printed, "the compared mode's late-queue holds / joins / overran, overtakes"


def test_paired_intervals_bracket_the_ratio_and_shrink_when_every_request_moves_alike() -> None:
    base = [100.0 + 10 * i for i in range(40)]
    uniform = summary.paired_interval(base, [0.8 * b for b in base], summary.statistics.median)
    assert uniform == [0.8, 0.8]
    noisy = [b * (0.6 if i % 2 else 1.0) for i, b in enumerate(base)]
    low, high = summary.paired_interval(base, noisy, summary.statistics.fmean)
    assert low < summary.statistics.fmean(noisy) / summary.statistics.fmean(base) < high and high - low > 0.05
    assert summary.paired_interval(base, base[:-1], summary.statistics.median) is None   # not the same trace
    with_lost = [None] * 35 + base[35:]
    assert summary.paired_interval(base, with_lost, summary.statistics.median) is None   # too few pairs


def test_a_folder_without_reports_is_refused_with_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="control_all.tgz"):
        summary.main(["x=" + str(tmp_path)])
