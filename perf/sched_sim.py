"""Discrete-event simulation of dit's step scheduling: evidence for a scheduler before GPU time.

Replays a trace (the H200 matched control's, from its JSON, and seeded Poisson traces drawn
with loadgen.make_trace) through dit's execute loop under four policies, calling the REAL
scheduler classes for every decision (ditserve.scheduler.StepScheduler; the previous `cost`
policy is the same module loaded from a git revision, `--old-ref`):

  request_batch  a batch of ready requests runs to completion; arrivals wait for it to end
                 (dit's `request_batch` mode: every request of the batch steps every round)
  step:all       every ready request steps every execute (processor sharing across groups)
  step:cost-old  `cost` as of --old-ref: k chosen within each group, every group steps
  step:cost      `cost` of this checkout: it also chooses which groups step
  step:cost-old@load, step:cost@load  the same with their cost curve measured at load (--measure-at-load SIZES: forwards
                 of 1..capacity requests of those sizes' shapes, uncontended, i.e. without
                 --slowdown and noise), as dit does for its [accel] warm sizes

Model of the server (assumptions; the numbers come from the control JSON):
- A shape (size, CFG on/off) costs `fixed + steps x step` alone, fitted from the measured solo
  latencies of its 4- and 30-step requests (of --solo-mode's server): step = (solo30 - solo4)/26,
  fixed = solo4 - 4 step. Fixed overhead (encode, hops, decode) depends on the size only, so a
  shape measured at one step count takes its size's other shape's fixed and step = (solo - fixed)/steps.
- Of `fixed`, --pre-ms comes before dit (encode and hop: 46-49 ms measured), the rest after
  (decode). text_encoder and vae_decode never queue.
- An execute costs --overhead-ms plus the sum of its groups' forwards (back to back on one GPU);
  a group forward of k requests costs (step - overhead) x f(k): --batching none, f(k) = k (no
  batching gain, conservative), or curve, f from DESIGN.md's H200 forward costs per rows (512px
  curve for <= 512px, the 1024px curve above; rows = k x 2 with CFG; never below 1).
- Under load a forward costs --slowdown x the solo fit (default: the control's request_batch
  run, its dit step time over the fit's for the same steps: 1.47; the GPU also runs encode and
  decode then). With it the simulated step:all reproduces the measured `step` run (p50 1251 vs
  1261 ms, p99 5581 vs 6182, mean 2025 vs 2100, TTFS p50 162 vs 191) but request_batch comes
  out slower than measured (p99 6529 vs 4562, mean 2367 vs 1797): trust the comparisons among
  the step policies more than those against request_batch.
- --timing-noise sigma: the forward times the scheduler observes are lengthened by a random
  exp(|N(0, sigma)|) (text_encoder and vae_decode share the GPU as other processes; their kernels
  only ever lengthen a timed forward); the simulated clock keeps the true times.
- Triton hands dit at most --capacity generations (FIFO); others wait. New generations join at
  the next execute. An execute runs its groups with a first step first; its first and last steps
  are reported when the last group holding one has run (engine.py's checks, one per group). The
  `cost` scheduler has learned each shape's forward at size 1 before the trace (the matched
  control's solo phase does that; simulated here the same way).
- When a newcomer can join (--queue): `late` (the default, and the model of every run before
  session 37) lets one ready by the end of a round join the next, as `[engine] late_queue_ms`
  would with no margin; `ahead` models dit as it queues by default: it decides each round when
  the round before starts, so a newcomer joins the first round decided after it is ready, or
  the next one if its public model announced it --encode-ms before that decision and it was ready
  before the running round ended (the hold, docs/scheduler.md). --late-queue adds a row: step:cost
  with the late queue (`late`, less --late-margin-ms) while the other policies keep --queue.
- Blind spot: every ready generation is in every execute here, so a newcomer always meets the
  running ones; on a real server Triton seldom hands dit a newcomer in the same execute as a
  running generation (perf/results/2026-12-03-cpu-h200-linear-s23.md). Rules about first steps
  need a real-server check (perf/matched_control.py on an emulated deployment).

Run:  .venv/bin/python perf/sched_sim.py --synthetic 1024-only:1024:0.8 --out /tmp/sim   (see --help;
the command of each recorded run is at the top of its .md)
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "perf"), str(ROOT / "backends")]
import loadgen  # noqa: E402
from ditserve import scheduler as current_scheduler  # noqa: E402

# The H200 matched controls of 2026-12-02: request_batch vs step:cost, then step vs step:cost (one trace).
CONTROLS = ["perf/results/2026-12-02-h200-scheduler-s11/call1-request_batch-vs-step-cost.json",
            "perf/results/2026-12-02-h200-scheduler-s11/call2-step-vs-step-cost.json"]
# H200 PixArt-Sigma transformer forward, eager, ms per rows (DESIGN.md, facts of 2026-12-01).
FORWARD_MS = {512: {1: 46, 2: 39, 4: 43, 8: 52, 16: 60, 32: 113}, 1024: {1: 46, 2: 47, 4: 75, 8: 146, 16: 289}}
# The 1024px CFG curve dit profiled at load on the H200, eager, 2026-12-03 (rows = 2 x requests; the
# 1-row point is the no-CFG profile's): nearly linear, 16 requests give 1.11x one's throughput.
H200_1024_PROFILE = {1: 37.6, 2: 49.9, 4: 96.4, 6: 139.1, 8: 182.9, 16: 362.0, 32: 717.6}
CURVES_1024 = {"design": FORWARD_MS[1024], "h200-profile": H200_1024_PROFILE}   # --curve-1024
POLICIES = ("request_batch", "step:all", "step:cost-old", "step:cost")


@dataclass(frozen=True)
class Shape:
    height: int
    width: int
    cfg: bool


@dataclass
class Cost:
    step_s: float
    fixed_s: float


def shape_of(entry: dict) -> Shape:
    return Shape(entry["height"], entry["width"], entry["guidance_scale"] > 1.0)


def fit_costs(solo_ms: dict[str, float], default_fixed_s: float) -> dict[Shape, Cost]:
    """Per-shape step and fixed seconds from solo latencies keyed like '1024x1024-30steps-cfg';
    a size measured at one step count only takes `default_fixed_s`."""
    by_shape: dict[Shape, dict[int, float]] = defaultdict(dict)
    for key, ms in solo_ms.items():
        h, w, steps, cfg = re.fullmatch(r"(\d+)x(\d+)-(\d+)steps-(cfg|nocfg)", key).groups()
        by_shape[Shape(int(h), int(w), cfg == "cfg")][int(steps)] = ms / 1000.0
    costs, fixed_of_size = {}, {}
    for shape, solo in by_shape.items():
        if len(solo) >= 2:
            (s1, t1), (s2, t2) = sorted(solo.items())[:2]
            step = (t2 - t1) / (s2 - s1)
            costs[shape] = Cost(step, t1 - s1 * step)
            fixed_of_size[shape.height, shape.width] = costs[shape].fixed_s
    for shape, solo in by_shape.items():
        if shape not in costs:
            (steps, seconds), = solo.items()
            fixed = fixed_of_size.get((shape.height, shape.width), default_fixed_s)
            costs[shape] = Cost((seconds - fixed) / steps, fixed)
    return costs


def batch_factor(shape: Shape, k: int, batching: str) -> float:
    """Forward cost of k requests of `shape` relative to one."""
    if batching == "none":
        return float(k)
    curve = FORWARD_MS[512 if max(shape.height, shape.width) <= 512 else 1024]
    rows = lambda n: n * (2 if shape.cfg else 1)  # noqa: E731
    return max(1.0, float(np.interp(rows(k), list(curve), list(curve.values())) /
                    np.interp(rows(1), list(curve), list(curve.values()))))


@dataclass
class SimRequest:
    """What StepScheduler reads of an engine RequestState, plus the simulation's clock marks."""

    key: str
    arrival: float
    shape: Shape
    total_steps: int
    ready_at: float
    step_index: int = 0
    first_step_at: float | None = None
    done_at: float | None = None

    @property
    def compat_key(self) -> tuple:
        return (self.shape.height, self.shape.width, self.shape.cfg)

    @property
    def admitted_at(self) -> float:
        return self.ready_at


