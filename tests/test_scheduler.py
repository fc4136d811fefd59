"""The step scheduler's policy (ditserve/scheduler.py) on given cost curves: pure logic, no Triton."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch

from conftest import ROOT
from ditserve.deployment import load_deployment
from ditserve.scheduler import (ArrivalRate, Candidate, CostModel, CostPolicy, ForwardTimer, StepScheduler,
                                completions, expected_latency_cost, profile_sizes)

GROUP = ("64x64", True)
# H200 PixArt-Sigma forward times (DESIGN.md, 2026-12-01) in requests with CFG (2 rows each), seconds.
CHEAP_512 = {1: 0.039, 2: 0.043, 4: 0.052, 8: 0.060}
DEAR_1024 = {1: 0.047, 2: 0.075, 4: 0.146, 8: 0.289}
# The H200's 1024px CFG profile at load, eager, 2026-12-03 (perf/results/2026-12-03-h200-s20/): nearly linear.
H200_1024_LINEAR = {1: 0.0499, 2: 0.0964, 3: 0.1391, 4: 0.1829, 5: 0.2277, 8: 0.3620, 16: 0.7176}


def model_of(curve: dict[int, float], group: tuple = GROUP) -> CostModel:
    model = CostModel()
    for size, seconds in curve.items():
        model.observe(group, size, seconds)
    return model


def candidates(remaining: list[int], waited: list[float] | None = None, group: tuple = GROUP,
               total: int = 40) -> list[Candidate]:
    """Requests that have stepped already (`total` steps in all), in arrival order (r0 first: it
    has waited a millisecond longer than r1), not overdue unless `waited` says."""
    waited = waited or [0.001 * (len(remaining) - i) for i in range(len(remaining))]
    return [Candidate(f"r{i}", group, steps, total, wait) for i, (steps, wait) in enumerate(zip(remaining, waited))]


def test_cost_model_interpolates_and_is_optimistic_where_it_has_not_measured():
    model = model_of({2: 0.1, 4: 0.3})
    assert model.estimate(GROUP, 3) == pytest.approx(0.2)
    assert model.estimate(GROUP, 8) == pytest.approx(0.3), "above the largest measured size: tried as free"
    assert model.estimate(GROUP, 1) == pytest.approx(0.05), "below the smallest: proportional (no batching gain)"
    assert model.estimate(("other",), 1) is None
    model.observe(GROUP, 2, 0.05)
    assert model.estimate(GROUP, 2) == pytest.approx(0.7 * 0.1 + 0.3 * 0.05), "a faster forward: weight 0.3"
    model.observe(GROUP, 2, 0.185)
    assert model.estimate(GROUP, 2) == pytest.approx(0.085 + 0.03 * 0.1), "a slower one: a tenth of that"


def test_contention_that_only_lengthens_forwards_does_not_make_batches_look_cheap():
    """Forwards of 1 and 2 requests cost 1x and 2x (no batching gain); each timing is lengthened
    at random, as another stage's kernels on the GPU do. The estimates stay near the true costs'
    ratio: two requests seldom look more than 10 % cheaper than twice one (a mean of the timings
    did in 76 of 280 rounds with this seed). The spread left is why the default floor (0.95) leans
    on the profile at load, which fixes the ratio of the warm shapes' sizes."""
    rng = random.Random(0)
    model, cheap = CostModel(), 0
    for round_ in range(300):
        for size in (1, 2):
            model.observe(GROUP, size, 0.05 * size * math.exp(abs(rng.gauss(0, 0.4))))
        cheap += round_ >= 20 and model.estimate(GROUP, 2) < 0.9 * 2 * model.estimate(GROUP, 1)
    assert cheap <= 0.08 * 280, f"two looked >10 % cheaper than twice one in {cheap} of 280 rounds"


def test_cpu_forward_timer_feeds_the_model_once_resolved():
    scheduler = StepScheduler("cost")
    timer = ForwardTimer(torch.device("cpu"))
    timer.stop()
    scheduler.observe([(GROUP, 3, timer)])
    scheduler.model.resolve()
    assert 0 <= scheduler.model.estimate(GROUP, 3) < 1 and not scheduler.model.pending


