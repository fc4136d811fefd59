"""perf/step_overhead.py runs end to end (bounded), so the measurement cannot rot."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_step_overhead_measures_both_embedding_sizes(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, str(ROOT / "perf/step_overhead.py"), "--reps", "1", "--steps", "6",
                           "--target-mb", "1", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["padded/inline"]["embeds_mb"] > 10 * summary["tiny/inline"]["embeds_mb"]
    assert set(summary) == {f"{size}/{way}" for size in ("tiny", "padded") for way in ("inline", "handoff")}
    for run in summary.values():  # the overhead itself is noisy on a shared 2-core host: not asserted
        assert run["median_step_ms"] > 0 and run["median_interval_ms"] > 0
