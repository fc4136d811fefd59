"""The late queue (ditserve/late_queue.py): when dit queues its next step. Pure timing logic on
a simulated clock and device; the real device's half is the GPU test at the end."""
from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

from ditserve.engine import StepReport
from ditserve.late_queue import STARVED_STEP_S, LateQueue


class Device:
    """A clock that the late queue's sleeps advance, a device busy until `busy_until`, and a
    newcomer handed over at `newcomer_at`."""

    def __init__(self, now: float = 10.0, busy_until: float = float("inf"), newcomer_at: float = float("inf")):
        self.now, self.busy_until, self.newcomer_at = now, busy_until, newcomer_at

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def busy(self) -> bool:
        return self.now < self.busy_until

    def newcomer(self) -> bool:
        return self.now >= self.newcomer_at


def late(device: Device, margin_ms: float = 3.0) -> tuple[LateQueue, Counter]:
    events = Counter()
    queue = LateQueue(margin_ms / 1000, clock=device.clock, sleep=device.sleep,
                      count=lambda event: events.update([event]))
    return queue, events


def report(started_at: float, queued_at: float | None = None, ran_dry: bool = False) -> StepReport:
    return StepReport(1, [1], 0.0, queued_at=started_at if queued_at is None else queued_at,
                      started_at=started_at, ran_dry=ran_dry)


def test_off_it_never_holds_nor_reads_the_device():
    device = Device()
    queue, events = late(device, margin_ms=0)
    queue.queued(report(10.0), 0.050)
    assert queue.hold(lambda: pytest.fail("read the device"), lambda: pytest.fail("looked for newcomers")) is False
    assert device.now == 10.0 and not events


def test_it_holds_the_next_step_until_shortly_before_the_running_one_ends():
    device = Device(busy_until=10.050)
    queue, events = late(device, margin_ms=3.0)
    queue.queued(report(10.0), 0.050)            # step k started at 10.0 and takes ~50 ms
    assert queue.hold(device.busy, device.newcomer) is False
    assert 10.047 <= device.now < 10.0475, "until 3 ms before k's predicted end, within a poll"
    assert device.busy(), "the next step is queued while the device still runs k"
    assert events == {"holds": 1}


def test_a_newcomer_handed_over_during_the_hold_ends_it_at_once():
    device = Device(busy_until=10.050, newcomer_at=10.020)
    queue, events = late(device)
    queue.queued(report(10.0), 0.050)
    assert queue.hold(device.busy, device.newcomer) is True   # dit returns; the newcomer joins the next step
    assert 10.020 <= device.now < 10.0205
    assert events == {"holds": 1, "joins": 1}
    # The step queued after the join waited for Triton's round trip and an admission: it teaches
    # the margin nothing, even if the device ran dry meanwhile.
    queue.queued(report(10.060, ran_dry=True), 0.050)
    assert queue.starved_margin_s == 0.0 and queue.host_s == 0.0 and "starved" not in events


@pytest.mark.parametrize("case", ["cost unknown", "device idle", "past the deadline"])
def test_nothing_to_hold_for_returns_at_once(case):
    device = Device(busy_until=10.0 if case == "device idle" else float("inf"))
    queue, events = late(device)
    queue.queued(report(9.9 if case == "past the deadline" else 10.0), None if case == "cost unknown" else 0.050)
    assert queue.hold(device.busy, device.newcomer) is False
    assert device.now == 10.0 and not events


def test_a_newcomer_whose_request_has_not_come_yet_is_waited_for_while_the_device_runs():
    """The public model hands the conditioning over just before it sends dit the request, so an
    execute may find a hand-over without its request: dit returns again (no step queued) while
    the device still runs, past the deadline too, and steps on once the device is idle."""
    device = Device(newcomer_at=9.0, busy_until=10.060)   # handed over before this hold began
    queue, events = late(device)
    queue.queued(report(10.0), 0.050)
    handed_over = device.newcomer
    assert queue.hold(device.busy, device.newcomer, handed_over) is True and device.now == 10.0, "returns at once"
    assert not events, "not a hold, nor a join: nothing was held for it"
    device.now = 10.055
    assert queue.hold(device.busy, device.newcomer, handed_over) is True, "past the deadline, the device still runs"
    device.now = 10.060
    assert queue.hold(device.busy, device.newcomer, handed_over) is False, "the device is idle: step on without it"


