"""When dit queues its next step: late enough that a newcomer can still join it.

dit queues step k+1 as soon as step k starts (engine.py reads a step's checks one step late), so
the GPU never waits for the host. A generation handed over while k runs then finds k+1 queued
already and waits for both before its own first step: under load about 1.5 forwards of its time
to first step (docs/scheduler.md, "Where the rest of the time to first step goes").

With `[engine] late_queue_ms` > 0, dit holds k+1 back until shortly before k is predicted to end,
and watches for newcomers meanwhile. One handed over in time ends the execute: Triton hands its
request back with the others, and it joins k+1. k's end is its start (engine.StepReport.started_at)
plus the `cost` scheduler's estimate of its forwards. The hold ends that long before it:
`late_queue_ms`, plus the host's own time to queue a step (its slowest lately), plus a margin
that grows by `STARVED_STEP_S` each time a held step found the device idle and shrinks again over
the held steps that did not. So a forecast or a host slower than expected costs a few idle steps,
not every step. Past the deadline it still waits, while the device runs, for a generation that
is announced or handed over (its step ran long: on a GPU the text encoder shares the device). A
CPU never holds (a step there returns when its work is done) unless the
deployment emulates a GPU's queue (faults action `device`, emulated_device.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .engine import StepReport

STARVED_STEP_S = 0.001   # margin added when a held step found the device idle
MARGIN_DECAY = 0.98      # what is left of that margin after each held step that did not
HOST_FALL = 0.05         # weight of a faster host queueing time (a slower one counts at once)


@dataclass
class LateQueue:
    margin_s: float                  # [engine] late_queue_ms / 1000; 0 = off (queue at once)
    poll_s: float = 0.0002
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    host_s: float = 0.0              # the host's time from the end of a hold to its step queued
    starved_margin_s: float = 0.0    # grown by starved holds (above)
    ends_at: float | None = None     # the predicted end of the step queued last (None: unknown)
    woke_at: float | None = None     # when the last hold ended
    held: bool = False               # whether the last hold waited at all
    # Called with "holds" (holds that waited), "joins" (holds that ended with a newcomer handed
    # over), "overran" (holds past the deadline that ended with the device idle and no newcomer)
    # and "starved" (held steps that found the device idle): dit's metrics.
    count: Callable[[str], None] = lambda event: None

    @property
    def enabled(self) -> bool:
        return self.margin_s > 0

    def queued(self, report: StepReport, predicted_s: float | None) -> None:
        """A step was queued (`report`) whose forwards are predicted to take `predicted_s` of
        device time (None: not known yet): learn from how its hold went, forecast its end."""
        if not self.enabled:
            return
        if self.woke_at is not None:
            sample = report.queued_at - self.woke_at
            self.host_s = sample if sample > self.host_s else self.host_s + HOST_FALL * (sample - self.host_s)
        if self.held and report.ran_dry:
            self.count("starved")
            self.starved_margin_s += STARVED_STEP_S
        elif self.held:
            self.starved_margin_s *= MARGIN_DECAY
        self.held, self.woke_at = False, None
        self.ends_at = None if predicted_s is None else report.started_at + predicted_s

    def hold(self, device_busy: Callable[[], bool], newcomer: Callable[[], bool],
             arriving: Callable[[], bool] = lambda: False) -> bool:
        """Before the next step: wait while the device runs the step queued last, until shortly
        before its predicted end. True while `newcomer()` says a generation that could join the
        next step is waiting (dit then returns to Triton so that it does).

        Past that deadline it goes on waiting while the device still runs and `arriving()` says a
        generation is on its way (announced and being encoded, or handed over before its request
        reached dit). On a GPU the text encoder's kernels share the device and lengthen the step
        beyond its forecast exactly while a newcomer is being encoded, so the deadline alone let
        H100 newcomers miss the step they were encoded for (session 38). A public model hands the
        conditioning over just before it sends dit the request, so the execute that follows a
        return may still lack it: dit returns again while the device runs. A hold past the deadline
        ends with the device idle by design, so it teaches the starvation margin nothing."""
        if not self.enabled:
            return False
        joined = held = overran = idle = False
        if self.ends_at is not None:
            deadline = self.ends_at - self.margin_s - self.host_s - self.starved_margin_s
            while device_busy():
                past = self.clock() >= deadline
                if past and not arriving():
                    break
                if newcomer():
                    joined = True
                    break
                held, overran = True, past   # the clock only moves on: once past, past until the end
                self.sleep(self.poll_s)
            else:
                idle = True
        if held:
            self.count("holds")
        if joined and held:   # a newcomer came during a hold (a return for one already there is not counted)
            self.count("joins")
        if overran and idle:   # waited past the deadline for one that did not come: an idle gap's cost
            self.count("overran")
        # A step queued after a return waited for Triton's round trip and an admission as well:
        # not the margin's doing, so it teaches the margin nothing.
        self.held = held and not joined and not overran
        self.woke_at = None if joined else self.clock()
        return joined
