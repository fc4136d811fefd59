"""The step engine: a table of in-flight generations and one denoise step over a batch.

Triton's sequence batcher decides *which* requests are in a batch (new ones join at a
step boundary, finished ones leave); the engine decides *how* they run: requests are
grouped by compatibility key and each group shares one transformer forward. Every
group present in a batch is stepped in the same `execute`, so a request never waits
behind another group for more than one forward of each other group (bounded wait).

Each step's NaN/inf check is read one step late (`StepChecks`): waiting for it at once
would idle the GPU between steps, while dit sends progress and Triton hands the request
back. Having queued a step, the host waits for the work queued before it (so at most one step
is ever queued ahead) and stamps when that ended, the step's start (`StepReport.started_at`):
dit's late queue forecasts the step's end from it (late_queue.py). A step counts as done, and
its progress is reported, once its check has passed. A
request's first step is checked at once (its progress is what time-to-first-step measures)
and so is its last, before its latents leave. Groups holding a first step run first, and each
group has its own checks, so that reading a first step's waits for its own forward only; the
scheduler may have first steps run in a forward apart from their group's running requests
(`apart`), where batching them would not save time.

A newcomer is admitted on a CUDA stream of its own (`AdmissionStream`): its copies to the
device then wait for nothing the steps queued ahead of it, and the host queues its first step
while the GPU still runs those. Its first step may also overtake them (`StepEngine.overtake`,
`[engine] overtake`): it then runs at once, on a stream of the highest priority, beside them.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, fields, is_dataclass

import torch

from .adapters.base import FamilyAdapter
from .emulated_device import EmulatedDevice, EmulatedEvent
from .faults import FaultInjector, Subject
from .isolation import isolating_failures
from .scheduler import ForwardTimer
from .schema import GenerationParams
from .state import RequestState, TextConditioning


@dataclass
class StepReport:
    """What one engine step did, for metrics, logs and progress."""

    forwards: int
    batch_sizes: list[int]
    seconds: float
    # key -> why that request cannot go on (names the step and the point that failed).
    # Its state stays in the table: the caller ends the request and releases it.
    failed: dict[str, str] = field(default_factory=dict)
    # Group forwards that failed and were retried one request at a time.
    isolation_retries: int = 0
    # key -> the step whose check passed in this call (its previous one, or its first): the
    # progress to report now.
    # A request that finished (state.done, not failed) passed the check of its last step too.
    confirmed: dict[str, int] = field(default_factory=dict)
    # Each forward that ran: (compatibility key, requests in it, its timer), for the cost model.
    timings: list[tuple[tuple, int, ForwardTimer]] = field(default_factory=list)
    # When its last forward was queued, and when the device began it: when the work queued before
    # it ended (the host waits for that), or when the step began if the device had run out of
    # queued work by then (`ran_dry`: it idled; never on a plain CPU, where a step returns when done).
    queued_at: float = 0.0
    started_at: float = 0.0
    ran_dry: bool = False
    # Device seconds of each forward of first steps that overtook the running step (`overtake`):
    # their own time plus what sharing the device with it cost; not the cost curve's.
    overtake_seconds: list[float] = field(default_factory=list)


class StepChecks:
    """Whether one group's forward and scheduler steps left each request's model output and
    latents finite.

    The flags go to the host asynchronously (pinned memory, a CUDA event) so that reading
    them waits for this group's work only, never for a group or a step queued after it."""

    def __init__(self, entries: list[tuple[RequestState, tuple[str, str], tuple[torch.Tensor, torch.Tensor]]],
                 emulated: EmulatedDevice | None = None):
        flags = torch.stack([flag for _, _, pair in entries for flag in pair]).reshape(-1, 2)
        self.ready = None
        if flags.is_cuda:
            host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record(torch.cuda.current_stream(flags.device))
            flags = host
        elif emulated is not None:   # a GPU's queue emulated on the CPU: ready when its work has run
            self.ready = emulated.event()
        self.flags = flags
        self.values: list[list[bool]] | None = None
        # key -> (row in flags, step number, "denoise step k/N", "(in a forward of n requests)")
        self.rows = {state.key: (row, state.step_index, *where) for row, (state, where, _) in enumerate(entries)}

    def failure(self, key: str) -> str | None:
        """Why the request's step was not finite, or None; waits for that step's GPU work."""
        if self.values is None:
            if self.ready is not None:
                self.ready.synchronize()
            self.values = self.flags.tolist()
        row, _, step, batch = self.rows[key]
        output_ok, latents_ok = self.values[row]
        if not output_ok:
            return f"{step} produced non-finite values (NaN/inf) in the transformer output {batch}"
        if not latents_ok:
            return f"{step} produced non-finite latents (NaN/inf) in the scheduler step {batch}"
        return None

    def step_number(self, key: str) -> int:
        return self.rows[key][1]


