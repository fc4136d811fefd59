"""The step scheduler's policy (ditserve/scheduler.py) on given cost curves: pure logic, no Triton."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from conftest import ROOT
from ditserve.deployment import load_deployment
from ditserve.scheduler import Candidate, CostModel, CostPolicy, ForwardTimer, StepScheduler, sum_of_completions

GROUP = ("64x64", True)
# H200 PixArt-Sigma forward times (DESIGN.md, 2026-12-01) in requests with CFG (2 rows each), seconds.
CHEAP_512 = {1: 0.039, 2: 0.043, 4: 0.052, 8: 0.060}
DEAR_1024 = {1: 0.047, 2: 0.075, 4: 0.146, 8: 0.289}


def model_of(curve: dict[int, float], group: tuple = GROUP) -> CostModel:
    model = CostModel()
    for size, seconds in curve.items():
        model.observe(group, size, seconds)
    return model


def candidates(remaining: list[int], skipped: list[int] | None = None, group: tuple = GROUP) -> list[Candidate]:
    skipped = skipped or [0] * len(remaining)
    return [Candidate(f"r{i}", group, steps, skip, float(i)) for i, (steps, skip) in enumerate(zip(remaining, skipped))]


def test_cost_model_interpolates_and_is_optimistic_where_it_has_not_measured():
    model = model_of({2: 0.1, 4: 0.3})
    assert model.estimate(GROUP, 3) == pytest.approx(0.2)
    assert model.estimate(GROUP, 8) == pytest.approx(0.3), "above the largest measured size: tried as free"
    assert model.estimate(GROUP, 1) == pytest.approx(0.05), "below the smallest: proportional (no batching gain)"
    assert model.estimate(("other",), 1) is None
    model.observe(GROUP, 2, 0.2)
    assert model.estimate(GROUP, 2) == pytest.approx(0.7 * 0.1 + 0.3 * 0.2), "EWMA with weight 0.3"


def test_cpu_forward_timer_feeds_the_model_once_resolved():
    scheduler = StepScheduler("cost")
    timer = ForwardTimer(torch.device("cpu"))
    timer.stop()
    scheduler.observe([(GROUP, 3, timer)])
    scheduler.model.resolve()
    assert 0 <= scheduler.model.estimate(GROUP, 3) < 1 and not scheduler.model.pending


def test_sum_of_completions_replays_the_group_slot_by_slot():
    flat = lambda n: 1.0  # noqa: E731  (a forward costs 1 s whatever its size)
    assert sum_of_completions([2, 4], 2, flat) == 2 + 4
    assert sum_of_completions([2, 4], 1, flat) == 2 + 6
    assert sum_of_completions([1, 1, 1], 2, lambda n: float(n)) == 2 + 2 + 3


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


def test_groups_are_scheduled_separately():
    mixed = candidates([20] * 4) + candidates([20] * 4, group=("128x128", False))
    for c in mixed[4:]:
        c.key += "-big"
    model = model_of(CHEAP_512)
    for size, seconds in {1: 0.1, 8: 0.8}.items():
        model.observe(("128x128", False), size, seconds)
    chosen = CostPolicy().choose(mixed, model)
    assert {"r0", "r1", "r2", "r3"} <= chosen and len(chosen - {"r0", "r1", "r2", "r3"}) == 1


def test_nothing_measured_yet_steps_everyone():
    assert len(CostPolicy().choose(candidates([5, 9, 30]), CostModel())) == 3


@dataclass
class FakeState:
    """What StepScheduler reads of an engine RequestState."""

    key: str
    total_steps: int
    step_index: int = 0
    admitted_at: float = 0.0
    compat_key: tuple = GROUP


def test_no_request_starves_behind_a_stream_of_short_ones():
    """A 30-step request amid ever-arriving 4-step ones (no batching gain) still steps at
    least once every max_skips + 1 rounds, and finishes."""
    scheduler = StepScheduler("cost", max_skips=3)
    scheduler.model = model_of({1: 0.1, 8: 0.8})
    long = FakeState("long", 30)
    live, gaps, since = [long], [], 0
    for round_ in range(400):
        if round_ % 2 == 0:
            live.append(FakeState(f"s{round_}", 4, admitted_at=float(round_)))
        chosen = scheduler.select(live)
        assert chosen
        for state in live:
            if state.key in chosen:
                state.step_index += 1
        since = 0 if "long" in chosen else since + 1
        gaps.append(since)
        for state in [s for s in live if s.step_index == s.total_steps]:
            live.remove(state)
            scheduler.forget(state.key)
        if long not in live:
            break
    assert long not in live, "the long request finished"
    assert max(gaps) <= 3


def test_all_scheduler_steps_every_ready_request():
    states = [FakeState(f"r{i}", 10) for i in range(5)]
    assert StepScheduler("all").select(states) == {s.key for s in states}


@pytest.mark.parametrize("engine, message", [
    ('scheduler = "fast"', "scheduler='fast'; allowed: all, cost"),
    ('mode = "request_batch"\nscheduler = "cost"', 'needs mode = "step"'),
    ('scheduler = "cost"\nmax_skips = 0', "max_skips=0; allowed: an integer >= 1"),
    ('scheduler = "cost"\nthroughput_floor = 1.5', "throughput_floor=1.5; allowed: a number in (0, 1]"),
])
def test_bad_scheduler_options_fail_at_load_naming_the_allowed_values(tmp_path, engine, message):
    base = (ROOT / "configs" / "tiny-pixart-sigma.toml").read_text().replace('mode = "step"\n', "")
    path = tmp_path / "bad.toml"
    path.write_text(base.replace("capacity = 4", f"capacity = 4\n{engine}"))
    with pytest.raises(ValueError) as info:
        load_deployment(path)
    assert message in str(info.value)
