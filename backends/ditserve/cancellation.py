"""Cross-process cancellation flags: from a public model to `dit` (CancelRegistry), and from the
`cancel` model to the public models (ClientCancels, below).

A client cancel is seen by the public model (`request.is_cancelled()`), but the
generation runs in `dit`, another stub process, reached through a BLS request that
Triton 2.51 cannot cancel. A control request would queue behind the very sequences it
should stop (dit's slots are all taken under load), so the flag travels out of band: one
empty file per cancelled generation, in a directory private to this server process
(all stubs share tritonserver as parent). `dit` checks the flags of its batch at every
step boundary — a few stat() calls — and clears a flag when the request ends.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
import threading
import time
from pathlib import Path

from .scratch import GenerationFiles, alive, pipeline_dir


def default_root(server_pid: int | None = None, pipeline: str | None = None) -> Path:
    return pipeline_dir(Path(tempfile.gettempdir()), "cancel", pipeline, server_pid)


class CancelRegistry(GenerationFiles):
    def __init__(self, root: Path | None = None, pipeline: str | None = None):
        super().__init__(root or default_root(pipeline=pipeline))

    def cancel(self, request_id: str) -> None:
        self.mark(request_id)

    def is_cancelled(self, request_id: str) -> bool:
        return self.has(request_id)



# A cancel for a request that has not started (queued for a public-model instance) waits this long
# for it; a finished request's record answers "finished" for as long.
PENDING_CANCEL_S = 600.0


class ClientCancels:
    """Cancels a client asks for by request id, through the `cancel` model (stages/cancel.py).

    Why not just cancel the gRPC call: Triton 2.51's gRPC front end segfaults about once in
    2,000 client cancels that meet the request's final response (docs/reliability.md, "Known
    crash"). A cancel sent as a request of its own never touches the generation's call: the
    public model sees the flag at its next dit step, ends the generation with one CANCELLED
    error response, and the stream ends as any failed request does. It also reaches unary
    gRPC and HTTP calls, which a client cannot cancel otherwise.

    Three records per request id, each an empty file named for a hash of the id (any id is a
    safe file name then), under the pipeline's own folder: `running` while its generation runs
    here (one record per generation, as clients may reuse an id), `ended` once one ended, `flags`
    once a client cancelled it. The public models write `running` and `ended`, the cancel model
    writes `flags`.
    """

    def __init__(self, root: Path | None = None, pipeline: str | None = None):
        root = root or pipeline_dir(Path(tempfile.gettempdir()), "client-cancel", pipeline)
        self.flags, self.running, self.ended = (GenerationFiles(root / kind) for kind in ("flags", "running", "ended"))
        self.stamp = root / "collected"   # when a process of this server last dropped expired records
        self.collected_at = 0.0
        self.collector: threading.Thread | None = None
        self.generations = itertools.count()   # this process's generations: their running records

    def _collect_garbage(self) -> None:
        """Drop cancels and end records older than PENDING_CANCEL_S: once a minute for all the
        server's processes (the stamp), in a thread, so that no response waits for it (every
        generation with an id leaves an end record: at 30 requests/s, 18,000 in 10 minutes, which
        took 0.19 s to go through on the 2-core CPU host)."""
        now = time.monotonic()
        if now - self.collected_at < 60.0:
            return
        self.collected_at = now
        try:
            if time.time() - self.stamp.stat().st_mtime < 60.0:
                return
        except FileNotFoundError:
            pass
        try:
            self.stamp.touch()
        except FileNotFoundError:   # an unload took the folder
            return
        self.collector = threading.Thread(target=self._drop_expired, name="client-cancel-gc", daemon=True)
        self.collector.start()

    def _drop_expired(self) -> None:
        """Cancels and end records past PENDING_CANCEL_S, and the running records of processes that
        died mid-generation (a stub killed: its record would keep its id's cancels alive)."""
        try:
            for records in (self.flags, self.ended):
                records.collect_garbage(PENDING_CANCEL_S)
            for entry in os.scandir(self.running.root):
                if not alive(int(entry.name.split(".")[1])):   # <key>.<pid>.<n>, written by start()
                    self.running.discard(entry.name)
        except OSError:   # the folder went with an unload (remove_all)
            pass

    @staticmethod
    def key(request_id: str) -> str:
        return hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:40]

    def request(self, request_id: str) -> str:
        """Cancel the generation with this id and say where it stood: `cancelling` (it runs and
        ends at its next denoise step), `finished` (it ended already: nothing to do) or `pending`
        (not seen yet, e.g. still queued: it ends as it starts, if that is within PENDING_CANCEL_S)."""
        key = self.key(request_id)
        self._collect_garbage()
        if self._runs(key):
            self.flags.mark(key)
            return "cancelling"
        if self.ended.has(key):
            return "finished"
        self.flags.mark(key)
        return "pending"

    def start(self, request_id: str) -> str:
        """A generation with this id starts (a reused id forgets its earlier run); returns its
        running record, which `end` takes."""
        key = self.key(request_id)
        self.ended.discard(key)
        record = f"{key}.{os.getpid()}.{next(self.generations)}"
        self.running.mark(record)
        return record

    def _runs(self, key: str) -> bool:
        """Whether a generation with this key runs: any of its running records (start())."""
        return self.running.has_prefix(f"{key}.")

    def cancelled(self, request_id: str) -> bool:
        return self.flags.has(self.key(request_id))

    def end(self, request_id: str, record: str) -> None:
        """The generation ended, however: a late cancel is answered `finished`, and the cancel (if
        any) is spent once no other generation with this id runs (a cancel reaches all of them)."""
        key = self.key(request_id)
        self._collect_garbage()
        self.ended.mark(key)
        self.running.discard(record)
        if not self._runs(key):
            self.flags.discard(key)

    def remove_all(self) -> None:
        self.stamp.unlink(missing_ok=True)
        for records in (self.flags, self.running, self.ended):
            records.remove_all()

