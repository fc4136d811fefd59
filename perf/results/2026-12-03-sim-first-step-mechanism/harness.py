"""Shared set-up for the first-step probes: the probe's sim model (perf/sched_sim.py, H200 1024px
profile, timing noise 0.4, 400 requests), run with a monkeypatched CostPolicy.choose, recording
per-request marks and per-round (clock, active, chosen) logs. Run from /work/main."""
import json
import sys

sys.path[:0] = ["perf", "backends"]
import sched_sim as S  # noqa: E402
from ditserve import scheduler as sch  # noqa: E402

S.FORWARD_MS[1024] = S.H200_1024_PROFILE
controls = [json.loads((S.ROOT / p).read_text()) for p in S.CONTROLS]
costs = S.fit_costs(controls[0]["reports"]["step:cost"]["solo_latency_ms"], 0.25)
slowdown = S.measured_slowdown(controls[0]["reports"]["request_batch"], controls[0]["trace"], costs)
RULE = sch.CostPolicy.choose


def sim_args(seed):
    return dict(costs=costs, batching="curve", overhead_s=0.001, pre_s=0.05, capacity=16, slowdown=slowdown,
                timing_noise=0.4, seed=seed)


def trace(spec, seed, n=400):
    label, sizes, load, *shape = spec.split(":")
    return S.synthetic(label, sizes, float(load), n, seed, costs, slowdown, *shape)


class Logger:
    """Wraps a StepScheduler: logs every select (clock, {key: remaining}, chosen)."""

    def __init__(self, scheduler):
        self.scheduler, self.rounds, self.on = scheduler, [], False

    def select(self, states, now):
        chosen = self.scheduler.select(states, now)
        if self.on:
            self.rounds.append((now, {s.key: s.total_steps - s.step_index for s in states}, set(chosen)))
        return chosen

    def __getattr__(self, name):
        return getattr(self.scheduler, name)


def run(entries, seed, policy=None, closed=False, log=False):
    """policy: a choose(self, candidates, model, rates) function (None: request_batch when closed)."""
    sim = S.Sim(**sim_args(seed))
    scheduler = sch.StepScheduler("all") if closed else sch.StepScheduler("cost")
    if not closed:
        S.measure_at_load(scheduler, sim, entries, {f"{e['height']}x{e['width']}" for e in entries})
        sch.CostPolicy.choose = policy
    logger = Logger(scheduler)
    try:
        for e in {(S.shape_of(e), e["num_inference_steps"]): e for e in entries}.values():
            sim.run([{**e, "t": 0.0}], logger, closed)
        sim.forwards = []
        logger.on = log
        done = sim.run(entries, logger, closed)
    finally:
        sch.CostPolicy.choose = RULE
    return S.stats(done, sim.forwards), done, logger.rounds, sim


def without(self, candidates, model, rates=None):
    """The probe's `without`: drop new requests from a round in which a running one steps."""
    chosen = RULE(self, candidates, model, rates)
    running = {c.key for c in candidates if c.key in chosen and not c.new}
    return running or chosen


ORIG_SELECT = sch.StepScheduler.select


def select_once(self, states, now=None):
    """StepScheduler.select, but each request's arrival registered once (by key) in ArrivalRate: the
    current select adds a candidate every round it is `new`, right only while the first step is always
    taken at once. Pruned after the rate's window (a re-add then falls outside the window at once)."""
    if self.kind == "all":
        return {s.key for s in states}
    self.model.resolve()
    now = __import__("time").monotonic() if now is None else now
    seen = self.__dict__.setdefault("seen", {})
    candidates = [sch.Candidate(s.key, s.compat_key, s.total_steps - s.step_index, s.total_steps, now - s.admitted_at)
                  for s in states]
    for c in candidates:
        if c.new and c.key not in seen:
            seen[c.key] = now - c.waited
            self.arrivals.add(c.group, now - c.waited, c.total)
    for key in [k for k, at in seen.items() if at < now - self.arrivals.window_s]:
        del seen[key]
    return self.policy.choose(candidates, self.model, self.arrivals.per_second(now))


def dedupe(on=True):
    sch.StepScheduler.select = select_once if on else ORIG_SELECT
