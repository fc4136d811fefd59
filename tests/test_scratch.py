"""ditserve.scratch: the per-server scratch folders, and the sweep of those that killed servers left."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from ditserve.scratch import SERVER_PREFIX, sweep_dead_servers


def test_sweep_removes_only_the_folders_of_servers_that_are_gone(tmp_path):
    exited = subprocess.Popen(["true"])
    exited.wait()                                   # reaped: its pid names no process now
    zombie = subprocess.Popen(["sleep", "60"])
    zombie.kill()                                   # killed, not yet reaped: a zombie is gone too
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the killed process never became a zombie"
        time.sleep(0.01)
    try:
        names = {f"{SERVER_PREFIX}{exited.pid}": True, f"{SERVER_PREFIX}{zombie.pid}": True,
                 f"{SERVER_PREFIX}{os.getpid()}": False,   # a live process, whoever it is
                 f"{SERVER_PREFIX}1": False,                # init: alive, and not ours to remove
                 f"{SERVER_PREFIX}x": False, "ditserve-region-7": False}   # not a server's folder
        for name in names:
            (tmp_path / name / "handoff").mkdir(parents=True)
            (tmp_path / name / "handoff" / "gen-1").write_bytes(b"x")
        swept = sweep_dead_servers(tmp_path)
        assert sorted(swept) == sorted(tmp_path / name for name, gone in names.items() if gone)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(name for name, gone in names.items() if not gone)
        assert sweep_dead_servers(tmp_path) == []   # idempotent
    finally:
        zombie.wait()