def test_measure_at_load_seeds_each_shape_for_every_size_up_to_capacity():
    """`cost` times 1..capacity copies of each shape's state after one untimed forward of each
    size, and then needs no guess: with batching that gains nothing it steps one request from the
    first round (unseeded, a size above the largest measured one looks free and gets tried).
    The curve is timed until a sweep is no faster than the last, each size keeping its fastest:
    a first sweep slowed by another stage warming on the same GPU does not set it."""
    @dataclass
    class Shape:
        compat_key: tuple
    timed = []

    def time_forward(states: list) -> float:
        """50 ms per request; a size's first forward 100 ms slower; the first sweep (its second
        forward) of the small sizes twice as slow, as a T5 capturing beside it made them."""
        timed.append((states[0].compat_key, len(states)))
        nth = timed.count(timed[-1])
        return 0.05 * len(states) * (2 if nth == 2 and len(states) < 3 else 1) + 0.1 * (nth == 1)

    scheduler = StepScheduler("cost")
    scheduler.measure(time_forward, [Shape(GROUP), Shape(("64x64", False))], capacity=3)
    assert sorted(set(timed)) == sorted((key, n) for key in (GROUP, ("64x64", False)) for n in (1, 2, 3))
    assert len(timed) == 24, "one untimed forward of each, and three sweeps: slow, faster, no faster"
    assert [scheduler.model.estimate(GROUP, n) for n in (1, 2, 3)] == pytest.approx([0.05, 0.1, 0.15])
    assert scheduler.policy.choose(candidates([10, 10]), scheduler.model) == {"r0"}
    unseeded = model_of({1: 0.05})
    assert CostPolicy().choose(candidates([10, 10]), unseeded) == {"r0", "r1"}, "size 2 tried once, unseeded"
    scheduler = StepScheduler("all")
    scheduler.measure(time_forward, [Shape(GROUP)], capacity=3)
    assert len(timed) == 24 and not scheduler.model.curves, "`all` measures nothing"


def test_the_profile_times_doublings_and_their_midpoints_and_is_linear_between_them():
    """At capacity 16 the profile times 1, 2, 3, 4, 6, 8, 12, 16 (a size the others leave out is
    interpolated: on the H200's curves within 11 % of its own timing)."""
    @dataclass
    class Shape:
        compat_key: tuple
    timed = []

    def time_forward(states: list) -> float:   # 20 ms flat up to 4 requests, then 10 ms more each
        timed.append(len(states))
        return 0.02 + 0.01 * max(0, len(states) - 4)

    scheduler = StepScheduler("cost")
    scheduler.measure(time_forward, [Shape(GROUP)], capacity=16)
    assert sorted(set(timed)) == profile_sizes(16) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert scheduler.model.estimate(GROUP, 5) == pytest.approx(0.03)    # halfway between 4 and 6
    assert scheduler.model.estimate(GROUP, 10) == pytest.approx(0.08)   # and between 8 and 12
    assert profile_sizes(1) == [1] and profile_sizes(3) == [1, 2, 3]
    assert profile_sizes(20) == [1, 2, 3, 4, 6, 8, 12, 16, 20], "the capacity is always timed"


