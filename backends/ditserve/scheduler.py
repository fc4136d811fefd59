"""Which ready generations step now: the step scheduler of `dit` (`[engine] scheduler`).

Triton hands `dit` every generation that is ready for a step. `all` steps every one of them
(processor sharing: right when batching is nearly free, as at 512px on the H200). `cost`
steps a subset chosen from a cost curve of the transformer forward, learned from the engine's
own step timings, because at 1024px a forward of 16 rows costs ~6x one of 2 rows and
stepping everyone stretches every request's latency for little throughput
(perf/results, DESIGN.md "Facts measured here (2026-12-01)"). A request that is not chosen
keeps its state and is rescheduled without a step; nothing else about it changes.

The `cost` policy chooses at two levels, because each compatibility group (requests that
share one forward) costs its own forward and an execute runs the chosen groups' forwards back to
back: stepping every group every round is processor sharing across groups, which stretches every
request's step time to the sum of all groups' forwards (the H200 mixed trace of 2026-12-02: ~1.1
requests per forward, p99 1.36x request batching; perf/results/2026-12-02-h200-scheduler.md).

- Within a group, order: requests in dit for longer than `max_slowdown` x their estimated time
  alone (their steps x the group's forward of one: the stretch bound) first, the most stretched
  (time in dit over time alone) first; then fewest remaining steps first (SRPT, which lowers mean
  latency), ties by arrival. Among equal requests the most stretched is the oldest, so a backlog
  turns into arrival order (what request batching does), not into processor sharing, which a
  consecutive-round aging bound (the previous rule) made of it in simulation. Between a short
  and a long request late by the same seconds the short one is the more stretched and goes first
  (oldest-first left 4-step requests at 20-39x their time alone behind 30-step ones on the H200
  mixed trace; perf/results/2026-12-03-h200-scheduler-s26.md). On the H200 at 1024px neither
  the aging bound nor the stretch bound reached request batching's median
  (perf/results/2026-12-02-h200-scheduler-ladder.md).
- Within a group, size: step the first k of that order, where k minimises the estimated sum
  of completion times of the group's requests in SRPT order (a fluid replay of the group with
  k slots and the cost curve) plus the wait of the requests expected to arrive meanwhile
  (`expected_latency_cost`), among the k whose throughput (request-steps per second) is at
  least what the arrivals need at `target_utilisation` (ArrivalRate, CostPolicy.needed), capped
  at `throughput_floor` x the best k's. A waiting request is thus admitted only when the
  throughput it adds pays for the slowdown of the rows already running, or the load needs that
  throughput; under a backlog the floor keeps the scheduler from trading much throughput for
  latency.
- Across groups: one group steps: the one holding the most stretched overdue request if any, else
  the one whose head finishes soonest when it runs alone (its fewest remaining steps x the
  estimated forward of its chosen k: SRPT between groups). Every group not measured yet also
  steps (once, so measured; it never starves). With one group this is the within-group rule.
- First steps: a request not stepped yet takes its first step in this execute, in its group's
  forward or as its group's own (time to first step; it costs the running rows one forward).
  Its first step runs in a forward apart from the running rows of its group, before theirs,
  where the curve says the two forwards cost about what one would (within `throughput_floor`:
  `CostPolicy.apart`), so that its progress waits for its own rows only (the engine reads each
  forward's check apart). On the H200 at 1024px, one CFG request's forward is 46.6 ms and two
  requests' 92.9 ms: a newcomer joining a running request's forward waited twice as long for
  its first step (perf/results/2026-12-05-h200-scheduler-s36.md).
  Simulated against the previous rule in perf/sched_sim.py (perf/results/2026-12-02-sim-scheduler-s12-*.md).
  Tried in session 23 and dropped, as neither lowered the median on a real server with the H200's
  1024px curve emulated (docs/scheduler.md, "Session 23"): stepping newcomers alone when that
  lowers the summed latency (then one check covered a whole step, and Triton seldom handed dit a
  newcomer beside a running request; the split above came back once neither held), and adding a
  round's measured overhead outside the forwards to the curve.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from .emulated_device import EmulatedDevice


class ForwardTimer:
    """Time of one forward without waiting for it: CUDA events on a GPU (read once the work
    has finished; the engine never synchronises just to time), the wall clock on a CPU, or the
    timeline of a device emulated on the CPU (`emulated`, ditserve/emulated_device.py)."""

    def __init__(self, device: torch.device, emulated: EmulatedDevice | None = None):
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.emulated = emulated
        if self.stream is not None:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.begin.record(self.stream)
        elif emulated is not None:   # the forward starts when the work queued before it is done
            self.begin = max(time.monotonic(), emulated.event().ends_at())
        else:
            self.begin = time.perf_counter()

    def stop(self) -> None:
        if self.stream is not None:
            self.end.record(self.stream)
        elif self.emulated is not None:
            self.end = self.emulated.event()
        else:
            self.end = time.perf_counter()

    def seconds(self) -> float | None:
        """The forward's duration, or None while its (GPU or emulated) work is still running."""
        if self.emulated is not None:
            return self.end.ends_at() - self.begin if self.end.query() else None
        if self.stream is None:
            return self.end - self.begin
        return self.begin.elapsed_time(self.end) / 1000.0 if self.end.query() else None


