"""`[engine] in_flight` > capacity on a real tritonserver (tiny PixArt, step mode): the extra
generations wait, encoded, in dit's sequence backlog and take a slot as soon as one frees, so a
generation denoises while another decodes; dit never steps more than its capacity, and every
result still equals diffusers'."""
from __future__ import annotations

import time

import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, TINY_PIXART, rendered_server, serve
from ditserve.client import GenerationRequest
from ditserve.deployment import write_variant
from helpers import StreamCall, histogram_above, scrape
from test_step_batching import assert_each_streamed_and_matches

DECODE_S = 2.0   # every VAE decode sleeps this long (fault injection), standing in for a slow decode


@pytest.fixture(scope="module")
def in_flight_server(tmp_path_factory):
    deployment = tmp_path_factory.mktemp("in-flight-deployment") / "tiny-pixart-in-flight.toml"
    write_variant(ROOT / "configs" / "tiny-pixart-sigma.toml", deployment, {"capacity": 1, "in_flight": 2},
                  "tests/test_in_flight.py")
    with deployment.open("a") as toml:
        toml.write(f'\n[[faults.rules]]\npoint = "decode"\naction = "sleep"\nseconds = {DECODE_S}\n')
    yield from serve(rendered_server(tmp_path_factory, deployment, TINY_PIXART, "in-flight-server"))


def test_a_generation_denoises_while_another_decodes(in_flight_server, diffusers_pixart):
    config = grpcclient.InferenceServerClient(in_flight_server.grpc_url).get_model_config("txt2img_stream").config
    assert sum(group.count for group in config.instance_group) == 2, "public instances = in_flight"
    requests = [GenerationRequest("a red cat", seed=1, num_inference_steps=8),
                GenerationRequest("a blue bird", seed=2, num_inference_steps=8)]
    big_batches = histogram_above(in_flight_server.metrics_url, "ditserve_step_batch_size", "dit", "1")
    executes = scrape(in_flight_server.metrics_url)[("nv_inference_exec_count", "dit")]
    first = StreamCall(in_flight_server.grpc_url, requests[0]).start()
    time.sleep(0.2)
    second = StreamCall(in_flight_server.grpc_url, requests[1]).start()
    results = [first.finish(), second.finish()]

    assert second.progress_at[0] < first.finished_at - DECODE_S / 2, \
        "the second generation started denoising while the first one was still decoding"
    assert histogram_above(in_flight_server.metrics_url, "ditserve_step_batch_size", "dit", "1") == big_batches, \
        "dit never stepped more generations than its capacity (1)"
    assert_each_streamed_and_matches(requests, results, diffusers_pixart)
    # With dit full, a handed-over generation waiting for the slot cannot join before the running one
    # ends, so the running one keeps stepping in one execute ([engine] steps_per_execute, default 8).
    executes = scrape(in_flight_server.metrics_url)[("nv_inference_exec_count", "dit")] - executes
    assert executes <= 4, f"{executes:.0f} dit executes for two 8-step generations"