@pytest.mark.parametrize("slowdowns, sweeps", [
    ([1.0, 1.0], 2),                   # nothing else on the GPU: two sweeps agree
    ([1.05, 1.0], 2),                  # within 10 %: noise, not contention
    ([2.0, 1.5, 1.0, 1.0], 4),         # contention fading over three sweeps
    ([2.0, 2.0], 2),                   # contention through both sweeps: not told apart
    ([3.0, 2.0, 1.5, 1.2, 1.0], 4),    # at most four sweeps
])
def test_the_profile_sweeps_until_it_stops_getting_faster(slowdowns, sweeps):
    @dataclass
    class Shape:
        compat_key: tuple
    timed = []

    def time_forward(states: list) -> float:   # 50 ms per request, each sweep slowed by its factor
        timed.append(len(states))
        nth = timed.count(len(states)) - 2   # 0: the first timed sweep (-1: the untimed forward)
        return 0.05 * len(states) * (slowdowns[min(nth, len(slowdowns) - 1)] if nth >= 0 else 3.0)

    scheduler = StepScheduler("cost")
    scheduler.measure(time_forward, [Shape(GROUP)], capacity=3)
    assert len(timed) == 3 * (1 + sweeps)
    fastest = min(slowdowns[:sweeps])
    estimates = [scheduler.model.estimate(GROUP, n) for n in (1, 2, 3)]
    assert estimates == pytest.approx([0.05 * fastest * n for n in (1, 2, 3)])


def test_a_profiled_group_learns_one_level_for_every_size():
    """Load lengthens all sizes alike: timings of size 1 alone raise size 2's estimate by the same
    factor, so a size seldom run never looks cheaper than the profile says."""
    model = CostModel()
    model.profile(GROUP, {1: 0.05, 2: 0.10, 4: 0.20})
    for _ in range(200):
        model.observe(GROUP, 1, 0.075)            # every live forward 1.5x its profile
    assert model.estimate(GROUP, 1) == pytest.approx(0.075, rel=0.01)
    assert model.estimate(GROUP, 2) / model.estimate(GROUP, 1) == pytest.approx(2.0)
    assert model.estimate(GROUP, 3) / model.estimate(GROUP, 1) == pytest.approx(3.0), "between sizes: linear"
    assert "x1.50" in model.describe()
    rng = random.Random(0)
    batched = 0
    for round_ in range(300):                     # contention noise on the size run most: still one at a time
        model.observe(GROUP, 1, 0.05 * math.exp(abs(rng.gauss(0, 0.4))))
        batched += CostPolicy().choose(candidates([10, 10]), model) != {"r0"}
    assert batched == 0


def test_a_profile_slower_than_the_served_forwards_is_corrected_size_by_size():
    """The H200's 1024px CFG profile of session 22 ran while the other stages compiled: 1 request at
    76 ms against 51.5 served, 16 at 728 ms as served (725). Served forwards of 1 (and 2) requests
    correct those sizes; the others keep their profile until they are served, so 16 requests never
    look 1.5x cheaper than they run."""
    at_load = {1: 0.0759, 2: 0.1363, 3: 0.1579, 4: 0.2278, 8: 0.3662, 16: 0.7283}
    model = CostModel()
    model.profile(GROUP, at_load)
    for _ in range(200):
        model.observe(GROUP, 1, 0.0515)
    for _ in range(20):
        model.observe(GROUP, 2, 0.0925)
    assert model.levels[GROUP] < 0.75, "the group's level: the profile was slow"
    assert model.estimate(GROUP, 1) == pytest.approx(0.0515, rel=0.01)
    assert model.estimate(GROUP, 2) == pytest.approx(0.0925, rel=0.02)
    assert model.estimate(GROUP, 16) == pytest.approx(0.7283), "not observed: its profile, not x0.68"
    assert model.estimate(GROUP, 4) == pytest.approx(0.2278), "x0.68 would make 4 cost 155 ms: they ran 181"
    for _ in range(20):
        model.observe(GROUP, 4, 0.1814)
    assert model.estimate(GROUP, 4) == pytest.approx(0.1814, rel=0.02), "once observed: as served"
    assert "16: 728.3" in model.describe()
    # A profile that was fast (contention while serving) still lifts every size alike.
    model.observe(GROUP, 1, 0.2)
    for _ in range(200):
        model.observe(GROUP, 1, 0.0759 * 1.5)
    assert model.levels[GROUP] > 1.0 and model.estimate(GROUP, 16) == pytest.approx(0.7283 * model.levels[GROUP])