def _rows_finite(rows: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Per row (tensors of one shape, batch dim 1): whether all of it is finite, as 0-dim bools."""
    return torch.isfinite(torch.cat(rows)).flatten(1).all(1).unbind()


def _subject(state: RequestState) -> Subject:
    return Subject(state.params.prompt, state.params.height, state.step_index + 1)


def _cuda_tensors(value, depth: int = 3) -> Iterator[torch.Tensor]:
    """The CUDA tensors a request's state holds: in its fields, its conditioning, its scheduler's
    attributes (diffusers keeps timesteps and sigmas there), and lists or dicts of them."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            yield value
    elif depth == 0:
        return
    elif isinstance(value, dict):
        for item in value.values():
            yield from _cuda_tensors(item, depth - 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _cuda_tensors(item, depth - 1)
    elif is_dataclass(value):
        for f in fields(value):
            yield from _cuda_tensors(getattr(value, f.name), depth - 1)
    elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
        yield from _cuda_tensors(vars(value), depth - 1)


class AdmissionStream:
    """Where a newcomer's state is made on a GPU: a side stream.

    Copies from pageable host memory block the host until their stream has run everything
    queued on it. On the compute stream that is the step queued ahead (engine.step reads a
    step's checks one step late), so an admission there waited for up to two steps before the
    host could queue the newcomer's first one, and the GPU then idled while it did. On a side
    stream the copies wait only for the admission's own work. The compute stream waits for them
    (an event, not the host), and every tensor the state holds is marked as used by the compute
    stream, so that the caching allocator does not hand its memory to a later admission while a
    queued step may still read it."""

    def __init__(self, device: torch.device):
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def prepare(self, make: Callable[[], RequestState]) -> RequestState:
        if self.side is None:
            return make()
        compute = torch.cuda.current_stream(self.side.device)
        with torch.cuda.stream(self.side):
            state = make()
        compute.wait_stream(self.side)
        for tensor in _cuda_tensors(state):
            tensor.record_stream(compute)
        return state


class StepEngine:
    def __init__(self, adapter: FamilyAdapter, faults: FaultInjector | None = None):
        self.adapter = adapter
        self.faults = faults or FaultInjector()
        self.emulated = self.faults.device   # a GPU's queue emulated on a CPU (faults `device`), or None
        if self.emulated is not None and adapter.device.type != "cpu":
            raise ValueError(f"deployment [faults] action \"device\" emulates a GPU's queue on a CPU host; this "
                             f"dit runs on {adapter.device}: use action \"sleep\", or none")
        self.table: dict[str, RequestState] = {}
        # recorded after the last step's work (CUDA, or an emulated device); None on a plain CPU
        self.queued: torch.cuda.Event | EmulatedEvent | None = None
        self.admission = AdmissionStream(adapter.device)
        # where first steps overtake the queued work (`overtake`): the highest priority there is
        self.fast = torch.cuda.Stream(adapter.device, priority=-(1 << 10)) if adapter.device.type == "cuda" else None

    def __contains__(self, key: str) -> bool:
        return key in self.table

    def __len__(self) -> int:
        return len(self.table)

    def admit(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        if key in self.table:
            raise KeyError(f"request {key} is already in flight")
        state = self.admission.prepare(lambda: self.adapter.prepare(key, params, cond))
        self.table[key] = state
        return state

    def step(self, keys: list[str], apart: Collection[str] = ()) -> StepReport:
        """Advance every listed request by exactly one denoise step; the first steps in `apart`
        run in a forward apart from their group's running requests (StepScheduler.apart).

        A failure is contained: a failing group forward is retried one request at a time
        (so a poisoned request does not take its batch peers down), a failing scheduler
        step or non-finite latents fail only their request, and other groups go on. The
        failed requests are listed in the report, never half-stepped silently.
        """
        start = time.monotonic()
        groups: dict[tuple, list[RequestState]] = defaultdict(list)
        for key in keys:
            state = self.table[key]
            if state.done:
                raise RuntimeError(f"request {key} has no steps left")
            groups[state.compat_key, key in apart].append(state)
        previous = {key: self.table[key].unchecked for key in keys}
        ahead = self.queued   # the end of the work queued before this step
        report = StepReport(0, [], 0.0)
        # Groups holding a request's first step go first, each with its own checks: that step's
        # progress (time to first step) then waits for its own forward, not for the other groups'.
        for states in sorted(groups.values(), key=lambda group: all(s.step_index > 0 for s in group)):
            if checks := self._queue_group(states, report, start):
                self.queued = checks.ready
        report.queued_at = time.monotonic()
        report.ran_dry = ahead is not None and ahead.query()
        if ahead is not None and not report.ran_dry:
            ahead.synchronize()   # at most one step queued ahead; this one starts now
        report.started_at = start if ahead is None or report.ran_dry else time.monotonic()
        self._read_checks(keys, previous, report)
        report.forwards, report.seconds = len(report.batch_sizes), time.monotonic() - start
        return report

    def first_steps_alone(self, keys: Collection[str], apart: Collection[str] = ()) -> list[str]:
        """The first steps among `keys` that `step(keys, apart)` would run in forwards holding no
        running request: in `apart`, or in a group of first steps only (what `overtake` may run)."""
        running = {self.table[key].compat_key for key in keys if self.table[key].step_index > 0}
        return [key for key in keys if self.table[key].step_index == 0
                and (key in apart or self.table[key].compat_key not in running)]

    def can_overtake(self) -> bool:
        """Whether a first step would overtake anything now: the device (a GPU, or one emulated)
        still runs queued work."""
        return (self.fast is not None or self.emulated is not None) and self.device_busy()

    def overtake(self, keys: list[str]) -> StepReport:
        """The first steps of newcomers (`keys`) at once, beside the work the device runs, instead
        of after it; returns when their own work is done, and reports their progress then.

        On a GPU they run on a stream of the highest priority, whose kernels go ahead of the
        queued ones as the device frees: the step running finishes later by about their length,
        and their time to first step loses its wait for it (up to a forward). They run eager: the
        compute stream may be replaying the transformer's graphs, whose buffers they must not
        share (with `eager_graphs` the results are the graphs' own). Later work on the compute
        stream waits for them. Their forwards are timed apart from the cost curve's timings (they
        share the device): `StepReport.overtake_seconds`. An emulated device (faults `device`) runs
        them the same way; a plain CPU steps them as `step` would."""
        start = time.monotonic()
        states = [self.table[key] for key in keys]
        if any(state.step_index > 0 for state in states):
            raise RuntimeError(f"only first steps overtake; {[s.key for s in states if s.step_index > 0]} have stepped")
        groups: dict[tuple, list[RequestState]] = defaultdict(list)
        for state in states:
            groups[state.compat_key].append(state)
        report = StepReport(0, [], 0.0)
        with self._overtaking(states):
            for group in groups.values():
                self._queue_group(group, report, start)
        timers, report.timings = [timer for _, _, timer in report.timings], []
        report.queued_at = report.started_at = start
        self._read_checks(keys, dict.fromkeys(keys), report)   # waits for their work: the timers are done
        report.overtake_seconds = [seconds for seconds in (t.seconds() for t in timers) if seconds is not None]
        report.forwards, report.seconds = len(report.batch_sizes), time.monotonic() - start
        return report

    @contextlib.contextmanager
    def _overtaking(self, states: list[RequestState]) -> Iterator[None]:
        """Work queued inside overtakes the device's queue (`overtake`)."""
        if self.fast is None:
            with self.emulated.overtaking() if self.emulated is not None else contextlib.nullcontext():
                yield
            return
        self.fast.wait_stream(self.admission.side)   # the newcomers' copies
        # the caching allocator must not hand out their memory while either stream may still use it
        for tensor in (t for state in states for t in _cuda_tensors(state)):
            tensor.record_stream(self.fast)
        try:
            with torch.cuda.stream(self.fast), self.adapter.eager_forwards():
                yield
        finally:
            compute = torch.cuda.current_stream(self.fast.device)
            compute.wait_stream(self.fast)
            # walked again, not reused: the step made new tensors (latents, the solver's history)
            # on the fast stream, which the compute stream uses from now on
            for tensor in (t for state in states for t in _cuda_tensors(state)):
                tensor.record_stream(compute)

    def _queue_group(self, states: list[RequestState], report: StepReport, start: float) -> StepChecks | None:
        """One group's step queued on the device (`_step_group`), with the checks of the requests it
        stepped (read at their next step, or at once: `_read_checks`); None if none stepped."""
        for state in states:
            if state.first_step_at is None:
                state.first_step_at = start
            state.last_seen = start
        entries = []
        self._step_group(states, report, entries)
        if not entries:
            return None
        checks = StepChecks(entries, self.emulated)
        for state, _, _ in entries:
            state.unchecked = checks
        return checks

    def _read_checks(self, keys: list[str], previous: dict, report: StepReport) -> None:
        """Now that this step is queued, read the previous step's checks; read a first or last
        step's own check at once. NaN/inf never reaches the VAE; the earliest failure is reported."""
        for key in keys:
            state, earlier = self.table[key], previous[key]
            if earlier is not None:
                problem = earlier.failure(key)
                if problem:
                    report.failed[key] = problem
                else:
                    report.confirmed[key] = earlier.step_number(key)
            at_once = state.done or state.step_index == 1   # latents leave / time to first step
            if at_once and key not in report.failed and state.unchecked is not None:
                problem = state.unchecked.failure(key)
                if problem:
                    report.failed[key] = problem
                elif not state.done:
                    report.confirmed[key] = state.step_index
            if at_once or key in report.failed:
                state.unchecked = None

    def _step_group(self, states: list[RequestState], report: StepReport, entries: list) -> None:
        """One forward over a compatibility group (split per request if it fails), then steps."""
        def fail(state: RequestState, exc: Exception) -> None:
            report.failed[state.key] = (f"denoise step {state.step_index + 1}/{state.total_steps} failed in "
                                        f"the transformer forward: {type(exc).__name__}: {exc}")

        report.isolation_retries += isolating_failures(
            states, lambda group: self._forward_and_step(group, report, entries), fail)

    def _forward_and_step(self, states: list[RequestState], report: StepReport, entries: list) -> None:
        """Raises only from the forward, before any state changed; scheduler failures are per request."""
        # an injected sleep counts (it emulates a GPU's forward), as does an emulated device's time
        timer = ForwardTimer(states[0].latents.device, self.emulated)
        outputs = self.faults.at("denoise", [_subject(s) for s in states], self.adapter.denoise(states))
        timer.stop()
        report.batch_sizes.append(len(states))
        report.timings.append((states[0].compat_key, len(states), timer))
        batch = f"(in a forward of {len(states)} request{'s' if len(states) > 1 else ''})"
        steps = {s.key: f"denoise step {s.step_index + 1}/{s.total_steps}" for s in states}
        subjects = {s.key: _subject(s) for s in states}
        failures: dict[str, Exception] = self.adapter.scheduler_steps(states, outputs)
        stepped = []
        for state, output in zip(states, outputs):
            if state.key not in failures:
                try:
                    state.latents = self.faults.at("scheduler_step", [subjects[state.key]], [state.latents])[0]
                except Exception as exc:
                    failures[state.key] = exc
            if state.key in failures:
                exc = failures[state.key]
                report.failed[state.key] = (f"{steps[state.key]} failed in the scheduler step {batch}: "
                                            f"{type(exc).__name__}: {exc}")
            else:
                stepped.append((state, output))
        if stepped:   # whether each model output and new latents are finite: a few ops per group
            outputs_ok = _rows_finite([output for _, output in stepped])
            latents_ok = _rows_finite([state.latents for state, _ in stepped])
            for (state, _), output_ok, latent_ok in zip(stepped, outputs_ok, latents_ok):
                entries.append((state, (steps[state.key], batch), (output_ok, latent_ok)))

    def device_busy(self) -> bool:
        """Whether the device is still running a step queued here (never on a CPU, where a step
        returns when its work is done, unless the deployment emulates a device: faults `device`)."""
        return self.queued is not None and not self.queued.query()

    def time_forward(self, states: list[RequestState]) -> float:
        """Seconds of one forward over `states` as a step runs it (injected faults included),
        waited for; nothing is stepped. The `cost` scheduler measures its curve with it at load."""
        device = states[0].latents.device
        timer = ForwardTimer(device, self.emulated)
        self.faults.at("denoise", [_subject(s) for s in states], self.adapter.denoise(states))
        timer.stop()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if self.emulated is not None:
            self.emulated.event().synchronize()
        return timer.seconds()

    def release(self, key: str) -> RequestState | None:
        """Drop a request's state; idempotent, so cancel, timeout and error may race."""
        return self.table.pop(key, None)

    def collect_garbage(self, live_keys: set[str], idle_seconds: float) -> list[str]:
        """Release states not seen in any batch for `idle_seconds` (their request never came back)."""
        now = time.monotonic()
        stale = [k for k, s in self.table.items() if k not in live_keys and now - s.last_seen > idle_seconds]
        for key in stale:
            self.release(key)
        return stale
