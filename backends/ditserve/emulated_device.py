"""A GPU's work queue, emulated on a CPU host, for timing tests without a GPU.

On a GPU, dit queues a step and goes on while the device runs it: the engine reads a step's
checks one step late, and dit holds steps for newcomers (dit.py, late_queue.py) by asking an
event whether the device is done. On a CPU a step's work is done when its call returns, so
none of that happens there. The fault action `device` (`[faults]` rules at point "denoise")
makes the tiny pipeline's forwards occupy an emulated device instead of sleeping on the host:
each forward's time runs after the work queued before it while the host goes on, and the
engine's events (`EmulatedEvent`) complete when it ends.

On a GPU the text encoder and the VAE decode run in processes of their own and time-slice the
device with dit's forwards: a forward running while a prompt is encoded ends later than its cost
curve says, and the encode takes longer than alone. `device` rules at "encode" and "decode" emulate
that (`SharedWork`): each such piece of work delays dit's work pending when it came by its own
length, and itself takes that length plus as much of dit's pending work as it overlaps (two
contexts sharing the device evenly). Session 37's emulation lacked it and forecast the late
queue's joins that an H100 did not give (perf/results/2026-12-05-h100-scheduler-s38.md).
"""
from __future__ import annotations

import bisect
import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path


def pushed_back(starts: list[float], seconds: list[float], queued_at: float, at: float,
                issued: list[float] | None = None) -> float:
    """When work queued at `queued_at` and due at `at` on its own ends, if each piece of other
    work (`starts` in order, `seconds` long) issued after it was queued (`issued`, in the same
    order; default: when the piece starts) and started while it was pending pushes it back by its
    length. A piece issued earlier is in `at` already (the work was queued behind it). (Work queued
    while a piece still runs is not pushed back by the rest of it: an error of at most its length.)"""
    i = bisect.bisect_left(starts if issued is None else issued, queued_at)
    while i < len(starts) and starts[i] < at:
        at += seconds[i]
        i += 1
    return at


class SharedWork:
    """Other stages' work on the emulated device, in a folder every process of the server sees:
    `work`, appended by the stages (`<start> <seconds>` a line, time.monotonic(), one clock for
    every process of the host), and `dit_until`, the end of the work dit has queued, written by dit."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.starts: list[float] = []    # dit's copy of `work`, in the order written
        self.seconds: list[float] = []
        self._read_to = 0

    def add(self, seconds: float) -> float:
        """A stage's piece of work starts now: how long the stage waits for it (its own length
        plus what it overlaps of dit's pending work)."""
        now = time.monotonic()
        with open(self.folder / "work", "a") as log:
            log.write(f"{now!r} {seconds!r}\n")
        try:
            dit_until = float((self.folder / "dit_until").read_text())
        except (FileNotFoundError, ValueError):   # no dit work yet, or caught mid-write
            dit_until = 0.0
        return seconds + min(seconds, max(0.0, dit_until - now))

    def dit_queued_until(self, at: float) -> None:
        (self.folder / "dit_until").write_text(repr(at))

    def read(self) -> None:
        """Take in the pieces written since the last read (whole lines only)."""
        try:
            with open(self.folder / "work", "rb") as log:
                log.seek(self._read_to)
                data = log.read()
        except FileNotFoundError:
            return
        data = data[:data.rfind(b"\n") + 1]
        self._read_to += len(data)
        for line in data.decode().splitlines():
            start, seconds = map(float, line.split())
            self.starts.append(start)
            self.seconds.append(seconds)

    def delay(self, queued_at: float, at: float) -> float:
        """When dit's work, queued at `queued_at` and due at `at` on its own, ends (`pushed_back`)."""
        return pushed_back(self.starts, self.seconds, queued_at, at)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class EmulatedEvent:
    """torch.cuda.Event's two calls the engine makes, for the end of the work queued so far
    (`overtaking`: of the work that overtook it, which nothing overtakes in turn)."""

    def __init__(self, device: EmulatedDevice, queued_at: float, at: float, overtaking: bool = False):
        self.device, self.queued_at, self.at, self.overtaking = device, queued_at, at, overtaking

    def ends_at(self) -> float:
        return self.device.end(self.queued_at, self.at, overtaken=not self.overtaking)

    def query(self) -> bool:
        return time.monotonic() >= self.ends_at()

    def synchronize(self) -> None:
        while (wait := self.ends_at() - time.monotonic()) > 0:
            time.sleep(wait)


class EmulatedDevice:
    """Work runs back to back: a forward queued while the device is busy starts when it is done,
    later by other stages' work that came meanwhile (`shared`, None: dit has the device alone) and
    by dit's own work that overtook it (`overtaking`)."""

    def __init__(self, shared: SharedWork | None = None):
        self.shared = shared
        self.queued_at = self.busy_until = 0.0
        # work that overtook the queue (engine.StepEngine.overtake): when each piece was issued,
        # when it starts (a piece issued behind another in the lane starts when that one ends), lengths
        self.overtake_issued: list[float] = []
        self.overtake_starts: list[float] = []
        self.overtake_seconds: list[float] = []
        self.lane: tuple[float, float] | None = None   # inside `overtaking`: (first start, end) of its work

    def end(self, queued_at: float, at: float, overtaken: bool = True) -> float:
        if self.shared is not None:
            self.shared.read()
            at = self.shared.delay(queued_at, at)
        if overtaken:
            at = pushed_back(self.overtake_starts, self.overtake_seconds, queued_at, at, self.overtake_issued)
        return at

    @contextlib.contextmanager
    def overtaking(self) -> Iterator[None]:
        """Work occupied inside runs at once, beside the work queued (a CUDA stream of the highest
        priority): it pushes that work back by its length, and its events wait for it alone."""
        now = time.monotonic()
        self.lane = (now, now)
        try:
            yield
        finally:
            self.lane = None

    def occupy(self, seconds: float) -> None:
        now = time.monotonic()
        if self.lane is not None:
            first, until = self.lane
            free = self.overtake_starts[-1] + self.overtake_seconds[-1] if self.overtake_starts else 0.0
            start = max(now, until, free)   # behind overtaking work queued earlier, as on one stream
            self.lane = (first, start + seconds)
            self.overtake_issued.append(now)
            self.overtake_starts.append(start)
            self.overtake_seconds.append(seconds)
            if self.shared is not None:
                self.shared.dit_queued_until(max(start + seconds, self.end(self.queued_at, self.busy_until)))
            return
        start = max(now, self.end(self.queued_at, self.busy_until))
        self.queued_at, self.busy_until = now, start + seconds
        if self.shared is not None:
            self.shared.dit_queued_until(self.busy_until)

    def event(self) -> EmulatedEvent:
        """An event that completes when everything queued so far has run (inside `overtaking`:
        when the work occupied inside has)."""
        if self.lane is not None:
            return EmulatedEvent(self, *self.lane, overtaking=True)
        return EmulatedEvent(self, self.queued_at, self.busy_until)
