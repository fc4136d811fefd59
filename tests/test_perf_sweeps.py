"""The perf harness cannot rot: every named sweep is consistent, and the smallest CPU sweep runs
end to end (perf_analyzer, raw baseline, own server, write-up, CSV, plot) with tiny limits."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(ROOT / "perf"))
import sweep  # noqa: E402  (perf/sweep.py)


def test_every_named_sweep_names_a_public_model_and_complete_input_data():
    sweeps = sweep.load_sweeps()
    assert {"cpu-txt2img-unary", "cpu-txt2img-stream", "cpu-txt2img-rate", "cpu-txt2img-shm-system",
            "cpu-txt2vid-unary", "cpu-txt2vid-stream", "cpu-txt2vid-shm-system"} <= set(sweeps)
    for s in sweeps.values():
        deployment = sweep.load_deployment(s.deployment)
        assert s.model in (deployment.task, f"{deployment.task}_stream"), s.name
        entries = sweep.data_entries(s, deployment)  # raises when an entry lacks an input
        assert sweep.media_bytes(entries) >= 32 * 32 * 3, s.name


def test_warmup_defaults_to_twice_the_top_level_and_can_be_capped():
    row = dict(name="x", what="", deployment="configs/tiny-pixart-sigma.toml", model="txt2img",
               data="perf/data/txt2img_prompts.json")
    assert sweep.Sweep(**row, concurrency=(1, 4)).warmup(capacity=8) == (8, 4)
    assert sweep.Sweep(**row, request_rate=(10.0,)).warmup(capacity=8) == (16, 8)
    assert sweep.Sweep(**row, concurrency=(1, 2, 4), warmup_requests=1).warmup(capacity=4) == (1, 1)
    assert sweep.Sweep(**row, concurrency=(1, 2), warmup_requests=6).warmup(capacity=4) == (6, 2)
    assert all(s.warmup(4)[0] == 1 for name, s in sweep.load_sweeps().items() if name.startswith("gpu-wan-"))


def test_range_syntax_and_bad_rows():
    assert sweep.parse_range("1:4", int) == (1, 2, 3, 4)
    assert sweep.parse_range("10:40:10", float) == (10.0, 20.0, 30.0, 40.0)
    assert sweep.parse_range("3", int) == (3,)
    with pytest.raises(ValueError, match="streaming = true"):
        sweep.Sweep("x", "", "configs/tiny-pixart-sigma.toml", "txt2img_stream", "perf/data/txt2img_prompts.json",
                    concurrency=(1,))
    with pytest.raises(ValueError, match="exactly one"):
        sweep.Sweep("x", "", "configs/tiny-pixart-sigma.toml", "txt2img", "perf/data/txt2img_prompts.json")


def test_smallest_cpu_sweep_writes_markdown_csv_and_plot(perf_analyzer, tmp_path):
    # Fixed request counts rather than time windows: bounded, and never "unstable" on a busy host.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "perf" / "sweep.py"), "--sweep", "cpu-txt2img-unary", "--concurrency", "1:2",
         "--requests-per-level", "12", "--baseline-runs", "3", "--baseline-batch-sizes", "1,2",
         "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (md,) = tmp_path.glob("*-cpu-txt2img-unary.md")
    stem = md.with_suffix("")
    text = md.read_text()
    assert "bash perf/run_perf_analyzer.sh --sweep cpu-txt2img-unary" in text
    assert "## Served vs raw diffusers" in text
    assert "Errors / tracebacks while serving (excluding CPU-only noise): 0" in text

    rows = list(csv.DictReader(stem.with_suffix(".csv").open()))
    assert [r["Concurrency"] for r in rows] == ["1", "2"]
    for r in rows:
        assert float(r["Inferences/Second"]) > 0
        assert 0 < float(r["p50 latency"]) <= float(r["p99 latency"])

    meta = json.loads(stem.with_suffix(".json").read_text())
    assert meta["baseline"]["p50_ms"] > 0 and meta["baseline"]["best_batch"]["generations_per_s"] > 0
    assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
