"""ditserve.scratch: the per-server scratch folders, and the sweep of those that killed servers left."""
from __future__ import annotations

import mmap
import os
import subprocess
import time
from pathlib import Path

from ditserve.scratch import SERVER_PREFIX, sweep_dead_servers, sweep_orphan_shm_regions


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


def test_orphan_sweep_removes_only_old_triton_regions_that_nothing_maps(tmp_path):
    """Triton stub regions that killed servers left in /dev/shm go; a region some process maps
    (a live server's), a young one (a server starting) and other files stay."""
    region = "triton_diffusion_backend_shm_region_"
    old = time.time() - 3600
    files = {f"{region}orphan": True, "triton_python_backend_shm_region_orphan": True,
             f"{region}mapped": False, f"{region}young": False,
             "ditserve-region-7": False, "other": False}   # a client's region, anything else
    for name in files:
        (tmp_path / name).write_bytes(b"\0" * 4096)
        if name != f"{region}young":
            os.utime(tmp_path / name, (old, old))
    with open(tmp_path / f"{region}mapped", "r+b") as handle, mmap.mmap(handle.fileno(), 4096):
        swept = sweep_orphan_shm_regions(tmp_path, min_age_s=60)
    assert sorted(swept) == sorted(tmp_path / name for name, gone in files.items() if gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(name for name, gone in files.items() if not gone)
    assert sweep_orphan_shm_regions(tmp_path / "missing") == []
