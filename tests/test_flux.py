"""txt2img / txt2img_stream served by the tiny FLUX.1 deployment on a real tritonserver,
through the real tritonclient, against plain diffusers FluxPipeline.

Parity tolerance: 1 uint8 level per value. A request served alone runs the same one-row
forwards as diffusers (FLUX.1 has no CFG rows), measured bit-identical; requests sharing a
forward can move a last float bit (tests/test_flux_adapter.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from diffusers import FluxPipeline
from tritonclient.utils import InferenceServerException

from ditserve.client import DitClient, GenerationRequest
from mmdit_helpers import FLUX_DEPLOYMENT, diffusers_flux_image
from helpers import assert_matches, grpc_inputs, run_staggered_batched, scrape
from wan_helpers import oracle


@pytest.fixture(scope="module")
def flux_pipe():
    return oracle(FluxPipeline, FLUX_DEPLOYMENT)


def expected(pipe, request: GenerationRequest) -> np.ndarray:
    return diffusers_flux_image(pipe, request.prompt, request.seed, request.num_inference_steps,
                                request.guidance_scale, request.height or 64, request.width or 64)


@pytest.mark.parametrize("protocol", ["http", "grpc-stream"])
def test_parity_with_diffusers(flux_server, flux_pipe, protocol):
    url = flux_server.http_url if protocol == "http" else flux_server.grpc_url
    request = GenerationRequest("a photo of a red cat", seed=42, num_inference_steps=6, guidance_scale=3.5,
                                height=64, width=96)
    with DitClient(url, protocol) as client:
        result = client.generate(request)
    assert result.media.shape == (64, 96, 3) and result.seed == 42
    assert result.steps_reported == (6 if protocol == "grpc-stream" else 0)
    np.testing.assert_array_equal(result.media, expected(flux_pipe, request))


def test_staggered_requests_of_mixed_sizes_batch_stepwise_and_match_diffusers(flux_server, flux_pipe):
    """Two 192x192 requests share forwards at different timesteps, schedules and guidance; a
    96x64 one (another shift mu, so other sigmas) runs beside them in its own group. A tiny
    step takes milliseconds, so the first request is long enough for the second to join it."""
    requests = [GenerationRequest("a red car", seed=11, num_inference_steps=300, guidance_scale=3.5,
                                  height=192, width=192),
                GenerationRequest("a blue sea", seed=22, num_inference_steps=50, guidance_scale=5.0,
                                  height=192, width=192),
                GenerationRequest("a green hill", seed=33, num_inference_steps=30, guidance_scale=2.0,
                                  height=96, width=64)]
    results = run_staggered_batched(flux_server, requests, task="txt2img")
    for request, (progress, image) in zip(requests, results):
        assert [done for done, _ in progress] == list(range(1, request.num_inference_steps + 1))
        assert_matches(image, expected(flux_pipe, request))


@pytest.mark.parametrize("inputs, words", [
    (dict(negative_prompt="blurry"), ["negative_prompt", "flux", "guidance-distilled"]),
    (dict(guidance_scale=31.0), ["guidance_scale", "[0.0, 30.0]"]),
    (dict(height=72), ["height", "multiple of 16"]),
])
def test_bad_inputs_are_rejected_by_name_before_model_work(flux_server, inputs, words):
    before = scrape(flux_server.metrics_url).get(("nv_inference_count", "text_encoder"), 0)
    with grpcclient.InferenceServerClient(flux_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("txt2img", grpc_inputs(GenerationRequest("a cat", seed=1, **inputs)))
        for word in words:
            assert word in err.value.message()
        assert scrape(flux_server.metrics_url).get(("nv_inference_count", "text_encoder"), 0) == before
        # An empty negative prompt is what FLUX.1 has: accepted, and the server stays healthy.
        image = client.infer("txt2img", grpc_inputs(GenerationRequest("a cat", negative_prompt="", seed=1,
                                                                      num_inference_steps=1)))
        assert image.as_numpy("image").shape == (64, 64, 3)