def test_a_profile_keeps_its_lower_monotone_envelope():
    """Noise only lengthens a timed forward: a size that timed slower than a larger one costs what
    the larger did (the H200's 1024px profile of 2026-12-02 had 10-12 requests at 353-521 ms
    between 205 ms for 9 and 294 ms for 13)."""
    model = CostModel()
    model.profile(GROUP, {1: 0.150, 2: 0.108, 3: 0.138, 9: 0.205, 10: 0.353, 11: 0.504, 12: 0.521, 13: 0.294})
    assert model.profiles[GROUP] == {1: 0.108, 2: 0.108, 3: 0.138, 9: 0.205, 10: 0.294, 11: 0.294, 12: 0.294,
                                     13: 0.294}


def test_arrival_rate_counts_steps_per_second_over_its_window():
    rate = ArrivalRate(window_s=30.0)
    assert rate.per_second(now=0.0) == {}
    for t in (0.0, 10.0, 20.0):
        rate.add(GROUP, t, 40)
    assert rate.per_second(now=20.0) == {GROUP: pytest.approx((2 / 20, 80 / 20))}, "all but the oldest / span"
    assert rate.per_second(now=40.0) == {GROUP: pytest.approx((1 / 30, 40 / 30))}, "t=0 left the window"
    assert rate.per_second(now=100.0) == {GROUP: (0.0, 0.0)}, "a quiet spell: no load"
    for _ in range(3):
        rate.add(BIG, 5.0, 20)
    assert rate.per_second(now=5.0)[BIG] == (math.inf, math.inf), "a burst asks for the most throughput"


def test_expensive_batching_waits_at_light_load_and_batches_at_heavy_load():
    """1024px, two running requests: batching them raises throughput 1.3x but stretches both.
    When the arrivals need less than one-at-a-time's throughput (at `target_utilisation`), the
    policy steps one (lower mean latency); when they need more, it batches as without rates."""
    policy, model = CostPolicy(), model_of(DEAR_1024)
    alone = 1 / DEAR_1024[1]                                  # request-steps per second, one at a time
    light = {GROUP: (0.0, 0.5 * alone)}    # (requests, steps) per second; no arrival term here
    heavy = {GROUP: (0.0, 0.9 * alone)}
    assert policy.choose(candidates([20, 20]), model, rates=light) == {"r0"}
    assert policy.choose(candidates([20, 20]), model, rates=heavy) == {"r0", "r1"}
    assert policy.choose(candidates([20, 20]), model) == {"r0", "r1"}, "no rates: near the best throughput"


def test_overload_on_a_nearly_linear_curve_batches_for_throughput():
    """The H200's profile at 1024px of 2026-12-03 (eager, CFG): 16 requests give only 1.11x one's
    throughput, so a floor of 0.9 x the best let one at a time through even when the arrivals
    needed more than the best size gives; the served step:cost then fell to 0.92x request
    batching's throughput at 0.95 load (perf/results/2026-12-03-h200-scheduler.md). With the
    default floor (0.95) an overloaded group batches; at light load it still steps one."""
    model = CostModel()
    model.profile(GROUP, H200_1024_LINEAR)
    policy = CostPolicy()
    best = model.best_throughput(GROUP)
    present = candidates([12, 15, 19, 19, 20], total=20)   # r4 is new: its first step is due
    assert len(policy.choose(present, model, rates={GROUP: (0.0, 1.02 * best)})) > 1
    assert CostPolicy(throughput_floor=0.9).choose(present, model, rates={GROUP: (0.0, 1.02 * best)}) == {"r0", "r4"}, \
        "the old floor: the shortest alone (and the new one's first step)"
    assert policy.choose(present, model, rates={GROUP: (0.0, 0.4 * best)}) == {"r0", "r4"}


def test_a_group_needs_more_throughput_when_another_group_is_busy():
    """The GPU is shared: a group's need counts only the time the other groups leave it."""
    policy = CostPolicy(target_utilisation=0.8)
    model = two_groups(DEAR_1024, DEAR_1024)
    best = model.best_throughput(GROUP)
    need = policy.needed({GROUP: 0.25 * best, BIG: 0.5 * best}, model)
    assert need[GROUP] == pytest.approx(0.25 * best / (0.8 * 0.5))
    assert need[BIG] == pytest.approx(0.5 * best / (0.8 * 0.75))
    assert policy.needed({GROUP: 0.6 * best, BIG: 1.2 * best}, model)[GROUP] == math.inf, "no time left"