class CostModel:
    """Forward seconds per (compatibility key, requests in the forward).

    Observed forwards are folded into a low quantile (about the 10th percentile), tracked by an
    EWMA that follows a faster forward with weight `ewma` and a slower one with a tenth of it.
    The stages share the GPU as separate processes, so their kernels lengthen a forward's timed
    span at random and only ever lengthen it: a mean lets that noise decide which batch size
    looks cheap (simulated in perf/sched_sim.py --timing-noise; on the H200 at 1024px `cost`
    batched requests that cost no less together, 2026-12-02).

    A group profiled at load (`profile`: forwards of 1..capacity requests at `profile_sizes`,
    timed while no request ran) keeps that curve's shape and learns its level: one factor per
    group, the same low quantile of observed / profiled time over every size. Load stretches all
    sizes alike; learning each size apart would leave the sizes seldom run at their uncontended
    profile, cheaper than the sizes run often (perf/sched_sim.py --measure-at-load: that made
    `cost` batch 1.29 requests per forward at 1024px, against 1.05 unprofiled).

    A level below 1 means the profile itself ran slow: the other stages were compiling on the same
    host while dit profiled (on the H200 with a compiled T5, the 1024px CFG profile had 1 request
    at 76 ms against 49-52 served, and 16 at 728 against 725). Such a slowdown hits the
    launch-bound small sizes and spares the large ones, so it is not spread over the curve: each
    size observed since takes its own level (the same low quantile), and a size not yet observed
    keeps its profile. Spread, one request's 0.68 had made 16 look 1.5x cheaper than they ran, and
    `cost` batched 1.73 requests per forward where request batching ran 1.38
    (perf/results/2026-12-03-h200-scheduler-s22.md).

    Unobserved sizes of an unprofiled group are estimated optimistically, so that they get
    tried once: between two observed sizes linearly; above the largest as free (same cost);
    below the smallest as proportional to the size (no batching gain)."""

    RISE = 0.1   # a slower forward moves the estimate by RISE x ewma of the difference

    def __init__(self, ewma: float = 0.3):
        self.ewma = ewma
        self.curves: dict[tuple, dict[int, float]] = {}     # learned per size (unprofiled groups)
        self.profiles: dict[tuple, dict[int, float]] = {}   # measured at load, uncontended
        self.levels: dict[tuple, float] = {}                # profiled groups: observed / profiled
        self.size_levels: dict[tuple, dict[int, float]] = {}  # the same, per size observed
        self.pending: list[tuple[tuple, int, ForwardTimer]] = []

    def _low_quantile(self, old: float | None, new: float) -> float:
        weight = self.ewma if old is None or new < old else self.ewma * self.RISE
        return new if old is None else old + weight * (new - old)

    def profile(self, group: tuple, curve: dict[int, float]) -> None:
        """Forwards of `group` timed at load while nothing else ran: seconds per number of requests.
        Kept as their lower monotone envelope (a size costs at most what any larger one did): noise
        only lengthens a timed forward, and the H200's profiles had single sizes 1.5-2.3x their
        neighbours (1024px, no CFG: 9 -> 205 ms, 10 -> 353, 13 -> 294; 2026-12-02)."""
        envelope, cheapest = {}, float("inf")
        for size in sorted(curve, reverse=True):
            cheapest = envelope[size] = min(cheapest, curve[size])
        self.profiles[group] = dict(sorted(envelope.items()))
        self.levels.setdefault(group, 1.0)

    def observe(self, group: tuple, size: int, seconds: float) -> None:
        if group in self.profiles:
            ratio = seconds / _interpolate(self.profiles[group], size)
            self.levels[group] = self._low_quantile(self.levels[group], ratio)
            sizes = self.size_levels.setdefault(group, {})
            sizes[size] = self._low_quantile(sizes.get(size), ratio)
            return
        curve = self.curves.setdefault(group, {})
        curve[size] = self._low_quantile(curve.get(size), seconds)

    def add_timer(self, group: tuple, size: int, timer: ForwardTimer) -> None:
        self.pending.append((group, size, timer))

    def resolve(self) -> None:
        """Fold in the timed forwards whose work has finished; keep the rest for later."""
        waiting = []
        for group, size, timer in self.pending:
            seconds = timer.seconds()
            if seconds is None:
                waiting.append((group, size, timer))
            else:
                self.observe(group, size, seconds)
        self.pending = waiting

    def describe(self) -> str:
        """The curves in ms, one `group: {requests: ms}` per group, profiled ones at their learned
        level (for the server log)."""
        def ms(curve: dict[int, float], level: Callable[[int], float] = lambda size: 1.0) -> str:
            return "{" + ", ".join(f"{k}: {1000 * v * level(k):.1f}" for k, v in sorted(curve.items())) + "}"
        parts = [f"{group}: {ms(curve, lambda size, group=group: self.level(group, size))} "
                 f"(profiled at load, x{self.levels[group]:.2f})" for group, curve in self.profiles.items()]
        parts += [f"{group}: {ms(curve)}" for group, curve in self.curves.items()]
        return "; ".join(parts) or "nothing measured"

    def level(self, group: tuple, size: int) -> float:
        """Observed / profiled time for a forward of `size` requests of a profiled group: the
        group's level, or below 1 (a slow profile) the size's own, 1 for a size not observed."""
        level = self.levels[group]
        return level if level >= 1.0 else self.size_levels.get(group, {}).get(size, 1.0)

    def best_throughput(self, group: tuple) -> float | None:
        """The most requests-steps per second any measured size of `group` gives (None if unmeasured)."""
        curve = self.profiles.get(group) or self.curves.get(group)
        return max(k / self.estimate(group, k) for k in curve) if curve else None

    def estimate(self, group: tuple, size: int) -> float | None:
        """Seconds of a forward of `size` requests of `group`; None before any measurement."""
        if group in self.profiles:
            return _interpolate(self.profiles[group], size) * self.level(group, size)
        curve = self.curves.get(group)
        return _interpolate(curve, size) if curve else None


