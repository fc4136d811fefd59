"""The step engine's scheduling policy, on the real tiny PixArt-Sigma adapter (no server).

Policy under test (bounded wait): every request present in a batch advances exactly one
step per engine step, whatever its compatibility group; each group is one forward.
So a request never waits behind another group for more than one forward per group.
"""
from __future__ import annotations

import time

import pytest
import torch

from ditserve.adapters import adapter_for
from ditserve.deployment import load_deployment
from ditserve.engine import StepEngine
from ditserve.schema import GenerationParams
from ditserve.state import TextConditioning


@pytest.fixture(scope="module")
def engine():
    deployment = load_deployment("configs/tiny-pixart-sigma.toml")
    return StepEngine(adapter_for(deployment.model.family)(deployment, "dit"))


def _params(seed: int, height: int = 64, guidance: float = 4.5, steps: int = 5) -> GenerationParams:
    return GenerationParams("p", "", height, 64, steps, guidance, seed)


def _cond(params: GenerationParams) -> TextConditioning:
    rows = 2 if params.do_cfg else 1
    return TextConditioning(torch.randn(rows, 300, 32), torch.ones(rows, 300, dtype=torch.int64))


def _admit(engine, key, params):
    return engine.admit(key, params, _cond(params))


def test_every_group_advances_one_step_per_engine_step(engine):
    mixed = {"a": _params(1), "b": _params(2), "c": _params(3, height=96), "d": _params(4, guidance=1.0)}
    for key, params in mixed.items():
        _admit(engine, key, params)
    report = engine.step(list(mixed))
    assert report.forwards == 3 and sorted(report.batch_sizes) == [1, 1, 2]
    assert all(engine.table[key].step_index == 1 for key in mixed)
    for key in mixed:
        engine.release(key)


def test_each_request_owns_its_scheduler(engine):
    a, b = _admit(engine, "s1", _params(1, steps=6)), _admit(engine, "s2", _params(2, steps=3))
    assert a.scheduler is not b.scheduler and len(a.timesteps) == 6 and len(b.timesteps) == 3
    engine.step(["s1", "s2"])
    engine.step(["s1"])
    assert (a.step_index, b.step_index) == (2, 1)
    assert a.scheduler.step_index == 2 and b.scheduler.step_index == 1  # solver history is per request
    engine.release("s1"), engine.release("s2")


def test_release_is_idempotent_and_gc_drops_lost_requests(engine):
    _admit(engine, "live", _params(1))
    _admit(engine, "lost", _params(2))
    engine.table["lost"].last_seen = time.monotonic() - 1000
    assert engine.collect_garbage(live_keys={"live"}, idle_seconds=60) == ["lost"]
    assert engine.release("lost") is None and engine.release("live") is not None and len(engine) == 0


def test_stepping_a_finished_or_duplicate_request_is_an_error(engine):
    _admit(engine, "one", _params(1, steps=1))
    with pytest.raises(KeyError):
        _admit(engine, "one", _params(1))
    engine.step(["one"])
    with pytest.raises(RuntimeError, match="no steps left"):
        engine.step(["one"])
    engine.release("one")


def test_a_step_is_confirmed_at_the_next_step_and_the_last_at_once(engine):
    """The NaN/inf check of a step is read at the request's next step (so the GPU is not left
    idle between steps), except for its first step (time to first step) and its last;
    progress may only be reported for confirmed steps."""
    _admit(engine, "c", _params(1, steps=4))
    confirmed = [engine.step(["c"]).confirmed for _ in range(4)]
    assert confirmed == [{"c": 1}, {}, {"c": 2}, {"c": 3}]
    state = engine.table["c"]
    assert state.done and state.unchecked is None, "the last step was checked before its latents may leave"
    engine.release("c")


def test_a_step_reports_when_it_was_queued_and_when_the_device_began_it(engine):
    """What the late queue forecasts a step's end from (ditserve/late_queue.py). On a CPU a step
    has run when it returns: it began when engine.step did, and the device never ran dry."""
    _admit(engine, "t", _params(1, steps=3))
    for _ in range(3):
        before = time.monotonic()
        report = engine.step(["t"])
        assert before <= report.started_at <= report.queued_at <= time.monotonic()
        assert not report.ran_dry
    engine.release("t")


