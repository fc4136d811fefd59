"""A GPU's queue emulated on the CPU (faults action `device`, ditserve/emulated_device.py): the
engine queues ahead of it and reads checks late, and on a real tritonserver dit holds steps and
newcomers join them through the late queue (`[engine] late_queue_ms`), as on a GPU, with every
image still diffusers'."""
from __future__ import annotations

import time

import pytest
import torch

from conftest import ROOT, TINY_PIXART, rendered_server, serve
from ditserve.adapters import adapter_for
from ditserve.client import GenerationRequest
from ditserve.deployment import load_deployment, write_variant
from ditserve.engine import StepEngine
from ditserve.emulated_device import EmulatedDevice, SharedWork
from ditserve.faults import FaultRule, injector
from ditserve.scheduler import ForwardTimer
from ditserve.schema import GenerationParams
from helpers import StreamCall, delta_of, scrape
from test_engine import _cond
from test_step_batching import assert_each_streamed_and_matches

FORWARD_S = 0.05


def emulated_deployment(path, engine: dict, seconds: float, per_row: float = 0.0):
    """The tiny deployment with `engine` keys, its forwards on a device emulated at `seconds` plus
    `per_row` per request in the forward."""
    write_variant(ROOT / "configs" / "tiny-pixart-sigma.toml", path, engine, "tests/test_emulated_device.py")
    with path.open("a") as toml:
        toml.write(f'\n[[faults.rules]]\npoint = "denoise"\naction = "device"\nseconds = {seconds}\n'
                   f'seconds_per_row = {per_row}\n')
    return path


def test_the_engine_queues_ahead_of_an_emulated_device(tmp_path):
    deployment = load_deployment(emulated_deployment(tmp_path / "emulated.toml", {}, FORWARD_S))
    engine = StepEngine(adapter_for(deployment.model.family)(deployment, "dit"), injector(deployment, "dit"))
    params = GenerationParams("p", "", 64, 64, 6, 4.5, 1)
    engine.admit("g", params, _cond(params))
    start = time.monotonic()
    engine.step(["g"])   # a first step is checked at once: the host waits for its forward
    assert time.monotonic() - start >= FORWARD_S and not engine.device_busy()
    engine.step(["g"])   # a middle step: queued, the host goes on
    assert engine.device_busy(), "the host returned while the emulated forward still runs"
    report = engine.step(["g"])
    assert not report.ran_dry and report.started_at > report.queued_at, "began when the step before ended"
    time.sleep(2 * FORWARD_S)
    report = engine.step(["g"])
    assert report.ran_dry, "queued on an idle device"
    (_, _, timer), = report.timings
    time.sleep(FORWARD_S)
    assert timer.seconds() == pytest.approx(FORWARD_S, abs=0.02), "the cost model sees the device's time"
    engine.release("g")


def test_device_rules_are_for_the_stages_that_use_a_gpu():
    for point in ("denoise", "encode", "decode"):
        FaultRule(point=point, action="device", seconds=0.01)
    with pytest.raises(ValueError, match="action='device'; allowed there"):
        FaultRule(point="output", action="device", seconds=0.01)
    with pytest.raises(ValueError, match="device rule at 'denoise' needs seconds > 0"):
        FaultRule(point="denoise", action="device")


def test_another_stages_work_delays_dits_pending_work_and_waits_for_its_share(tmp_path):
    """On a GPU the text encoder time-slices the device with dit's forwards: a piece of its work
    that starts while a forward is pending pushes that forward's end back by its length, and
    itself takes its length plus what it overlaps of dit's work; dit's work queued after it is
    not pushed back, nor is work that had ended."""
    dit, stage = SharedWork(tmp_path / "device"), SharedWork(tmp_path / "device")
    now = time.monotonic()
    dit.dit_queued_until(now + 0.030)                 # 30 ms of forwards queued
    assert stage.add(0.010) == pytest.approx(0.020, abs=0.002), "10 ms of its own + 10 ms shared"
    after = time.monotonic()
    dit.read()
    assert dit.delay(now, now + 0.030) == pytest.approx(now + 0.040, abs=0.002), "pending: 10 ms later"
    assert dit.delay(after, after + 0.030) == after + 0.030, "queued after it began"
    assert dit.delay(now - 0.050, now - 0.010) == now - 0.010, "ended before it began"
    dit.dit_queued_until(after - 1.0)                 # dit idle: the piece runs alone
    assert stage.add(0.010) == pytest.approx(0.010)