def _interpolate(curve: dict[int, float], size: int) -> float:
    """`curve` at `size`: linear between two known sizes, the largest's value above them (tried as
    free), proportional to the size below the smallest (no batching gain)."""
    if size in curve:
        return curve[size]
    sizes = sorted(curve)
    below = [s for s in sizes if s < size]
    above = [s for s in sizes if s > size]
    if not below:
        return curve[above[0]] * size / above[0]
    if not above:
        return curve[below[-1]]
    lo, hi = below[-1], above[0]
    return curve[lo] + (curve[hi] - curve[lo]) * (size - lo) / (hi - lo)


@dataclass
class Candidate:
    """What the policy needs of one ready generation."""

    key: str
    group: tuple        # compatibility key: requests of one group share a forward
    remaining: int      # denoise steps left
    total: int          # denoise steps in all
    waited: float       # seconds since admission (the longer, the earlier it came: tie-breaks)

    @property
    def new(self) -> bool:
        """Not stepped yet: its first step is due now (time to first step)."""
        return self.remaining == self.total


def _candidate(state, now: float) -> Candidate:
    """What the policy needs of an engine.RequestState."""
    return Candidate(state.key, state.compat_key, state.total_steps - state.step_index, state.total_steps,
                     now - state.admitted_at)


def completions(remaining: list[int], slots: int, cost) -> tuple[float, float]:
    """(sum of completion times, time the last one completes), from now, of requests with
    `remaining` steps (in priority order), stepping the first `slots` unfinished ones per round at
    `cost(n)` seconds for n requests. Replays event by event (a finish), so it costs O(n^2), not
    O(steps)."""
    left = list(remaining)
    queue = list(range(len(left)))
    clock, total = 0.0, 0.0
    while queue:
        running = queue[:slots]
        rounds = min(left[i] for i in running)
        clock += rounds * cost(len(running))
        for i in running:
            left[i] -= rounds
        finished = [i for i in running if left[i] == 0]
        total += clock * len(finished)
        queue = [i for i in queue if left[i] > 0]
    return total, clock