def test_completions_replay_the_group_slot_by_slot():
    flat = lambda n: 1.0  # noqa: E731  (a forward costs 1 s whatever its size)
    assert completions([2, 4], 2, flat) == (2 + 4, 4)
    assert completions([2, 4], 1, flat) == (2 + 6, 6)
    assert completions([1, 1, 1], 2, lambda n: float(n)) == (2 + 2 + 3, 3)


def test_expected_arrivals_make_a_batch_that_pays_in_throughput_worth_it():
    """Two 20-step requests on a curve where two cost 1.55x one (the CPU emulation of 2026-12-02):
    one at a time finishes the two present a little sooner (2340 vs 2420 ms summed), but with a
    request arriving every 2.5 s batching's shorter makespan wins."""
    curve = {1: 0.039, 2: 0.0605}
    cost = lambda n: curve[n]  # noqa: E731
    assert expected_latency_cost([20, 20], 1, cost) < expected_latency_cost([20, 20], 2, cost)
    assert expected_latency_cost([20, 20], 2, cost, 0.4) < expected_latency_cost([20, 20], 1, cost, 0.4)
    h200 = {1: 0.0541, 2: 0.0941}     # the H200's 1024px CFG profile of 2026-12-02: two cost 1.74x one
    dear = lambda n: h200[n]  # noqa: E731
    assert expected_latency_cost([20, 20], 1, dear, 0.4) < expected_latency_cost([20, 20], 2, dear, 0.4), \
        "where batching gains less, one at a time still wins at that load"


def test_cheap_batching_steps_everyone():
    chosen = CostPolicy().choose(candidates([20] * 8), model_of(CHEAP_512))
    assert len(chosen) == 8


def test_proportional_cost_steps_the_fewest_remaining_steps_first():
    chosen = CostPolicy().choose(candidates([30, 30, 4, 12]), model_of({1: 0.1, 8: 0.8}))
    assert chosen == {"r2"}, "no batching gain: shortest remaining first (SRPT) lowers mean latency"


def test_expensive_batching_admits_only_what_pays():
    """1024px: 2 requests per forward keep 96 % of the best throughput at a lower mean latency than 8."""
    policy, model = CostPolicy(), model_of(DEAR_1024)
    chosen = policy.choose(candidates([20] * 8), model)
    assert chosen == {"r0", "r1"}, "earliest arrivals first among equals"
    everyone = CostPolicy(throughput_floor=1.0).choose(candidates([20] * 8), model)
    assert len(everyone) == 8, "a floor of 1.0 keeps the best throughput: everyone steps"


def test_short_requests_join_a_long_running_batch_first():
    """Mixed step counts: a 4-step arrival beside 30-step running ones is chosen before them."""
    running = candidates([26, 26, 26, 4])
    chosen = CostPolicy().choose(running, model_of(DEAR_1024))
    assert "r3" in chosen and len(chosen) < 4


BIG = ("128x128", False)


def two_groups(cheap: dict[int, float], dear: dict[int, float]) -> CostModel:
    """GROUP on the `cheap` curve, BIG on the `dear` one."""
    model = model_of(cheap)
    for size, seconds in dear.items():
        model.observe(BIG, size, seconds)
    return model


def big(remaining: list[int], skipped: list[int] | None = None) -> list[Candidate]:
    members = candidates(remaining, skipped, group=BIG)
    for c in members:
        c.key += "-big"
    return members