def test_the_engine_sees_its_forwards_slowed_by_another_stage(tmp_path):
    """dit's emulated device with a shared folder: its events and forward timers include the
    other stage's work that came while they were pending."""
    device = EmulatedDevice(SharedWork(tmp_path / "device"))
    timer = ForwardTimer(torch.device("cpu"), device)
    device.occupy(0.040)
    timer.stop()
    done = device.event()
    SharedWork(tmp_path / "device").add(0.020)       # a prompt encoded while the forward runs
    assert done.ends_at() == pytest.approx(device.busy_until + 0.020, abs=0.002)
    done.synchronize()
    assert done.query() and timer.seconds() == pytest.approx(0.060, abs=0.01)


def test_work_that_overtakes_runs_at_once_and_pushes_the_queue_back():
    """A CUDA stream of the highest priority, emulated: work occupied inside `overtaking` starts
    at once, its event waits for it alone, the work queued before ends later by its length, and
    work queued after it starts behind both."""
    device = EmulatedDevice()
    device.occupy(0.200)
    queued = device.event()
    due = queued.ends_at()
    start = time.monotonic()
    with device.overtaking():
        device.occupy(0.050)
        device.occupy(0.020)   # a second group of first steps: behind the first, in the same lane
        lane = device.event()
    assert start <= lane.ends_at() - 0.070 <= time.monotonic(), "at once, not after the queued work"
    # Absolute tolerances: these are time.monotonic() values, whose size is the host's uptime (a
    # relative one hid 20 ms of double counting on hosts up for more than ~6 hours).
    assert queued.ends_at() == pytest.approx(due + 0.070, abs=1e-6), "the queued work is pushed back"
    device.occupy(0.010)
    assert device.event().ends_at() == pytest.approx(due + 0.080, abs=1e-6), "queued after: behind both, once"


def test_a_first_step_overtakes_the_queued_step_and_keeps_its_result(tmp_path):
    """`StepEngine.overtake` on the emulated device: a newcomer's first step returns, confirmed,
    after its own forward while a long step queued before it still runs; its forward is timed
    apart from the cost curve's timings; both requests then step on, and the newcomer's latents
    are its lone run's."""
    path = emulated_deployment(tmp_path / "emulated.toml", {}, FORWARD_S)
    with path.open("a") as toml:   # the running request's forwards: 40x longer (its height only)
        toml.write(f'\n[[faults.rules]]\npoint = "denoise"\naction = "device"\nheight = 96\nseconds = {39 * FORWARD_S}\n')
    deployment = load_deployment(path)
    engine = StepEngine(adapter_for(deployment.model.family)(deployment, "dit"), injector(deployment, "dit"))
    params = GenerationParams("p", "", 64, 64, 4, 4.5, 7)
    cond = _cond(params)
    engine.admit("alone", params, cond)
    while not engine.table["alone"].done:
        engine.step(["alone"])
    alone = engine.release("alone").latents
    running = GenerationParams("q", "", 96, 64, 3, 4.5, 1)   # another group: the two never share a forward
    engine.admit("run", running, _cond(running))
    engine.step(["run"])   # its first step is checked at once
    queued = time.monotonic()
    engine.step(["run"])   # its second runs for 40 x FORWARD_S while the host goes on
    assert engine.can_overtake()
    engine.admit("new", params, cond)
    start = time.monotonic()
    report = engine.overtake(["new"])
    took = time.monotonic() - start
    assert report.confirmed == {"new": 1} and report.timings == [] and report.batch_sizes == [1]
    # Back before the queued step could have ended (40 forwards from `queued`): its own forward, not
    # the queued step's rest as well. Measured from `queued`, not as a multiple of one forward: a
    # loaded 2-core host took 0.30-0.37 s for an overtake of one 0.05 s forward, and 0.33 s more to
    # queue the step and admit the newcomer (fresh clones, 2026-12-07).
    assert start + took < queued + 40 * FORWARD_S, "its own forward, not the queued step's rest as well"
    (seconds,) = report.overtake_seconds   # timed apart from the cost curve: its emulated forward, within the call
    assert FORWARD_S <= seconds <= took, (seconds, took)
    assert engine.device_busy(), "the overtaken step still runs"
    with pytest.raises(RuntimeError, match="only first steps overtake"):
        engine.overtake(["run"])
    while not engine.table["new"].done:
        engine.step([key for key in ("run", "new") if not engine.table[key].done])
    assert torch.equal(engine.release("new").latents, alone)
    engine.release("run")


