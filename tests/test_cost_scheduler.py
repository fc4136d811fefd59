"""`[engine] scheduler = "cost"` on a real tritonserver (tiny PixArt): a mixed stream of 4- and
30-step requests, three shapes, CFG on and off, all finish with progress for every step and the
image diffusers makes; requests that wait rounds keep their state and lose no step. Each
forward sleeps 20 ms per request (fault injection, as perf/deployments/*-h200-timing.toml), so
the learned curve shows no batching gain and the scheduler does hold requests back. The server
also has `[engine] late_queue_ms` set: its forecasts run at every step, and a CPU never holds
(a step returns when its work is done), so nothing changes."""
from __future__ import annotations

import pytest

from conftest import ROOT, TINY_PIXART, rendered_server, serve
from ditserve.client import GenerationRequest
from ditserve.deployment import write_variant
from helpers import StreamCall, delta_of, scrape
from test_step_batching import assert_each_streamed_and_matches


@pytest.fixture(scope="module")
def cost_server(tmp_path_factory):
    deployment = tmp_path_factory.mktemp("cost-deployment") / "tiny-pixart-cost.toml"
    write_variant(ROOT / "configs" / "tiny-pixart-sigma.toml", deployment,
                  {"scheduler": "cost", "late_queue_ms": 3.0}, "tests/test_cost_scheduler.py")
    with deployment.open("a") as toml:  # forwards cost 20 ms per request: batching gains nothing, so some wait
        toml.write('\n[[faults.rules]]\npoint = "denoise"\naction = "sleep"\nseconds_per_row = 0.02\n')
    yield from serve(rendered_server(tmp_path_factory, deployment, TINY_PIXART, "cost-server"))


def test_mixed_requests_all_finish_exactly_under_the_cost_scheduler(cost_server, diffusers_pixart):
    requests = [
        GenerationRequest("a red cat", seed=1, num_inference_steps=30),
        GenerationRequest("a blue bird", seed=2, num_inference_steps=30),
        GenerationRequest("a castle", seed=3, num_inference_steps=4),
        GenerationRequest("a forest", seed=4, num_inference_steps=30, height=96, width=64),
        GenerationRequest("a boat", seed=5, num_inference_steps=4, guidance_scale=1.0),
        GenerationRequest("a lamp", seed=6, num_inference_steps=4),
        GenerationRequest("a dog", seed=7, num_inference_steps=30, guidance_scale=1.0, height=64, width=96),
        GenerationRequest("a tree", seed=8, num_inference_steps=4),
    ]
    before = scrape(cost_server.metrics_url)
    calls = [StreamCall(cost_server.grpc_url, r).start() for r in requests[:4]]
    calls[0].wait_progress(3)   # the rest join a running batch
    calls += [StreamCall(cost_server.grpc_url, r).start() for r in requests[4:]]
    results = [call.finish() for call in calls]
    after = scrape(cost_server.metrics_url)

    assert_each_streamed_and_matches(requests, results, diffusers_pixart)
    delta = delta_of(before, after, "dit")
    assert delta("ditserve_step_batch_size_sum") == sum(r.num_inference_steps for r in requests), \
        "one forward row per request per step: waiting rounds neither lose nor repeat a step"
    assert delta("ditserve_scheduler_waits_total") > 0, "with no batching gain, the scheduler held some back"
    assert after.get(("ditserve_state_table_size", "dit")) == 0
    assert after.get(("ditserve_late_queue_holds_total", "dit")) == 0, "exported, and a CPU never holds"


def test_generations_passed_over_wait_inside_the_execute(cost_server, diffusers_pixart):
    """Two shapes (two forwards that cannot share a batch) with no batching gain: `cost` steps one
    of them per round. The one passed over stays in dit's execute, so a round costs no trip
    through Triton's sequence batcher (`[engine] steps_per_execute`, 8): fewer executes than
    forwards, and both still get every step's progress and diffusers' image."""
    requests = [GenerationRequest("a red cat", seed=1, num_inference_steps=20),
                GenerationRequest("a blue bird", seed=2, num_inference_steps=20, height=96, width=64)]
    before = scrape(cost_server.metrics_url)
    calls = [StreamCall(cost_server.grpc_url, r).start() for r in requests]
    results = [call.finish() for call in calls]
    after = scrape(cost_server.metrics_url)

    assert_each_streamed_and_matches(requests, results, diffusers_pixart)
    delta = delta_of(before, after, "dit")
    forwards, executes = delta("ditserve_step_batch_size_count"), delta("nv_inference_exec_count")
    assert delta("ditserve_scheduler_waits_total") > 0, "one shape waited while the other stepped"
    assert executes * 2 <= forwards, f"{executes:.0f} dit executes for {forwards:.0f} forwards"