def test_mixed_groups_step_the_group_whose_head_finishes_first():
    """Across groups: fewest remaining steps x the group's forward, not every group every round."""
    model = two_groups(CHEAP_512, {1: 0.1, 8: 0.8})
    assert CostPolicy().choose(candidates([20] * 4) + big([20] * 4), model) == {"r0", "r1", "r2", "r3"}
    assert CostPolicy().choose(candidates([26, 26]) + big([3, 30]), model) == {"r0-big"}, \
        "3 steps x 0.1 s beat 26 x 0.043 s"
    assert CostPolicy().choose(candidates([6]) + big([4]), model) == {"r0"}, "6 x 0.039 s beat 4 x 0.1 s"


def test_single_group_keeps_the_within_group_rule():
    policy = CostPolicy()
    for curve, remaining in [(CHEAP_512, [20] * 8), (DEAR_1024, [20] * 8), (DEAR_1024, [26, 26, 26, 4]),
                             ({1: 0.1, 8: 0.8}, [30, 30, 4, 12])]:
        model = model_of(curve)
        ordered = policy.order(candidates(remaining), model)
        expected = ordered[:policy.slots(ordered, lambda n: model.estimate(GROUP, n))]
        assert policy.choose(candidates(remaining), model) == {c.key for c in expected}


def test_overdue_requests_go_first_most_stretched_first():
    """The stretch bound: past max_slowdown x its time alone (40 steps x 0.1 s x 2 = 8 s here), a
    request goes ahead of SRPT's choice; among overdue ones the most stretched (time in dit over
    time alone) goes first: among equal requests that is the oldest (FCFS, so a backlog turns into
    request order, not into processor sharing), and a short request late by a few seconds goes
    ahead of a long one late by the same (H200 mixed trace, 2026-12-03: oldest first left 4-step
    requests 20-39x their time alone behind a backlog of 30-step ones)."""
    model = model_of({1: 0.1, 8: 0.8})
    assert CostPolicy().choose(candidates([30, 4, 30], waited=[9.0, 0.0, 8.5]), model) == {"r0"}
    assert CostPolicy().choose(candidates([30, 4, 30], waited=[7.0, 0.0, 8.5]), model) == {"r2"}
    assert CostPolicy().choose(candidates([30, 4, 30]), model) == {"r1"}, "nobody overdue: SRPT"
    long_late = Candidate("long", GROUP, 30, 40, 9.0)     # 9 s / (40 x 0.1 s) = 2.25x its time alone
    short_late = Candidate("short", GROUP, 3, 4, 2.0)     # 2 s / (4 x 0.1 s) = 5x
    assert CostPolicy().choose([long_late, short_late], model) == {"short"}
    short_late.waited = 0.85                              # 2.1x: overdue, but less stretched
    assert CostPolicy().choose([long_late, short_late], model) == {"long"}


def test_the_group_holding_the_most_stretched_overdue_request_steps_alone():
    model = two_groups(CHEAP_512, {1: 0.1, 8: 0.8})
    late = big([30, 30])
    late[1].waited = 9.0
    assert CostPolicy().choose(candidates([4, 4]) + late, model) == {"r1-big"}, \
        "not beside the best group: stepping several groups each round is processor sharing"


def test_new_requests_take_their_first_step_at_once():
    """Time to first step: a request not stepped yet joins this round's forwards, in its group
    (here beside the one SRPT picked) or as its group's own forward."""
    model = two_groups({1: 0.1, 8: 0.8}, {1: 0.1, 8: 0.8})
    running = candidates([10, 20])
    fresh = Candidate("new", GROUP, 20, 20, 0.0)
    assert CostPolicy().choose(running + [fresh], model) == {"r0", "new"}
    fresh_big = Candidate("new-big", BIG, 20, 20, 0.0)
    assert CostPolicy().choose(running + [fresh_big], model) == {"r0", "new-big"}


# The H200's CFG forwards with the transformer graphed (session 36): ms -> s; 1024px one request
# 46.6 ms, two 92.9 (no batching gain); 512px one 9.9, two 17.8 (a tenth saved).
GRAPHED_1024 = {1: 0.0466, 2: 0.0929, 3: 0.1839, 4: 0.1839}
GRAPHED_512 = {1: 0.0099, 2: 0.0178, 3: 0.0338, 4: 0.0338}