class SimTimer:
    """A ForwardTimer whose forward took a known time."""

    def __init__(self, seconds: float):
        self._seconds = seconds

    def seconds(self) -> float:
        return self._seconds


@dataclass
class Sim:
    costs: dict[Shape, Cost]
    batching: str
    overhead_s: float
    pre_s: float
    capacity: int
    slowdown: float
    timing_noise: float = 0.0     # sigma of the slowdown on the forward times the scheduler sees (not the clock's)
    seed: int = 0
    queue: str = "late"           # when a newcomer can join a round (--queue: late | ahead)
    encode_s: float = 0.02        # `ahead`: how long before it is ready a newcomer is announced (the hold)
    late_margin_s: float = 0.0    # `late`: a newcomer ready this long before a round ends misses it
    forwards: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    def noise(self) -> float:
        """What the GPU's timer adds: another process's kernels (text_encoder, vae_decode) time-slice
        with the forward, so the scheduler sees its forwards slower by a random factor."""
        return float(np.exp(abs(self.rng.normal(0.0, self.timing_noise)))) if self.timing_noise else 1.0

    def forward_s(self, shape: Shape, k: int) -> float:
        return (self.costs[shape].step_s - self.overhead_s) * self.slowdown * batch_factor(shape, k, self.batching)

    def joins_by(self, clock: float, decided_at: float, idle: bool) -> float:
        """The latest ready time of a newcomer that joins the round starting at `clock`, which dit
        decided at `decided_at` (the start of the round before). An idle device decides at once."""
        if idle:
            return clock
        if self.queue == "late":
            return clock - self.late_margin_s
        return min(clock, decided_at + self.encode_s)   # decided before it was ready, unless held for it

    def run(self, entries: list[dict], scheduler, closed_batches: bool) -> list[SimRequest]:
        """Replay `entries`; `closed_batches`: admit only when dit is idle (request_batch)."""
        pending = sorted((SimRequest(f"r{i}", e["t"], shape_of(e), e["num_inference_steps"], e["t"] + self.pre_s)
                          for i, e in enumerate(entries)), key=lambda r: r.ready_at)
        done, active, clock, decided_at = [], [], 0.0, 0.0
        while pending or active:
            if not (closed_batches and active):
                joins_by = self.joins_by(clock, decided_at, idle=not active or closed_batches)
                while pending and pending[0].ready_at <= joins_by and len(active) < self.capacity:
                    active.append(pending.pop(0))
            if not active:
                clock = decided_at = pending[0].ready_at
                continue
            decided_at = clock   # `ahead`: dit decides the next round as this one starts
            picked = scheduler.select(active, clock)   # once a round: it counts the newcomers' arrivals
            chosen = [r for r in active if r.key in picked]
            # first steps the scheduler runs in forwards of their own (none before session 36)
            apart = scheduler.apart(chosen) if hasattr(scheduler, "apart") else set()
            groups: dict[tuple[Shape, bool], list[SimRequest]] = defaultdict(list)
            for r in sorted(chosen, key=lambda r: r.step_index > 0):   # groups with a first step go first (engine.py)
                groups[r.shape, r.key in apart].append(r)
            timings = [((s.height, s.width, s.cfg), len(rs), SimTimer(self.forward_s(s, len(rs))))
                       for (s, _), rs in groups.items()]
            # First and last steps are reported once the engine has read every check due at once,
            # each group's check after that group's forward; the GPU runs the rest of the execute on.
            ends = np.cumsum([t.seconds() for _, _, t in timings]) + clock + self.overhead_s
            clock = float(ends[-1]) if len(ends) else clock + self.overhead_s
            reported = max((float(end) for end, rs in zip(ends, groups.values())
                            if any(r.step_index in (0, r.total_steps - 1) for r in rs)), default=clock)
            scheduler.observe([(g, k, SimTimer(t.seconds() * self.noise())) for g, k, t in timings])
            self.forwards += [k for _, k, _ in timings]
            for r in chosen:
                r.step_index += 1
                r.first_step_at = reported if r.first_step_at is None else r.first_step_at
                if r.step_index == r.total_steps:
                    r.done_at = reported + self.costs[r.shape].fixed_s - self.pre_s
                    active.remove(r)
                    done.append(r)
        return done