def expected_latency_cost(remaining: list[int], slots: int, cost, arrivals_per_s: float = 0.0) -> float:
    """What stepping `slots` of a group's requests costs in summed latency: their completion
    times (`completions`), plus the wait of the requests expected to arrive while they run
    (`arrivals_per_s` x makespan of them, each waiting about half the makespan). Without the
    second term the choice sees only the requests present and steps one at a time whenever that
    finishes them a little sooner, although batching's throughput would shorten every later
    request's wait (CPU run with the H200's timings emulated, 2026-12-02)."""
    total, makespan = completions(remaining, slots, cost)
    return total + arrivals_per_s * makespan * makespan / 2


class ArrivalRate:
    """Requests and denoise steps arriving per second in each group over the last `window_s`
    seconds: the throughput that group must keep up with, and the arrivals a batch's makespan
    delays. From the n arrivals in the window: all but the oldest (their count, their steps) over
    the time since the oldest (unbiased for Poisson arrivals; a burst, many at once, reads as a
    high rate, which asks for the most throughput; a quiet spell lowers it)."""

    def __init__(self, window_s: float = 30.0):
        self.window_s = window_s
        self.arrivals: dict[tuple, deque[tuple[float, int]]] = {}

    def add(self, group: tuple, at: float, steps: int) -> None:
        self.arrivals.setdefault(group, deque()).append((at, steps))

    def per_second(self, now: float) -> dict[tuple, tuple[float, float]]:
        """(requests, denoise steps) arriving per second, per group."""
        rates = {}
        for group, window in self.arrivals.items():
            while window and window[0][0] < now - self.window_s:
                window.popleft()
            if len(window) < 2:
                rates[group] = (0.0, 0.0)
                continue
            span = now - window[0][0]
            steps = sum(steps for _, steps in window) - window[0][1]
            rates[group] = ((len(window) - 1) / span, steps / span) if span > 0 else (float("inf"), float("inf"))
        return rates


