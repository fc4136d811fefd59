"""A GPU's work queue, emulated on a CPU host, for timing tests without a GPU.

On a GPU, dit queues a step and goes on while the device runs it: the engine reads a step's
checks one step late, and dit holds steps for newcomers (dit.py, late_queue.py) by asking an
event whether the device is done. On a CPU a step's work is done when its call returns, so
none of that happens there. The fault action `device` (`[faults]` rules at point "denoise")
makes the tiny pipeline's forwards occupy an emulated device instead of sleeping on the host:
each forward's time runs after the work queued before it while the host goes on, and the
engine's events (`EmulatedEvent`) complete when it ends.
"""
from __future__ import annotations

import time


class EmulatedEvent:
    """torch.cuda.Event's two calls the engine makes, for a point on the emulated device's timeline."""

    def __init__(self, at: float):
        self.at = at

    def query(self) -> bool:
        return time.monotonic() >= self.at

    def synchronize(self) -> None:
        wait = self.at - time.monotonic()
        if wait > 0:
            time.sleep(wait)


class EmulatedDevice:
    """Work runs back to back: a forward queued while the device is busy starts when it is done."""

    def __init__(self):
        self.busy_until = 0.0

    def occupy(self, seconds: float) -> None:
        self.busy_until = max(time.monotonic(), self.busy_until) + seconds

    def event(self) -> EmulatedEvent:
        """An event that completes when everything queued so far has run."""
        return EmulatedEvent(self.busy_until)