@pytest.mark.gpu   # the host queues ahead of a CUDA device only
def test_a_step_queued_behind_running_work_begins_when_that_work_ends(engine, monkeypatch):
    """A step queued while the step before still runs begins when that one ends: the host waits
    for it (one step queued ahead at most) and stamps `started_at` then. One queued on an idle
    device says that it ran dry."""
    _admit(engine, "g", _params(1, steps=6))
    engine.step(["g"])   # the first step is checked at once
    engine.step(["g"])
    denoise = engine.adapter.denoise

    def slow(states):
        outputs = denoise(states)
        torch.cuda._sleep(200_000_000)   # ~0.1 s of GPU cycles after its forward
        return outputs

    monkeypatch.setattr(engine.adapter, "denoise", slow)
    engine.step(["g"])
    monkeypatch.undo()
    report = engine.step(["g"])
    assert not report.ran_dry
    assert report.started_at - report.queued_at > 0.02, "began when the slow step's work ended"
    torch.cuda.synchronize()
    assert engine.step(["g"]).ran_dry, "queued on an idle device"
    torch.cuda.synchronize()
    engine.release("g")


@pytest.mark.gpu   # the host queues ahead of a CUDA device only
def test_a_middle_step_queues_without_waiting_for_the_device(engine):
    """A step that is neither a request's first nor its last must not wait for the GPU: a blocking
    copy (the CFG scales were one until 2026-12-04) or `.item()` holds the host until this step's
    forward ends, so the next step cannot be queued while the GPU runs this one."""
    _admit(engine, "g1", _params(1, steps=6, guidance=4.5))
    _admit(engine, "g2", _params(2, steps=6, guidance=7.0))
    engine.step(["g1", "g2"])   # the first step is checked at once (time to first step)
    engine.step(["g1", "g2"])
    torch.cuda.set_sync_debug_mode("error")   # raises on any synchronising call
    try:
        engine.step(["g1", "g2"])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    engine.release("g1")
    engine.release("g2")


def test_a_first_step_goes_before_the_running_groups_with_its_own_check(engine):
    """Time to first step: a newcomer's group runs first in its engine step and has its own
    check, so reading its first step's check does not wait for a running group's forward."""
    _admit(engine, "run", _params(1, height=96))
    engine.step(["run"])
    _admit(engine, "new", _params(2))
    report = engine.step(["run", "new"])
    assert [key for key, _, _ in report.timings] == [engine.table["new"].compat_key, engine.table["run"].compat_key]
    assert report.confirmed == {"new": 1}   # "run": its second step is confirmed at its third
    assert set(engine.table["run"].unchecked.rows) == {"run"}, "the running group's check holds its rows only"
    engine.release("run")
    engine.release("new")


def test_a_first_step_apart_runs_before_its_groups_running_requests(engine, monkeypatch):
    """`apart` (the scheduler's choice where batching saves no time): the newcomer's first step
    is a forward of its own, ahead of the running request of the same compatibility group, and
    its check is its own."""
    _admit(engine, "run", _params(1))
    engine.step(["run"])
    _admit(engine, "new", _params(2))
    assert engine.table["new"].compat_key == engine.table["run"].compat_key
    together = engine.step(["run", "new"]).batch_sizes
    engine.release("new")
    _admit(engine, "new", _params(2))
    forwards, denoise = [], engine.adapter.denoise
    monkeypatch.setattr(engine.adapter, "denoise", lambda states: forwards.append([s.key for s in states]) or denoise(states))
    report = engine.step(["run", "new"], apart={"new"})
    assert (together, forwards) == ([2], [["new"], ["run"]])
    assert report.confirmed == {"run": 2, "new": 1}   # run's step 2 (read one step late), new's first at once
    assert set(engine.table["run"].unchecked.rows) == {"run"}, "the running request's check holds its row only"
    engine.release("run")
    engine.release("new")


@pytest.mark.gpu   # the host runs ahead of a CUDA device only
def test_a_first_step_is_reported_while_a_running_group_still_computes(engine, monkeypatch):
    """The newcomer's progress may go out while the GPU still runs the other group's forward:
    ~0.1 s of GPU work queued behind the running group's step must not delay it."""
    _admit(engine, "run", _params(1, height=96))
    engine.step(["run"])
    engine.step(["run"])   # its next step is a middle one: no wait for the device (test above)
    _admit(engine, "new", _params(2))
    denoise = engine.adapter.denoise

    def slow_running_group(states):
        outputs = denoise(states)
        if states[0].key == "run":
            torch.cuda._sleep(200_000_000)   # GPU cycles, queued on the stream after its forward
        return outputs

    monkeypatch.setattr(engine.adapter, "denoise", slow_running_group)
    report = engine.step(["run", "new"])
    assert report.confirmed.get("new") == 1
    assert engine.device_busy(), "the first step's check waited for the running group's forward"
    torch.cuda.synchronize()
    engine.release("run")
    engine.release("new")