def load_old_scheduler(ref: str):
    """ditserve/scheduler.py as of git revision `ref`, as its own module."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:backends/ditserve/scheduler.py"],
                            check=True, capture_output=True, text=True).stdout
    name = f"ditserve_scheduler_{ref}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    sys.modules[name] = module   # dataclasses look their module up by name
    exec(compile(source, f"{ref}:backends/ditserve/scheduler.py", "exec"), module.__dict__)
    return module


class EarlierScheduler:
    """An earlier StepScheduler whose `select` read no clock (before the time-based bound) or
    that kept skip counts to forget (before 2026-12-02's session 12)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.clock = "now" in inspect.signature(scheduler.select).parameters

    def select(self, states: list, now: float) -> set[str]:
        chosen = self.scheduler.select(states, now) if self.clock else self.scheduler.select(states)
        if hasattr(self.scheduler, "forget"):
            for state in states:
                if state.key in chosen and state.step_index + 1 == state.total_steps:
                    self.scheduler.forget(state.key)
        return chosen

    def __getattr__(self, name: str):
        return getattr(self.scheduler, name)


def measure_at_load(scheduler, sim: Sim, entries: list[dict], sizes: set[str],
                    inflation: dict[int, float] | None = None) -> None:
    """What dit does before READY (StepScheduler.measure): time 1..capacity requests
    (profile_sizes) of each shape of `sizes` in the trace while no request runs, so without the
    load's slowdown or noise; each size's time x `inflation[size]` (default 1) where the profile
    itself ran slow."""
    shapes = sorted({shape_of(e) for e in entries if f"{e['height']}x{e['width']}" in sizes},
                    key=lambda s: (s.height, s.width, s.cfg))
    inflation = inflation or {}
    scheduler.measure(lambda states: sim.forward_s(states[0].shape, len(states)) / sim.slowdown
                      * inflation.get(len(states), 1.0),
                      [SimRequest("measure", 0.0, shape, 1, 0.0) for shape in shapes], sim.capacity)


def make_scheduler(policy: str, old_module, options: dict):
    """`options`: the current `cost` scheduler's [engine] keys (max_slowdown, target_utilisation)."""
    if policy in ("request_batch", "step:all"):
        return current_scheduler.StepScheduler("all")
    if policy.startswith("step:cost-old"):
        return EarlierScheduler(old_module.StepScheduler("cost"))
    return current_scheduler.StepScheduler("cost", **options)


def stats(done: list[SimRequest], forwards: list[int]) -> dict:
    e2el = np.array([r.done_at - r.arrival for r in done]) * 1000
    ttfs = np.array([r.first_step_at - r.arrival for r in done]) * 1000
    span = max(r.done_at for r in done) - min(r.arrival for r in done)
    return {"p50_e2el_ms": float(np.percentile(e2el, 50)), "p99_e2el_ms": float(np.percentile(e2el, 99)),
            "mean_e2el_ms": float(e2el.mean()), "p50_ttfs_ms": float(np.percentile(ttfs, 50)),
            "mean_ttfs_ms": float(ttfs.mean()), "request_throughput": len(done) / span,
            "mean_step_batch_size": float(np.mean(forwards)), "forwards": len(forwards)}


def simulate(entries: list[dict], sim_args: dict, old_module, options: dict,
             measured_sizes: set[str] | None = None, inflation: dict[int, float] | None = None,
             late_queue: bool = False) -> dict:
    """Every policy on `entries`, each after a solo pass over the trace's shapes (as the control's);
    with `measured_sizes`, also step:cost with its curve measured at load for those sizes (slowed
    by `inflation`, see measure_at_load); with `late_queue`, also step:cost queued late."""
    results = {}
    solo_entries = {(shape_of(e), e["num_inference_steps"]): e for e in entries}
    extra = ("step:cost-old@load", "step:cost@load") * bool(measured_sizes) + ("step:cost+late_queue",) * late_queue
    for policy in POLICIES + extra:
        late = {"queue": "late"} if policy == "step:cost+late_queue" else {"late_margin_s": 0.0}
        sim, scheduler = Sim(**{**sim_args, **late}), make_scheduler(policy.partition("+")[0], old_module, options)
        if policy.endswith("@load"):
            measure_at_load(scheduler, sim, entries, measured_sizes, inflation)
        for entry in solo_entries.values():
            sim.run([{**entry, "t": 0.0}], scheduler, policy == "request_batch")
        sim.forwards = []
        results[policy] = stats(sim.run(entries, scheduler, policy == "request_batch"), sim.forwards)
    return results


def utilisation(entries: list[dict], costs: dict[Shape, Cost], slowdown: float) -> float:
    """Offered dit work per second with no batching gain, slowed as under load (1.0 = the
    saturation of one request at a time)."""
    work = slowdown * sum(e["num_inference_steps"] * costs[shape_of(e)].step_s for e in entries)
    return work / (entries[-1]["t"] - entries[0]["t"])


def measured_slowdown(report: dict, entries: list[dict], costs: dict[Shape, Cost]) -> float:
    """The dit's measured step time in a request_batch run (about one request per forward) over the
    solo fit's for the same steps: what sharing the GPU with encode and decode (and the host with
    the other stubs) adds under load."""
    fitted = sum(e["num_inference_steps"] * costs[shape_of(e)].step_s for e in entries)
    return report["step_batches"] * report["mean_step_duration_ms"] / 1000 / fitted


def synthetic(label: str, sizes: str, load: float, n: int, seed: int, costs: dict[Shape, Cost],
              slowdown: float, steps: str = "4,30", guidance: str = "1.0,4.5") -> tuple[str, list]:
    """A seeded Poisson trace of `sizes`, `steps` (default 4/30), CFG `guidance` (default on/off), at
    `load` x one-at-a-time saturation."""
    spec = loadgen.WorkloadSpec(rate=1.0, num_requests=n, sizes=loadgen.parse_sizes(sizes),
                                steps=[int(x) for x in steps.split(",")],
                                guidance_scales=[float(x) for x in guidance.split(",")], seed=seed)
    unit = loadgen.make_trace(spec)          # rate 1: scale the arrival times to the load asked for
    rate = load / utilisation(unit, costs, slowdown)
    entries = [{**e, "t": e["t"] / rate} for e in unit]
    return (f"{label}: Poisson {rate:.2f} req/s ({load:.2f} of saturation), n={n}, sizes {sizes}, "
            f"steps {steps}, guidance {guidance}, seed {seed}", entries)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--control", action="append", help="matched-control JSON(s); trace, solo and measured numbers "
                   f"from the first, measured numbers from the others (default {' '.join(CONTROLS)})")
    p.add_argument("--solo-mode", default="step:cost", help="whose solo latencies give the per-shape costs")
    p.add_argument("--old-ref", default="c96ef31", help="git revision of the previous `cost` policy")
    p.add_argument("--batching", default="curve", choices=("curve", "none"))
    p.add_argument("--curve-1024", default="design", choices=tuple(CURVES_1024),
                   help="the 1024px forward curve: DESIGN.md's (2026-12-01) or dit's H200 profile at load (2026-12-03)")
    p.add_argument("--overhead-ms", type=float, default=1.0, help="per execute (served 48.9 vs raw 47.8 ms/step)")
    p.add_argument("--pre-ms", type=float, default=50.0, help="encode and hop, before dit")
    p.add_argument("--fixed-ms", type=float, default=250.0,
                   help="encode, hops and decode of a size the control measured at one step count only "
                        "(1024px, 20 steps: solo 1233 ms - 20 x ~49 ms forwards)")
    p.add_argument("--capacity", type=int, default=16)
    p.add_argument("--max-slowdown", type=float, default=2.0, help="step:cost's [engine] max_slowdown")
    p.add_argument("--target-utilisation", type=float, default=0.8, help="step:cost's [engine] target_utilisation")
    p.add_argument("--slowdown", type=float, default=None,
                   help="dit forwards under load vs solo "
                        "(default: the control's request_batch dit step time / the fit's)")
    p.add_argument("--timing-noise", type=float, default=0.0,
                   help="sigma of the slowdown exp(|N(0, sigma)|) on the forward times the scheduler observes "
                        "(contention only lengthens them; the clock keeps the true ones)")
    p.add_argument("--synthetic", action="append", default=[], metavar="LABEL:SIZES:LOAD[:STEPS[:GUIDANCE]]",
                   help="also a Poisson trace, e.g. 512-only:512:0.8 (load = fraction of one-at-a-time saturation; "
                        "steps default 4,30, guidance 1.0,4.5), or uniform:1024:0.8:20:4.5")
    p.add_argument("--n", type=int, default=400, help="requests per synthetic trace")
    p.add_argument("--seed", type=int, default=22)
    p.add_argument("--measure-at-load", default="", metavar="SIZES",
                   help="also simulate step:cost with its curve measured at load for these sizes ('1024x1024,...'; "
                        "'all' = every size of the trace)")
    p.add_argument("--profile-inflation", default="", metavar="SIZE:FACTOR,...",
                   help="the profile at load ran slow at these sizes, e.g. 1:1.47,2:1.43,3:1.14,4:1.26 (the H200's "
                        "1024px CFG profile taken beside the T5 compile, session 22; other sizes 1.0)")
    p.add_argument("--queue", default="late", choices=("late", "ahead"),
                   help="when a newcomer can join a round (the docstring): late = by the round's end (every "
                        "run before session 37), ahead = dit's default read-ahead with the hold")
    p.add_argument("--encode-ms", type=float, default=20.0,
                   help="--queue ahead: a newcomer is announced this long before it is ready (its encode)")
    p.add_argument("--late-queue", action="store_true",
                   help="also step:cost queued late ([engine] late_queue_ms) while the others keep --queue")
    p.add_argument("--late-margin-ms", type=float, default=3.0,
                   help="--late-queue: a newcomer ready this long before a round ends misses it (the margin, the "
                        "host's queueing and, on a join, Triton's round trip and the admission)")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args(argv)
    FORWARD_MS[1024] = CURVES_1024[args.curve_1024]
    paths = args.control or CONTROLS
    controls = [json.loads((ROOT / path).read_text()) for path in paths]
    costs = fit_costs(controls[0]["reports"][args.solo_mode]["solo_latency_ms"], args.fixed_ms / 1000)
    trace = controls[0]["trace"]
    slowdown = args.slowdown or measured_slowdown(controls[0]["reports"]["request_batch"], trace, costs)
    sim_args = dict(costs=costs, batching=args.batching, overhead_s=args.overhead_ms / 1000,
                    pre_s=args.pre_ms / 1000, capacity=args.capacity, slowdown=slowdown,
                    timing_noise=args.timing_noise, seed=args.seed, queue=args.queue,
                    encode_s=args.encode_ms / 1000, late_margin_s=args.late_margin_ms / 1000)
    old = load_old_scheduler(args.old_ref)
    inflation = {int(size): float(factor) for size, factor in
                 (item.split(":") for item in filter(None, args.profile_inflation.split(",")))}
    options = dict(max_slowdown=args.max_slowdown, target_utilisation=args.target_utilisation)
    load = utilisation(trace, costs, slowdown)
    scenarios = [(f"H200 control trace: {controls[0]['source']} ({load:.2f} of saturation)", trace)]
    for spec in args.synthetic:
        label, sizes, load, *shape = spec.split(":")
        scenarios.append(synthetic(label, sizes, float(load), args.n, args.seed, costs, slowdown, *shape))
    measured = {f"{mode} ({Path(path).stem})": report
                for path, control in zip(paths, controls) for mode, report in control["reports"].items()}
    out = {"command": " ".join(shlex.quote(a) for a in ["python", "perf/sched_sim.py", *(argv or sys.argv[1:])]),
           "assumptions": {"slowdown": round(slowdown, 3), "batching": args.batching, "curve_1024": args.curve_1024,
                           "overhead_ms": args.overhead_ms, "pre_ms": args.pre_ms, "capacity": args.capacity,
                           "max_slowdown": args.max_slowdown, "target_utilisation": args.target_utilisation, "old_ref": args.old_ref, "solo_mode": args.solo_mode,
                           "measure_at_load": args.measure_at_load or None, "queue": args.queue,
                           "encode_ms": args.encode_ms, "late_queue": args.late_queue,
                           "late_margin_ms": args.late_margin_ms,
                           "profile_inflation": args.profile_inflation or None},
           "costs_ms": {f"{s.height}x{s.width}-{'cfg' if s.cfg else 'nocfg'}":
                        {"step": round(c.step_s * 1000, 1), "fixed": round(c.fixed_s * 1000, 1)}
                        for s, c in sorted(costs.items(), key=lambda kv: (kv[0].height, kv[0].cfg))},
           "measured": {mode: {k: r[k] for k in ("p50_e2el_ms", "p99_e2el_ms", "mean_e2el_ms", "p50_ttfs_ms",
                                                 "mean_ttfs_ms", "request_throughput", "mean_step_batch_size")}
                        for mode, r in measured.items()},
           "scenarios": []}
    for label, entries in scenarios:
        print(f"[sched_sim] {label}", file=sys.stderr, flush=True)
        sizes = ({f"{e['height']}x{e['width']}" for e in entries} if args.measure_at_load == "all"
                 else set(filter(None, args.measure_at_load.split(","))))
        out["scenarios"].append({"label": label, "results": simulate(entries, sim_args, old, options, sizes,
                                                                     inflation, args.late_queue)})
    text = render(out)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(out, indent=1))
        Path(args.out + ".md").write_text(text)
    return 0


