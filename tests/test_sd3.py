"""txt2img / txt2img_stream served by the tiny Stable Diffusion 3.5 deployment on a real
tritonserver, through the real tritonclient, against plain diffusers StableDiffusion3Pipeline.

Parity tolerance: 1 uint8 level per value (tests/test_sd3_adapter.py says why).
"""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from diffusers import StableDiffusion3Pipeline
from tritonclient.utils import InferenceServerException

from ditserve.client import DitClient, GenerationRequest
from helpers import assert_matches, grpc_inputs, run_staggered_batched
from mmdit_helpers import SD3_DEPLOYMENT, diffusers_sd3_image
from wan_helpers import oracle


@pytest.fixture(scope="module")
def sd3_pipe():
    return oracle(StableDiffusion3Pipeline, SD3_DEPLOYMENT)


def expected(pipe, request: GenerationRequest) -> np.ndarray:
    return diffusers_sd3_image(pipe, request.prompt, request.seed, request.num_inference_steps,
                               request.guidance_scale, request.height or 64, request.width or 64,
                               request.negative_prompt or "")


@pytest.mark.parametrize("protocol, request_", [
    ("grpc", GenerationRequest("a photo of a red cat", negative_prompt="blurry", seed=42, num_inference_steps=6,
                               guidance_scale=5.0, height=64, width=96)),
    ("grpc-stream", GenerationRequest("a dog", seed=7, num_inference_steps=5, guidance_scale=1.0)),
], ids=["grpc-cfg-negative-64x96", "grpc-stream-no-cfg"])
def test_parity_with_diffusers(sd3_server, sd3_pipe, protocol, request_):
    with DitClient(sd3_server.grpc_url, protocol) as client:
        result = client.generate(request_)
    assert result.steps_reported == (request_.num_inference_steps if protocol == "grpc-stream" else 0)
    assert_matches(result.media, expected(sd3_pipe, request_))


def test_staggered_cfg_requests_of_mixed_sizes_batch_stepwise_and_match_diffusers(sd3_server, sd3_pipe):
    """Two 192x192 CFG requests share forwards at different timesteps and guidance; a 96x64 one
    runs beside them in its own group."""
    requests = [GenerationRequest("a red car", seed=11, num_inference_steps=300, guidance_scale=4.0,
                                  height=192, width=192),
                GenerationRequest("a blue sea", negative_prompt="dark", seed=22, num_inference_steps=50,
                                  guidance_scale=7.0, height=192, width=192),
                GenerationRequest("a green hill", seed=33, num_inference_steps=30, guidance_scale=3.0,
                                  height=96, width=64)]
    results = run_staggered_batched(sd3_server, requests, task="txt2img")
    for request, (progress, image) in zip(requests, results):
        assert [done for done, _ in progress] == list(range(1, request.num_inference_steps + 1))
        assert_matches(image, expected(sd3_pipe, request))


def test_a_size_beyond_the_limit_is_rejected_by_name(sd3_server):
    with grpcclient.InferenceServerClient(sd3_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("txt2img", grpc_inputs(GenerationRequest("a cat", seed=1, height=512)))
        assert "'height'=512" in err.value.message() and "[32, 256]" in err.value.message()