def _denoised_alone(engine, key: str, params: GenerationParams, cond: TextConditioning) -> torch.Tensor:
    engine.admit(key, params, cond)
    while not engine.table[key].done:
        engine.step([key])
    return engine.release(key).latents


def test_embeddings_cut_of_their_zero_padding_denoise_as_the_padded_ones(engine):
    """text_encoder hands dit the embeddings without their zero padding; admission puts it back."""
    params = _params(3, steps=3)
    padded = _cond(params)
    padded.embeds[:, 12:] = 0.0
    cut = TextConditioning(padded.embeds[:, :12].clone(), padded.mask)
    assert torch.equal(_denoised_alone(engine, "cut", params, cut), _denoised_alone(engine, "padded", params, padded))


@pytest.mark.gpu   # the host runs ahead of a CUDA device only
def test_a_newcomer_is_admitted_while_queued_steps_still_run(engine):
    """Admission's copies to the device (noise, schedule, the embeddings cut of their zero
    padding) go on a side stream: they must not wait for ~0.1 s of GPU work queued ahead on the
    compute stream, and the newcomer's result stays what it is alone, to the bit."""
    params = _params(2, steps=4)
    cut = TextConditioning(torch.randn(2, 12, 32), torch.cat([torch.ones(2, 12), torch.zeros(2, 288)], 1).long())
    cut.embeds[0] = 0.0   # an empty negative prompt's row
    alone = _denoised_alone(engine, "alone", params, cut)
    _admit(engine, "run", _params(1, height=96))
    engine.step(["run"])
    torch.cuda._sleep(200_000_000)   # GPU cycles queued on the compute stream, as a step would be
    queued = torch.cuda.Event()
    queued.record()
    engine.admit("new", params, cut)
    assert not queued.query(), "admission waited for the work queued ahead on the compute stream"
    while not engine.table["new"].done:
        engine.step(["run", "new"] if not engine.table["run"].done else ["new"])
    assert torch.equal(engine.release("new").latents, alone)
    engine.release("run")


@pytest.mark.gpu   # a stream of the highest priority exists on a CUDA device only
def test_a_first_step_overtakes_the_work_queued_on_the_compute_stream(engine):
    """`overtake` runs a newcomer's first step on a stream of the highest priority: it returns,
    confirmed, while ~0.2 s of GPU work queued on the compute stream still runs (a step there
    would wait for it), later steps follow it, and its result is its lone run's, to the bit."""
    params = _params(2, steps=4)
    cond = _cond(params)
    alone = _denoised_alone(engine, "alone", params, cond)
    _admit(engine, "run", _params(1, height=96))
    engine.step(["run"])
    torch.cuda._sleep(400_000_000)   # GPU cycles queued on the compute stream, as a running step would be
    queued = torch.cuda.Event()
    queued.record()
    engine.admit("new", params, cond)
    report = engine.overtake(["new"])
    assert report.confirmed == {"new": 1} and not report.failed
    assert not queued.query(), "the first step waited for the work queued on the compute stream"
    while not engine.table["new"].done:
        engine.step(["run", "new"] if not engine.table["run"].done else ["new"])
    assert torch.equal(engine.release("new").latents, alone)
    engine.release("run")


def test_a_non_finite_step_is_reported_by_its_own_number(engine):
    _admit(engine, "nan", _params(1, steps=4))
    _admit(engine, "ok", _params(2, steps=4))
    engine.step(["nan", "ok"])
    engine.table["nan"].latents = torch.full_like(engine.table["nan"].latents, float("nan"))
    second = engine.step(["nan", "ok"])   # step 2's output and latents are NaN; read at step 3
    assert second.failed == {} and second.confirmed == {}
    third = engine.step(["nan", "ok"])
    assert list(third.failed) == ["nan"] and "step 2/4" in third.failed["nan"], third.failed
    assert third.confirmed == {"ok": 2}
    engine.release("nan"), engine.release("ok")