@pytest.mark.parametrize("curve, running, apart", [
    (GRAPHED_1024, 1, True),    # two forwards cost what one does: the newcomer's own goes first
    (GRAPHED_1024, 2, True),
    (GRAPHED_512, 1, False),    # apart: 19.8 ms for 17.8 together, past the floor's 5 %
    (CHEAP_512, 1, False),
])
def test_a_first_step_runs_apart_where_batching_it_saves_no_time(curve, running, apart):
    chosen = candidates([10] * running) + [Candidate("new", GROUP, 20, 20, 0.0)]
    assert CostPolicy().apart(chosen, model_of(curve)) == ({"new"} if apart else set())


def test_first_steps_stay_in_their_groups_with_nothing_to_run_apart_from_or_no_curve():
    newcomers = [Candidate("new", GROUP, 20, 20, 0.0), Candidate("new2", GROUP, 20, 20, 0.0)]
    assert CostPolicy().apart(newcomers, model_of(GRAPHED_1024)) == set(), "only newcomers: one forward"
    assert CostPolicy().apart(candidates([10]) + newcomers[:1], CostModel()) == set(), "nothing measured"
    assert CostPolicy().apart(candidates([10], group=BIG) + newcomers[:1], model_of(GRAPHED_1024)) == set(), \
        "a newcomer in another group has its own forward anyway"
    states = [FakeState("r0", 10, step_index=3), FakeState("new", 20)]
    assert StepScheduler("all").apart(states) == set()
    dear = StepScheduler("cost")
    dear.model = model_of(GRAPHED_1024)
    assert dear.apart(states) == {"new"}


def test_an_unmeasured_group_steps_at_once_beside_measured_ones():
    model = model_of(CHEAP_512)
    chosen = CostPolicy().choose(candidates([2]) + big([30, 30]), model)
    assert chosen == {"r0", "r0-big", "r1-big"}, "no measurement: the whole group steps, which measures it"


def test_nothing_measured_yet_steps_everyone():
    assert len(CostPolicy().choose(candidates([5, 9, 30]), CostModel())) == 3
    assert len(CostPolicy().choose(candidates([5]) + big([9, 30]), CostModel())) == 3


@dataclass
class FakeState:
    """What StepScheduler reads of an engine RequestState."""

    key: str
    total_steps: int
    step_index: int = 0
    admitted_at: float = 0.0
    compat_key: tuple = GROUP


ROUND = 0.05   # seconds per simulated round (about one forward on the curves above)


def run_rounds(scheduler: StepScheduler, live: list, arrivals, watch: str, rounds: int = 600) -> list[int]:
    """Rounds of `scheduler` over `live` (FakeStates; `arrivals(round)` -> new ones) until `watch`
    finishes; each round's count of consecutive rounds `watch` was passed over."""
    gaps, since = [], 0
    for round_ in range(rounds):
        live += arrivals(round_)
        chosen = scheduler.select(live, now=round_ * ROUND)
        assert chosen
        for state in live:
            state.step_index += state.key in chosen
        since = 0 if watch in chosen else since + 1
        gaps.append(since)
        for state in [s for s in live if s.step_index == s.total_steps]:
            live.remove(state)
        if all(s.key != watch for s in live):
            return gaps
    raise AssertionError(f"{watch} did not finish in {rounds} rounds")


def short_stream(every: int = 1, group: tuple = GROUP):
    """A 4-step request arriving every `every` rounds."""
    return lambda r: [FakeState(f"s{r}", 4, admitted_at=r * ROUND, compat_key=group)] if r % every == 0 else []


