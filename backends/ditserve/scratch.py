"""Per-generation files shared by the stub processes of one server, out of band of Triton.

The public models and `dit` run in separate stub processes whose common parent is
tritonserver, so a directory named for that parent is private to the server. One file per
generation, named by its id (the `dit` request id); entries whose generation never came
back are collected by age. Users: cancellation flags (cancellation.py) and the conditioning
handoff (handoff.py). A server's folder goes when its dit unloads; the folders of servers that
were killed instead are swept when the next server's dit loads (sweep_dead_servers).
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
SERVER_PREFIX = "ditserve_server-"


def server_dir(base: Path, server_pid: int | None = None) -> Path:
    """`base/ditserve_server-<tritonserver pid>`: shared by every stub of this server, no
    other. A stub's server is its parent; a tool outside the server passes the server's pid.
    (Not `ditserve-...`: that prefix names the clients' shared-memory regions, ditserve/shm.py.)"""
    return base / f"{SERVER_PREFIX}{server_pid or os.getppid()}"


def sweep_dead_servers(base: Path) -> list[Path]:
    """Remove `base/ditserve_server-<pid>` folders whose server process is gone, and say which.

    A server's dit removes its folder at unload (GenerationFiles.remove_all), which a killed
    server never reaches; its folder would stay in /tmp and /dev/shm (tmpfs: memory) for good.
    A folder whose pid is alive, whoever owns that process, is left alone."""
    swept = []
    for folder in base.glob(f"{SERVER_PREFIX}*"):
        pid = folder.name.removeprefix(SERVER_PREFIX)
        if pid.isdigit() and not _alive(int(pid)) and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(folder)
    return swept


def _alive(pid: int) -> bool:
    """Whether process `pid` runs; a zombie (killed, not yet reaped by its parent) does not.
    Without /proc (not Linux) every process counts as alive, so nothing is swept."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pipeline_dir(base: Path, kind: str, pipeline: str | None = None, server_pid: int | None = None) -> Path:
    """`<server dir>/<kind>`, or `<server dir>/pipeline-<name>/<kind>` for a named pipeline (a
    repository serving several deployments): each pipeline's dit collects, and at unload
    removes, only its own files, so unloading one pipeline leaves another's generations alone."""
    server = server_dir(base, server_pid)
    return (server / f"pipeline-{pipeline}" if pipeline else server) / kind


class GenerationFiles:
    def __init__(self, root: Path):
        self.root = root
        # The highest folder remove_all may remove once empty: the server's directory.
        self.top = next((p for p in root.parents if p.name.startswith(SERVER_PREFIX)), root.parent)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if not _ID.match(key):
            raise ValueError(f"generation id {key!r} is not a safe file name")
        return self.root / key

    def discard(self, key: str) -> None:
        """Idempotent: cancel, timeout and error may all end the same generation."""
        self._path(key).unlink(missing_ok=True)

    def collect_garbage(self, max_age_s: float) -> int:
        """Remove entries older than `max_age_s` (their generation never came back); returns how many."""
        now, dropped = time.time(), 0
        for entry in self.root.iterdir():
            try:
                if now - entry.stat().st_mtime > max_age_s:
                    entry.unlink(missing_ok=True)
                    dropped += 1
            except FileNotFoundError:
                pass
        return dropped

    def remove_all(self) -> None:
        """This pipeline's entries (at unload), and the folders above them up to the server's
        directory as they become empty (another pipeline's keep theirs)."""
        shutil.rmtree(self.root, ignore_errors=True)
        folder = self.root
        while folder != self.top:
            folder = folder.parent
            try:
                folder.rmdir()
            except OSError:  # not empty (another pipeline or kind still uses it) or gone
                return
