"""perf/gpu_matrix.py (the GPU functional matrix) runs end to end here too, CUDA cases skipped,
so the script a GPU session starts with cannot rot between GPU sessions."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_matrix_passes_on_the_tiny_image_pipeline(tmp_path):
    out = tmp_path / "matrix.json"
    proc = subprocess.run([sys.executable, str(ROOT / "perf/gpu_matrix.py"), "--deployments",
                           "configs/tiny-pixart-sigma.toml", "--variants", "default", "--request-timeout-s", "60",
                           "--out", str(out), "--logs", str(tmp_path / "logs.tgz")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert proc.returncode == 0 and report["ok"], (proc.stdout[-2000:], proc.stderr[-2000:], run)
    cases = run["cases"]
    assert cases["stream"]["steps_reported"] == 4
    assert cases["stream_subset"]["final"] == ["image"]
    assert all(r["ok"] for r in cases["stream_x3"]["requests"])
    assert (tmp_path / "logs.tgz").stat().st_size > 0