@dataclass(frozen=True)
class CostPolicy:
    throughput_floor: float = 0.95
    max_slowdown: float = 2.0
    target_utilisation: float = 0.8

    def needed(self, rates: dict[tuple, float], model: CostModel) -> dict[tuple, float]:
        """Requests-steps per second each group must run at to serve its arriving steps (`rates`) at
        `target_utilisation` of the time the other groups leave it, running at their best. Past
        that, batching more only stretches the rows already running: a latency cost with no
        throughput the load needs (H200 1024px, 2026-12-02: a fixed floor of 0.9 x the best
        throughput made `cost` batch two requests, at 1.74x one's forward, at ~0.5 load)."""
        busy = {g: rate / best for g, rate in rates.items() if (best := model.best_throughput(g))}
        need = {}
        for group, rate in rates.items():
            free = 1.0 - sum(share for other, share in busy.items() if other != group)
            need[group] = rate / (self.target_utilisation * free) if free > 0 else float("inf")
        return need

    def stretch(self, c: Candidate, model: CostModel) -> float:
        """Time in dit over its estimated time alone (0 for a group not measured yet)."""
        alone = model.estimate(c.group, 1)
        return c.waited / (c.total * alone) if alone else 0.0

    def overdue(self, c: Candidate, model: CostModel) -> bool:
        """In dit for longer than `max_slowdown` x its estimated time alone (the stretch bound)."""
        return self.stretch(c, model) > self.max_slowdown

    def order(self, candidates: list[Candidate], model: CostModel) -> list[Candidate]:
        """Overdue requests first, the most stretched first; then fewest remaining steps, ties by arrival."""
        def rank(c: Candidate) -> tuple:
            if self.overdue(c, model):
                return (0, -self.stretch(c, model), 0, c.key)
            return (1, c.remaining, -c.waited, c.key)
        return sorted(candidates, key=rank)

    def slots(self, members: list[Candidate], cost, need: float = float("inf"), arrivals_per_s: float = 0.0) -> int:
        """How many of one group's `members` step this round; `cost(n)` -> seconds or None; `need`:
        the requests-steps per second the load asks of this group (`needed`); `arrivals_per_s`:
        requests arriving in it per second. Sized on the group's work in SRPT order (who fills the
        slots is `order`'s business): sized on an order with overdue requests first, more slots
        would only serve to run SRPT's choice beside them, which is processor sharing."""
        n = len(members)
        if n == 0 or cost(1) is None:
            return n   # nothing measured for this group yet: step all, which measures it
        throughput = {k: k / cost(k) for k in range(1, n + 1)}
        best = max(throughput.values())
        allowed = [k for k, t in throughput.items() if t >= min(need, self.throughput_floor * best)]
        remaining = sorted(c.remaining for c in members)
        return min(allowed, key=lambda k: (expected_latency_cost(remaining, k, cost, arrivals_per_s), -k))

    def apart(self, chosen: list[Candidate], model: CostModel) -> set[str]:
        """Keys of the chosen first steps that run in a forward of their own, apart from the
        running requests of their group: where that forward and the running rows' cost at most
        1 / `throughput_floor` x the group's forward of all of them (the running rows then lose
        at most what the floor allows; the newcomers' progress waits for their own rows only).
        Nothing is split in a group whose sizes are not measured yet."""
        groups: dict[tuple, list[Candidate]] = {}
        for candidate in chosen:
            groups.setdefault(candidate.group, []).append(candidate)
        keys: set[str] = set()
        for group, members in groups.items():
            new = [c.key for c in members if c.new]
            if not new or len(new) == len(members):
                continue
            together, alone, rest = (model.estimate(group, n) for n in (len(members), len(new), len(members) - len(new)))
            if None not in (together, alone, rest) and together >= self.throughput_floor * (alone + rest):
                keys.update(new)
        return keys

    def choose(self, candidates: list[Candidate], model: CostModel,
               rates: dict[tuple, tuple[float, float]] | None = None) -> set[str]:
        """Keys to step now; the rest wait a round. `rates`: each group's arriving (requests, steps)
        per second (ArrivalRate.per_second); without them every group must run near its best
        throughput and no arrivals are expected."""
        rates = rates or {}
        need = self.needed({g: steps for g, (_, steps) in rates.items()}, model) if rates else {}
        groups: dict[tuple, list[Candidate]] = {}
        for candidate in candidates:
            groups.setdefault(candidate.group, []).append(candidate)
        chosen: set[str] = set()
        urgency: dict[tuple, tuple] = {}   # measured group -> its rank (the lowest one steps)
        plans: dict[tuple, list[Candidate]] = {}   # group -> the members it steps if it steps
        for group, members in groups.items():
            cost = lambda size, group=group: model.estimate(group, size)  # noqa: E731
            ordered = self.order(members, model)
            plans[group] = ordered[:self.slots(members, cost, need.get(group, float("inf")),
                                               rates.get(group, (0.0, 0.0))[0])]
            if cost(1) is None:
                chosen.update(c.key for c in members)     # unmeasured: step all once, which measures it
                continue
            late = [-self.stretch(c, model) for c in members if self.overdue(c, model)]
            urgency[group] = ((0, min(late)) if late else
                              (1, min(c.remaining for c in members) * cost(len(plans[group])),
                               -max(c.waited for c in members)))
        if urgency:
            chosen.update(c.key for c in plans[min(urgency, key=urgency.get)])
        chosen.update(c.key for c in candidates if c.new)
        return chosen


