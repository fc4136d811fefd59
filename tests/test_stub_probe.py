"""perf/stub_probe.py runs end to end on the tiny pipeline, so the measurement cannot rot."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and text in cmdline:
            found.append(cmdline)
    return found


def test_stub_probe_measures_the_same_code_in_a_stub_and_standalone(tmp_path):
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, str(ROOT / "perf/stub_probe.py"), "--deployment",
                           str(ROOT / "configs/tiny-pixart-sigma.toml"), "--size", "64x64", "--iters", "2",
                           "--idle-stubs", "1", "--busy", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=400, cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Its servers and their stubs are gone (it once started each twice and left one running).
    assert not _processes_naming(str(tmp_path)), _processes_naming(str(tmp_path))
    report = json.loads(out.read_text())
    places = ["standalone_with_1_busy", "stub_with_0_idle_stubs", "stub_with_1_idle_stubs"]
    assert set(report["over_standalone"]) == set(places)
    for place in places[1:]:
        run = report["runs"][place]
        # The stub's facts are its own (the server sets OMP_NUM_THREADS=1 for every stub: launcher.server_env).
        assert run["facts"]["env"]["OMP_NUM_THREADS"] == "1"
        assert run["forward_ms_cfg"] > 0 and run["forward_ms_cfg_ipc"] > 0
    for place in places:   # the ratios themselves are noise on a shared 2-core host: not asserted
        assert set(report["over_standalone"][place]) >= {"python_loop_ms", "launch_ms", "forward_ms_cfg",
                                                         "forward_ms_nocfg"}