def render(out: dict) -> str:
    cols = ("p50_e2el_ms", "p99_e2el_ms", "mean_e2el_ms", "p50_ttfs_ms", "mean_ttfs_ms", "request_throughput",
            "mean_step_batch_size")
    head = "| policy | p50 ms | p99 ms | mean ms | TTFS p50 | TTFS mean | req/s | mean step batch |\n" + \
           "|---|---|---|---|---|---|---|---|\n"
    row = lambda name, r: f"| {name} | " + " | ".join(  # noqa: E731
        f"{r[c]:.2f}" if c in ("request_throughput", "mean_step_batch_size") else f"{r[c]:.0f}" for c in cols) + " |\n"
    text = "# The step scheduler, simulated (perf/sched_sim.py; its docstring states the model)\n\n" \
           f"`{out['command']}`\n\nAssumptions: {json.dumps(out['assumptions'])}; per-shape costs (ms): " \
           f"{json.dumps(out['costs_ms'])}\n\n### Measured on the H200 (the control JSONs)\n\n" + head
    text += "".join(row(mode, r) for mode, r in out["measured"].items())
    for scenario in out["scenarios"]:
        text += f"\n### Simulated: {scenario['label']}\n\n" + head
        text += "".join(row(policy, r) for policy, r in scenario["results"].items())
    return text


if __name__ == "__main__":
    sys.exit(main())
