"""Resource figures of a running tritonserver and its Python-backend stubs.

One implementation for every place that watches the server for leaks or peaks, so they all
count the same way: tests/test_soak.py (bounded CI soak), perf/soak.py (the long recipe) and
perf/loadgen.py (peak RSS and GPU memory of a load run).

- RSS: VmRSS summed over tritonserver and all its descendants (the stubs); pages shared
  between processes are counted once per process, so read changes, not the level.
- fds: open file descriptors of those processes.
- /dev/shm: bytes of the /dev/shm files they map (the Python backend's shared-memory
  regions), each file counted once.
- GPU memory: `memory.used` of every GPU as nvidia-smi reports it. That is the whole device,
  not the server's processes: per-process figures are not visible across PID namespaces
  (containers), and the soak machines run nothing else.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import numpy as np

# Figures of one sample that a slope is fitted to (see trend()).
TREND_KEYS = ("rss_mb", "gpu_mb", "fds", "shm_mb", "state_table", "processes")


def process_tree(pid: int) -> list[int]:
    """`pid` and all its living descendants ([] when `pid` is gone).

    Zombies are left out: a stub that crashed stays a zombie of tritonserver (Triton does not
    reap or restart it), and counting it would hide the death from a process count."""
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        except (OSError, ValueError):
            continue   # gone meanwhile
        children.setdefault(int(ppid), []).append(int(entry))
        if state not in ("Z", "X"):
            alive.add(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in alive:
            out.append(p)
            todo.extend(children.get(p, []))
    return out


def rss_kb(pid: int) -> int:
    """VmRSS of one process in kB; 0 when it is gone (or a zombie)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_identity(pid: int) -> tuple[str, bool]:
    """(name, whether it is a Python-backend stub) from one read of the command line. A stub's
    name is the model instance it serves (e.g. dit_0_0; argv[8] of the stub), anything else's the
    executable's. Stubs are counted apart: other descendants come and go on their own (inductor's
    compile workers start with a compile and quit when idle)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    stub = b"python_backend_stub" in argv[0]
    return (argv[8].decode() if stub and len(argv) > 8 else Path(argv[0].decode()).name), stub


def process_name(pid: int) -> str:
    """The model instance a stub serves, or the executable's name (process_identity)."""
    return process_identity(pid)[0]


def gpu_memory_mb() -> tuple[list[str], list[float]]:
    """(GPU names, MiB used per GPU) from nvidia-smi; RuntimeError when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        raise RuntimeError("nvidia-smi not found; GPU memory not sampled")
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"nvidia-smi failed: {exc}") from exc
    rows = [r.rsplit(",", 1) for r in out.stdout.strip().splitlines() if r.strip()]
    if out.returncode != 0 or not rows:
        raise RuntimeError(f"nvidia-smi failed: {out.stderr.strip() or f'exit {out.returncode}'}")
    return [r[0].strip() for r in rows], [float(r[1]) for r in rows]


def sample(server_pid: int, state_table: Callable[[], float] | None = None, gpu: bool = False) -> dict:
    """One reading of the server's process tree; `state_table` reads the dit state-table gauge.

    Values that cannot be read (no GPU, metrics endpoint down) are None, never an exception:
    a soak must keep sampling through what it is testing.
    """
    rss = fds = stubs = 0
    shm: set[str] = set()
    by_process: dict[str, float] = {}
    pids = process_tree(server_pid)
    for pid in pids:
        try:
            kb = rss_kb(pid)
            rss += kb
            name, stub = process_identity(pid)
            by_process[name] = round(kb / 1024, 1)
            stubs += stub
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    shm.add(line.split("/dev/shm/", 1)[1].split(" ")[0])
        except OSError:
            pass   # a process that just went away
    shm_bytes = 0
    for name in shm:
        try:
            shm_bytes += os.stat(f"/dev/shm/{name}").st_size
        except OSError:
            pass
    gpu_mb = None
    if gpu:
        try:
            gpu_mb = sum(gpu_memory_mb()[1])
        except RuntimeError:
            pass
    table = None
    if state_table is not None:
        try:
            table = state_table()
        except OSError:
            pass
    return {"t": time.monotonic(), "processes": len(pids), "stubs": stubs, "rss_mb": round(rss / 1024, 2), "fds": fds,
            "shm_mb": round(shm_bytes / 2**20, 3), "gpu_mb": gpu_mb, "state_table": table, "by_process": by_process}


def slope_per_min(samples: list[dict], key: str) -> float | None:
    """Least-squares slope of `key` over time, per minute; None with fewer than 3 readings."""
    points = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
    if len(points) < 3:
        return None
    t, y = np.array(points, dtype=float).T
    return float(np.polyfit(t - t[0], y, 1)[0] * 60)


def trend(samples: list[dict], keys: tuple[str, ...] = TREND_KEYS) -> dict[str, dict]:
    """First, last, min, max, delta and slope per minute of each figure over `samples`."""
    out = {}
    for key in keys:
        values = [s[key] for s in samples if s.get(key) is not None]
        if not values:
            out[key] = None
            continue
        slope = slope_per_min(samples, key)
        out[key] = {"first": values[0], "last": values[-1], "min": min(values), "max": max(values),
                    "delta": round(values[-1] - values[0], 3), "slope_per_min": None if slope is None else round(slope, 4)}
    return out