@pytest.mark.parametrize("curves, group", [
    (({1: 0.1, 8: 0.8},), GROUP),            # one group, no batching gain
    ((CHEAP_512, DEAR_1024), BIG),           # an expensive request amid cheap ones of another group
], ids=["same-group", "other-group"])
def test_no_request_starves_behind_a_stream_of_short_ones(curves, group):
    """A 30-step request amid ever-arriving 4-step ones: SRPT passes it over while it is within
    max_slowdown x its time alone; past that only a more stretched (overdue) 4-step request goes
    before it, for at most that request's 4 steps, and it finishes within twice its steps."""
    scheduler = StepScheduler("cost", max_slowdown=2.0)
    scheduler.model = model_of(curves[0]) if len(curves) == 1 else two_groups(*curves)
    long = FakeState("long", 30, step_index=1, compat_key=group)       # stepped once on arrival
    gaps = run_rounds(scheduler, [long], short_stream(every=2 if group == GROUP else 1), "long")
    bound = int(2.0 * 30 * scheduler.model.estimate(group, 1) / ROUND) + 1   # first round past the bound
    assert max(gaps[:bound]) > 0, "before the bound the stream goes first (SRPT)"
    assert max(gaps[bound:]) <= 4, "after it, passed over only for a more stretched short request's steps"
    assert len(gaps) <= bound + 2 * 30, "and it finishes"


def test_a_steps_device_time_is_the_sum_of_its_forwards_estimates_once_all_are_measured():
    """What the late queue (ditserve/late_queue.py) forecasts a step's end from."""
    scheduler = StepScheduler("cost")
    a, b = ("a",), ("b",)
    scheduler.model.observe(a, 1, 0.020)
    scheduler.model.observe(a, 2, 0.030)
    assert scheduler.step_seconds([(a, 2, None)]) == pytest.approx(0.030)
    assert scheduler.step_seconds([(a, 1, None), (a, 2, None)]) == pytest.approx(0.050)
    assert scheduler.step_seconds([(a, 1, None), (b, 1, None)]) is None, "b is unmeasured"
    assert StepScheduler("all").step_seconds([(a, 1, None)]) is None, "`all` learns no curve"


def test_all_scheduler_steps_every_ready_request():
    states = [FakeState(f"r{i}", 10) for i in range(5)]
    assert StepScheduler("all").select(states) == {s.key for s in states}


@pytest.mark.parametrize("engine, message", [
    ('scheduler = "fast"', "scheduler='fast'; allowed: all, cost"),
    ('mode = "request_batch"\nscheduler = "cost"', 'needs mode = "step"'),
    ('scheduler = "cost"\nmax_skips = 8', "unknown keys ['max_skips']"),
    ('scheduler = "cost"\nthroughput_floor = 1.5', "throughput_floor=1.5; allowed: a number in (0, 1]"),
    ('scheduler = "cost"\nmax_slowdown = 0.5', "max_slowdown=0.5; allowed: a number >= 1"),
    ('scheduler = "cost"\ntarget_utilisation = 0', "target_utilisation=0; allowed: a number in (0, 1]"),
    ('scheduler = "cost"\nlate_queue_ms = -1', "late_queue_ms=-1; allowed: a number of milliseconds >= 0"),
    ('scheduler = "cost"\nlate_queue_ms = true', "late_queue_ms=True; allowed: a number of milliseconds >= 0"),
    ('late_queue_ms = 3', 'late_queue_ms=3 needs scheduler = "cost" (its cost curve predicts when a step ends)'),
    ('scheduler = "cost"\novertake = 1', "overtake=1; allowed: true or false"),
    ('mode = "request_batch"\novertake = true', 'overtake = true needs mode = "step"'),
    ('scheduler = "cost"\novertake = true\n[accel]\ntransformer = "compile"',
     "[accel] transformer='compile' would give them other numerics: use transformer = \"eager_graphs\""),
])
def test_bad_scheduler_options_fail_at_load_naming_the_allowed_values(tmp_path, engine, message):
    base = (ROOT / "configs" / "tiny-pixart-sigma.toml").read_text().replace('mode = "step"\n', "")
    path = tmp_path / "bad.toml"
    path.write_text(base.replace("capacity = 4", f"capacity = 4\n{engine}"))
    with pytest.raises(ValueError) as info:
        load_deployment(path)
    assert message in str(info.value)