def profile_sizes(capacity: int) -> list[int]:
    """The batch sizes the profile times: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (each doubling and the
    point halfway to the next) and `capacity`. On the H200's at-load curves of sessions 31-33
    (every size of 1..16 timed) the line between these is within 11 % of every size, and `cost`
    chose the same requests from the line in 89-100 % of random ready sets, where 1, 2, 4, 8, 16
    alone gave 84-100 % (perf/results/2026-12-04-cpu-profile-sizes.md). It times 52
    request-forwards a sweep at capacity 16, not 136: a 6-group profile took 27.5 s instead of
    64.0 on the CPU host's H200 emulation. A size in between meets its first forward (which
    allocates and picks kernels) while serving."""
    sizes, size = {capacity}, 1
    while size < capacity:
        sizes.update({size, size + size // 2})   # 1 + 0 = 1: no midpoint below 2
        size *= 2
    return sorted(s for s in sizes if s <= capacity)


class StepScheduler:
    """The stage's scheduler: the policy and its cost model."""

    def __init__(self, kind: str = "all", throughput_floor: float = CostPolicy.throughput_floor,
                 cost_ewma: float = 0.3, max_slowdown: float = CostPolicy.max_slowdown,
                 target_utilisation: float = CostPolicy.target_utilisation):
        self.kind = kind
        self.policy = CostPolicy(throughput_floor, max_slowdown, target_utilisation)
        self.model = CostModel(cost_ewma)
        self.arrivals = ArrivalRate()

    def select(self, states: list, now: float | None = None) -> set[str]:
        """Keys of the `states` (engine.RequestState, all with steps left) to step this round;
        `now` on the clock of their `admitted_at` (time.monotonic() unless given)."""
        if self.kind == "all":
            return {s.key for s in states}
        self.model.resolve()
        now = time.monotonic() if now is None else now
        candidates = [_candidate(s, now) for s in states]
        for c in candidates:
            if c.new:   # not stepped yet: seen here once, as the first step is always taken at once
                self.arrivals.add(c.group, now - c.waited, c.total)
        return self.policy.choose(candidates, self.model, self.arrivals.per_second(now))

    def apart(self, states: list) -> set[str]:
        """Keys of the `states` chosen to step (engine.RequestState) whose first step runs in a
        forward of its own (CostPolicy.apart); none with `all`. Called before every step: a step
        without a newcomer (nearly all of them) returns before building candidates."""
        if self.kind == "all" or all(s.step_index > 0 for s in states):
            return set()
        return self.policy.apart([_candidate(s, 0.0) for s in states], self.model)

    def measure(self, time_forward: Callable[[list], float], states: list, capacity: int,
                max_sweeps: int = 4, agree: float = 0.1) -> None:
        """Profile the cost curve at load: forwards of `profile_sizes(capacity)` copies of each of
        `states` (engine.RequestState, one per shape), one untimed (a new batch size's first
        forward allocates and picks kernels: 150 ms against 108 for the next size on the H200),
        then the whole curve timed again and again, each size keeping its fastest, until a sweep is
        no more than `agree` faster than the fastest so far at every size (at least two sweeps, at
        most `max_sweeps`). Sizes between the profiled ones are linear between them. The other
        stages load beside dit and share its GPU: a graphed T5 captures for ~4 s, which on the H200
        slowed a single 512px sweep's small sizes ~2x (perf/results/2026-12-04-h200-s30). Spikes
        left are cut by the curve's monotone envelope (CostModel.profile). Forwards timed under
        load are lengthened by the other stages' GPU work, all sizes alike: the live timings then
        set the curve's level, not its shape (CostModel), and no size is guessed before it is tried."""
        if self.kind != "cost":
            return
        sizes = profile_sizes(capacity)
        for state in states:
            for size in sizes:
                time_forward([state] * size)
            curve = {size: time_forward([state] * size) for size in sizes}
            for _ in range(max_sweeps - 1):
                sweep = {size: time_forward([state] * size) for size in sizes}
                settled = all(sweep[size] * (1 + agree) >= curve[size] for size in sizes)   # no faster
                curve = {size: min(curve[size], sweep[size]) for size in sizes}
                if settled:
                    break
            self.model.profile(state.compat_key, curve)

    def step_seconds(self, timings: list[tuple[tuple, int, ForwardTimer]]) -> float | None:
        """The estimated device time of a step's forwards (engine.StepReport.timings), or None while
        one of them is unmeasured or the scheduler learns no curve (`all`)."""
        if self.kind != "cost":
            return None
        self.model.resolve()
        estimates = [self.model.estimate(group, size) for group, size, _ in timings]
        return None if None in estimates else sum(estimates)

    def observe(self, timings: list[tuple[tuple, int, ForwardTimer]]) -> None:
        """The forwards a step ran: (compatibility key, requests, timer)."""
        if self.kind == "cost":
            for timing in timings:
                self.model.add_timer(*timing)