def test_past_the_deadline_it_waits_while_a_generation_is_being_encoded():
    """On a GPU the text encoder's kernels lengthen the running step beyond its forecast while a
    newcomer is encoded: the hold goes on past the deadline until it is handed over (or the
    device is idle), and such a hold does not widen the starvation margin."""
    device = Device(busy_until=10.065, newcomer_at=10.060)
    queue, events = late(device, margin_ms=3.0)
    queue.queued(report(10.0), 0.050)            # forecast end 10.050; the step runs to 10.065
    assert queue.hold(device.busy, device.newcomer, lambda: True) is True   # announced, then handed over
    assert 10.060 <= device.now < 10.0605, "held past the deadline until the hand-over"
    assert events == {"holds": 1, "joins": 1}
    device.busy_until, device.newcomer_at = 10.120, float("inf")
    queue.queued(report(10.065), 0.050)
    assert queue.hold(device.busy, device.newcomer, lambda: True) is False, "announced, never handed over"
    assert device.now == pytest.approx(10.120, abs=0.0003), "until the device ran out of work"
    assert events == {"holds": 2, "joins": 1, "overran": 1}, "a hold past the deadline without a join is counted"
    queue.queued(report(10.125, queued_at=device.now, ran_dry=True), 0.050)
    assert "starved" not in events and queue.starved_margin_s == 0.0


def test_a_hold_past_the_deadline_ended_by_an_arrival_that_went_away_is_not_an_idle_gap():
    """The announced generation is gone (cancelled while encoding) before the device ran out of
    work: the step is queued while the device still runs, so the hold is not counted as overran."""
    device = Device(busy_until=10.080)
    queue, events = late(device, margin_ms=3.0)
    queue.queued(report(10.0), 0.050)
    assert queue.hold(device.busy, device.newcomer, lambda: device.now < 10.060) is False
    assert 10.060 <= device.now < 10.0605 and device.busy()
    assert events == {"holds": 1}


def test_the_hosts_queueing_time_moves_the_hold_earlier_and_falls_back_slowly():
    device = Device()
    queue, _ = late(device, margin_ms=3.0)
    queue.queued(report(10.0), 0.050)
    queue.hold(device.busy, device.newcomer)
    woke = device.now
    queue.queued(report(10.050, queued_at=woke + 0.004), 0.050)   # the host took 4 ms to queue it
    assert queue.host_s == pytest.approx(0.004)
    queue.hold(device.busy, device.newcomer)
    assert device.now == pytest.approx(10.100 - 0.003 - 0.004, abs=0.0003)
    queue.queued(report(10.100, queued_at=device.now + 0.001), 0.050)   # faster once: it moves a little
    assert 0.0035 < queue.host_s < 0.004


def test_a_held_step_that_found_the_device_idle_widens_the_margin_until_steps_stop_starving():
    device = Device()
    queue, events = late(device, margin_ms=3.0)
    queue.queued(report(10.0), 0.050)
    queue.hold(device.busy, device.newcomer)
    queue.queued(report(10.048, queued_at=device.now, ran_dry=True), 0.050)   # the forecast ran long
    assert events["starved"] == 1 and queue.starved_margin_s == pytest.approx(STARVED_STEP_S)
    queue.hold(device.busy, device.newcomer)
    assert device.now == pytest.approx(10.098 - 0.003 - STARVED_STEP_S, abs=0.0003)
    queue.queued(report(10.098, queued_at=device.now), 0.050)
    assert queue.starved_margin_s < STARVED_STEP_S and events["starved"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_hold_ends_while_the_queued_work_still_runs():
    """The real device's half: a hold on `engine.device_busy`'s event ends before the work
    queued ahead is done, at its forecast end less the margin."""
    torch.cuda.synchronize()
    timed = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    timed[0].record()
    torch.cuda._sleep(100_000_000)
    timed[1].record()
    torch.cuda.synchronize()
    cycles = int(100_000_000 * 0.2 / (timed[0].elapsed_time(timed[1]) / 1000))   # ~0.2 s of GPU work
    started = time.monotonic()
    torch.cuda._sleep(cycles)
    done = torch.cuda.Event()
    done.record()
    events = Counter()
    queue = LateQueue(0.020, count=lambda event: events.update([event]))
    queue.queued(report(started), 0.2)
    assert queue.hold(lambda: not done.query(), lambda: False) is False
    held = time.monotonic() - started
    assert not done.query(), "the hold ended while the queued work still ran"
    assert 0.17 <= held < 0.2, held
    assert events == {"holds": 1}
    torch.cuda.synchronize()
