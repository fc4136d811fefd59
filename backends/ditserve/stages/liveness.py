"""BLS calls that cannot hang on a dead stub.

Triton 2.51 never completes a request whose model's stub process died while running it:
a BLS caller blocked in `exec()` or in the response iterator waits forever (and with it
the public model instance and the client). So the public models make each BLS call in a
worker thread and wait for its responses here; while nothing arrives, they check every
`probe_s` whether the stub processes of the called model that were alive when the call
began still are. If one died, the call fails with an error naming the model.

The stubs are found through /proc: children of this stub's parent (tritonserver) whose
command line names `<repository>/<model>/<version>/model.py`. Where that finds nothing
(another OS, another layout), the watch is off and calls behave as plain BLS.

A disabled watch (deployment `[engine] watch_stubs`) makes the calls in the caller's
thread. "auto" disables it on GPU deployments. It was suspected when public-model stubs
died or hung on the H200, but those had other causes: an output the client had not
requested, and GPU tensors crossing stubs (perf/results/2026-11-29-h200-host-media.md). The
watch has not yet run on a GPU with the media on the host: `perf/gpu_matrix.py --variants
watch_on` is the test.
"""
from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator

PROBE_S = 2.0
_DONE = object()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def stub_pids(model: str, server: int | None = None) -> set[int]:
    """PIDs of the live Python-backend stubs of `model` under `server` (default: this stub's tritonserver)."""
    server, pids = server or os.getppid(), set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is None or stat[1] != server or stat[0] in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and Path(argv[1].decode(errors="replace")).parts[-3:-2] == (model,):
            pids.add(int(entry))
    return pids


class StubWatch:
    """Remembers each model's stub PIDs (rescanned when one is gone) so a call costs a few stat reads."""

    def __init__(self, server: int | None = None, enabled: bool = True):
        self.server = server
        self.enabled = enabled
        self._known: dict[str, set[int]] = {}

    def current(self, model: str) -> set[int]:
        pids = self._known.get(model)
        if not pids or not all(alive(pid) for pid in pids):
            pids = self._known[model] = stub_pids(model, self.server)
        return set(pids)

    def call(self, model: str, responses: Callable[[], Iterable], probe_s: float = PROBE_S) -> Iterator:
        """Yield the items of `responses()` (a BLS call's responses), iterated in a worker
        thread; raise StubDied when a stub of `model` alive at the start dies while we wait
        for the next item. Disabled: iterate them here, unwatched."""
        if not self.enabled:
            yield from responses()
            return
        pids = self.current(model)
        items: queue.SimpleQueue = queue.SimpleQueue()

        def worker():
            try:
                for item in responses():
                    items.put(item)
            except BaseException as exc:  # handed to the caller, raised there
                items.put(exc)
            finally:
                items.put(_DONE)

        threading.Thread(target=worker, name=f"bls-{model}", daemon=True).start()
        while True:
            try:
                item = items.get(timeout=probe_s)
            except queue.Empty:
                dead = sorted(pid for pid in pids if not alive(pid))
                if dead:
                    # The worker stays blocked in Triton for good; it holds no state of ours.
                    raise StubDied(f"{model}: its stub process (pid {', '.join(map(str, dead))}) died while this "
                                   f"request was in flight; reload the model (repository API) to serve it again")
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                try:
                    raise item
                finally:  # `item` would hold its own traceback's frame: a cycle (see generate.Stop)
                    del item
            yield item


class StubDied(RuntimeError):
    """The stub process serving a BLS call died; the message names the model."""
