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

import tempfile
from pathlib import Path

from .scratch import GenerationFiles, pipeline_dir


def default_root(server_pid: int | None = None, pipeline: str | None = None) -> Path:
    return pipeline_dir(Path(tempfile.gettempdir()), "cancel", pipeline, server_pid)


class CancelRegistry(GenerationFiles):
    def __init__(self, root: Path | None = None, pipeline: str | None = None):
        super().__init__(root or default_root(pipeline=pipeline))

    def cancel(self, request_id: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._path(request_id).touch()

    def is_cancelled(self, request_id: str) -> bool:
        return self._path(request_id).exists()

