"""Start the front end as its own process and wait until it answers (tests, scripts/web.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ditserve.launcher import backends_on_pythonpath

ROOT = Path(__file__).resolve().parents[1]


class FrontendProcess:
    """`python -m frontend ...` as a child process, stopped with SIGTERM (uvicorn exits cleanly)."""

    def __init__(self, triton_url: str, port: int, args: list[str] | tuple[str, ...] = (),
                 log_path: Path | None = None):
        self.url = f"http://127.0.0.1:{port}"
        self.command = [sys.executable, "-m", "frontend", "--triton-url", triton_url, "--port", str(port), *args]
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "FrontendProcess":
        out = open(self.log_path, "w") if self.log_path else None
        env = {**os.environ, "PYTHONPATH": backends_on_pythonpath(os.environ)}
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the front end exited with code {self.process.returncode}: {self.command}")
            try:
                urllib.request.urlopen(self.url + "/", timeout=2).close()   # the page needs neither key nor Triton
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the front end did not answer on {self.url} within {timeout_s:.0f}s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "FrontendProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
