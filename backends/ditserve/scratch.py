"""Per-generation files shared by the stub processes of one server, out of band of Triton.

The public models and `dit` run in separate stub processes whose common parent is
tritonserver, so a directory named for that parent is private to the server. One file per
generation, named by its id (the `dit` request id); entries whose generation never came
back are collected by age. Users: cancellation flags (cancellation.py) and the conditioning
handoff (handoff.py). A server's folder goes when its dit unloads; the folders of servers that
were killed instead are swept when the next server's dit loads (sweep_dead_servers), and so
are the /dev/shm regions Triton's stubs of such servers left (sweep_orphan_shm_regions).
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
        if pid.isdigit() and not alive(int(pid)) and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(folder)
    return swept


# Triton's Python-based backends keep each stub's tensors in /dev/shm/<prefix><uuid>
# (python_backend's default prefix `triton_<backend>_backend_shm_region_`). The server unlinks a
# region when its stub ends normally; a killed server (SIGKILL, the OOM killer, a pod's grace period
# running out) leaves its regions behind, 1 MiB or more each, in tmpfs, i.e. memory. In a pod the
# /dev/shm emptyDir outlives container restarts (deploy/k8s/deployment.yaml), so they pile up.
TRITON_SHM_REGION = re.compile(r"^triton_\w+_backend_shm_region_")


def sweep_orphan_shm_regions(shm_dir: Path = Path("/dev/shm"), min_age_s: float = 60.0) -> list[Path]:
    """Remove Triton stub regions in `shm_dir` that no running process maps, and say which.

    Only files of this user that are older than `min_age_s` are candidates (a starting server
    creates, sizes and maps a region within one call; the age covers any gap). A region is kept
    whenever some process of this user might map it: if any such process's memory map cannot be
    read, nothing is swept. Not Linux (no /proc): nothing is swept."""
    uid, now = os.geteuid(), time.time()
    candidates = []
    for path in shm_dir.iterdir() if shm_dir.is_dir() else ():
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if TRITON_SHM_REGION.match(path.name) and stat.st_uid == uid and now - stat.st_mtime > min_age_s:
            candidates.append(path)
    if not candidates:
        return []
    mapped = _mapped_files(uid)
    if mapped is None:
        return []
    swept = []
    for path in candidates:
        if str(path) not in mapped:
            path.unlink(missing_ok=True)
            swept.append(path)
    return swept


def _mapped_files(uid: int) -> set[str] | None:
    """Paths of the files that processes of `uid` (every process, for root) have mapped; None
    when that cannot be known: no /proc, or a Triton process (server or stub) whose map cannot
    be read. Other processes whose map is closed to us (an init outside our namespace) cannot
    hold a stub's region and are passed over."""
    if not Path("/proc/self/maps").exists():
        return None
    mapped: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if uid != 0 and proc.stat().st_uid != uid:
                continue
            text = (proc / "maps").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue   # the process ended meanwhile
        except OSError:
            if _is_triton(proc):
                return None
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6:
                mapped.add(fields[5].removesuffix(" (deleted)"))
    return mapped


def _is_triton(proc: Path) -> bool:
    """Whether /proc/<pid> is a tritonserver or a Python-backend stub; True when its command
    line cannot be read either (then it may be one)."""
    try:
        command = (proc / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    return b"tritonserver" in command or b"backend_stub" in command


def alive(pid: int) -> bool:
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

    def mark(self, key: str) -> None:
        """An empty entry for `key` (the folder again if an unload's remove_all took it)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._path(key).touch()

    def has(self, key: str) -> bool:
        return self._path(key).exists()

    def has_prefix(self, prefix: str) -> bool:
        """Whether any entry's name starts with `prefix` (several records of one key)."""
        try:
            with os.scandir(self.root) as entries:
                return any(entry.name.startswith(prefix) for entry in entries)
        except FileNotFoundError:
            return False

    def discard(self, key: str) -> None:
        """Idempotent: cancel, timeout and error may all end the same generation."""
        self._path(key).unlink(missing_ok=True)

    def collect_garbage(self, max_age_s: float) -> int:
        """Remove entries older than `max_age_s` (their generation never came back); returns how many."""
        now, dropped = time.time(), 0
        for entry in self.root.iterdir() if self.root.is_dir() else ():
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
