"""Cross-process cancellation flags between a public model and `dit`.

A client cancel is seen by the public model (`request.is_cancelled()`), but the
generation runs in `dit`, another stub process, reached through a BLS request that
Triton 2.51 cannot cancel. A control request would queue behind the very sequences it
should stop (dit's slots are all taken under load), so the flag travels out of band: one
empty file per cancelled generation, in a directory private to this server process
(all stubs share tritonserver as parent). `dit` checks the flags of its batch at every
step boundary — a few stat() calls — and clears a flag when the request ends.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / f"ditserve-{os.getppid()}" / "cancel"


class CancelRegistry:
    def __init__(self, root: Path | None = None):
        self.root = root or default_root()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, request_id: str) -> Path:
        if not _ID.match(request_id):
            raise ValueError(f"request id {request_id!r} is not a safe flag name")
        return self.root / request_id

    def cancel(self, request_id: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._path(request_id).touch()

    def is_cancelled(self, request_id: str) -> bool:
        return self._path(request_id).exists()

    def clear(self, request_id: str) -> None:
        """Idempotent: cancel, timeout and error may all end the same request."""
        self._path(request_id).unlink(missing_ok=True)

    def collect_garbage(self, max_age_s: float) -> int:
        """Drop flags whose request never reached dit (e.g. it failed first)."""
        now, dropped = time.time(), 0
        for flag in self.root.iterdir():
            try:
                if now - flag.stat().st_mtime > max_age_s:
                    flag.unlink(missing_ok=True)
                    dropped += 1
            except FileNotFoundError:
                pass
        return dropped

    def remove_all(self) -> None:
        shutil.rmtree(self.root.parent, ignore_errors=True)