def newcomers_beside_a_long_request(server, steps: int, newcomer_steps: int, newcomers: int, every: int):
    """A `steps`-step request, then `newcomers` requests of `newcomer_steps`, each sent once the
    long one has streamed `every` more steps: (requests, results, metrics before, metrics after)."""
    requests = [GenerationRequest("a red cat", seed=1, num_inference_steps=steps)]
    requests += [GenerationRequest(f"a blue bird {i}", seed=10 + i, num_inference_steps=newcomer_steps)
                 for i in range(newcomers)]
    before = scrape(server.metrics_url)
    calls = [StreamCall(server.grpc_url, requests[0]).start()]
    for request in requests[1:]:
        calls[0].wait_progress(len(calls) * every)
        calls.append(StreamCall(server.grpc_url, request).start())
    results = [call.finish() for call in calls]
    return requests, results, before, scrape(server.metrics_url)


@pytest.fixture(scope="module")
def late_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("late-queue") / "tiny-pixart-late.toml"
    emulated_deployment(path, {"scheduler": "cost", "late_queue_ms": 3.0, "capacity": 8}, 0.03)
    yield from serve(rendered_server(tmp_path_factory, path, TINY_PIXART, "late-server"))


def test_newcomers_join_held_steps_and_every_image_is_diffusers(late_server, diffusers_pixart):
    """A 40-step request runs on a device emulated at 30 ms a forward; five newcomers arrive one
    after another while it runs. dit holds each next step until shortly before the running one
    ends, and newcomers handed over meanwhile join it: holds and joins are counted, every
    request streams every step, and every image equals diffusers'."""
    requests, results, before, after = newcomers_beside_a_long_request(late_server, 40, 6, 5, every=3)
    assert_each_streamed_and_matches(requests, results, diffusers_pixart)
    delta = delta_of(before, after, "dit")
    assert delta("ditserve_late_queue_holds_total") > 0, "dit held steps while the emulated device ran"
    assert delta("ditserve_late_queue_joins_total") > 0, "a newcomer ended a hold and joined the held step"
    assert delta("ditserve_step_batch_size_sum") == sum(r.num_inference_steps for r in requests)
    assert after.get(("ditserve_state_table_size", "dit")) == 0


@pytest.fixture(scope="module")
def overtake_server(tmp_path_factory):
    """Forwards cost 50 ms per request in them (batching saves nothing: first steps run apart)."""
    path = tmp_path_factory.mktemp("overtake") / "tiny-pixart-overtake.toml"
    emulated_deployment(path, {"scheduler": "cost", "overtake": True, "capacity": 8}, 0.0, per_row=0.05)
    yield from serve(rendered_server(tmp_path_factory, path, TINY_PIXART, "overtake-server"))


def test_first_steps_overtake_the_running_step_and_every_image_is_diffusers(overtake_server, diffusers_pixart):
    """A 30-step request runs; four newcomers arrive one after another while it runs. Batching
    them with it would save nothing, so each first step runs at once beside the running step
    (`[engine] overtake`): overtakes are counted, every request streams every step, and every
    image equals diffusers'."""
    requests, results, before, after = newcomers_beside_a_long_request(overtake_server, 30, 4, 4, every=5)
    assert_each_streamed_and_matches(requests, results, diffusers_pixart)
    delta = delta_of(before, after, "dit")
    assert delta("ditserve_overtakes_total") > 0, "a first step overtook the running step"
    assert delta("ditserve_overtake_forward_seconds_count") == delta("ditserve_overtakes_total"), \
        "each overtaking forward (one newcomer each here) timed"
    assert delta("ditserve_step_batch_size_sum") == sum(r.num_inference_steps for r in requests)
    assert after.get(("ditserve_state_table_size", "dit")) == 0
