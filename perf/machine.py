"""What every recorded perf result states about where it ran (shared by the perf drivers).

Results are only comparable with the machine, package versions and server version beside
them, and a file name that says which machine it came from.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(cmd: str) -> str:
    """stdout of a shell command, or a note why there is none (never raises)."""
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"({exc})"


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info(server_version: str | None) -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = sh("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null") \
        if shutil.which("nvidia-smi") else ""
    return {
        "uname": " ".join(platform.uname()).strip(),
        # CPUs this process may use. Not `nproc`: it prints $OMP_NUM_THREADS when that is set, and
        # the sweeps set it to 1 for the stubs (the H200 write-ups said "nproc: 1" on 16 cores).
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "gpu": gpu or "none",
        "python": platform.python_version(),
        "torch": version("torch"),
        "diffusers": version("diffusers"),
        "transformers": version("transformers"),
        "tritonclient": version("tritonclient"),
        "tritonserver": server_version or "unknown",
        "git": sh(f"git -C {ROOT} rev-parse --short HEAD") + (" (dirty)" if sh(f"git -C {ROOT} status --porcelain") else ""),
        "load_average": sh("cat /proc/loadavg"),
    }


def machine_label(info: dict) -> str:
    """`cpu` or `gpu-<name>` (e.g. gpu-h200), for result file names."""
    if info["gpu"] == "none":
        return "cpu"
    name = info["gpu"].splitlines()[0].split(",")[0].lower().replace("nvidia", "")
    return "gpu-" + (re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown")


def server_version(url: str) -> str | None:
    """`triton 2.51.0` from a running server's gRPC metadata, None when it does not answer."""
    try:
        import tritonclient.grpc as grpcclient

        meta = grpcclient.InferenceServerClient(url).get_server_metadata()
        return f"{meta.name} {meta.version}"
    except Exception:  # noqa: BLE001
        return None


def fence(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```"
