"""txt2img / txt2img_stream served by the tiny Qwen-Image deployment on a real tritonserver,
through the real tritonclient, against plain diffusers QwenImagePipeline (guidance_scale as
its true_cfg_scale, the negative prompt always passed).

Parity tolerance: 1 uint8 level per value (tests/test_qwen_image_adapter.py says why, and
checks the true-CFG rescale on the latents, which the tiny VAE would hide).
"""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from diffusers import QwenImagePipeline
from tritonclient.utils import InferenceServerException

from ditserve.client import DitClient, GenerationRequest
from helpers import assert_matches, grpc_inputs, run_staggered_batched, scrape
from mmdit_helpers import QWEN_DEPLOYMENT, diffusers_qwen_image
from wan_helpers import oracle


@pytest.fixture(scope="module")
def qwen_pipe():
    return oracle(QwenImagePipeline, QWEN_DEPLOYMENT)


def expected(pipe, request: GenerationRequest) -> np.ndarray:
    negative = QWEN_DEPLOYMENT.defaults.negative_prompt if request.negative_prompt is None else request.negative_prompt
    return diffusers_qwen_image(pipe, request.prompt, request.seed, request.num_inference_steps,
                                request.guidance_scale, request.height or 64, request.width or 64, negative)


@pytest.mark.parametrize("protocol, request_", [
    ("http", GenerationRequest("a photo of a red cat", negative_prompt="blurry", seed=42, num_inference_steps=6,
                               guidance_scale=4.0, height=64, width=96)),
    ("grpc-stream", GenerationRequest("a dog", seed=7, num_inference_steps=5, guidance_scale=1.0)),
], ids=["http-true-cfg-negative-64x96", "grpc-stream-no-cfg"])
def test_parity_with_diffusers(qwen_server, qwen_pipe, protocol, request_):
    url = qwen_server.http_url if protocol == "http" else qwen_server.grpc_url
    with DitClient(url, protocol) as client:
        result = client.generate(request_)
    assert result.steps_reported == (request_.num_inference_steps if protocol == "grpc-stream" else 0)
    assert_matches(result.media, expected(qwen_pipe, request_))


def test_staggered_requests_of_mixed_sizes_batch_stepwise_and_match_diffusers(qwen_server, qwen_pipe):
    """Two 64x64 true-CFG requests (default negative prompt and their own) share forwards at
    different timesteps and guidance; a 96x64 one (another shift mu) runs beside them. The first
    runs 300 steps so that the second always joins it: a fast host finished 60 tiny steps before
    the second was admitted (as in tests/test_wan22.py); at 64x64 (not 128x128) those steps and
    their diffusers oracle stay cheap."""
    requests = [GenerationRequest("a red car", seed=11, num_inference_steps=300, guidance_scale=4.0,
                                  height=64, width=64),
                GenerationRequest("a blue sea", negative_prompt="dark", seed=22, num_inference_steps=30,
                                  guidance_scale=7.0, height=64, width=64),
                GenerationRequest("a green hill", seed=33, num_inference_steps=20, guidance_scale=3.0,
                                  height=96, width=64)]
    results = run_staggered_batched(qwen_server, requests, task="txt2img")
    for request, (progress, image) in zip(requests, results):
        assert [done for done, _ in progress] == list(range(1, request.num_inference_steps + 1))
        assert_matches(image, expected(qwen_pipe, request))


@pytest.mark.parametrize("inputs, words", [
    (dict(height=72), ["height", "multiple of 16"]),
    (dict(width=512), ["width", "[32, 256]"]),
    (dict(guidance_scale=31.0), ["guidance_scale", "[0.0, 30.0]"]),
    (dict(num_inference_steps=1), ["num_inference_steps", "[2, 400]"]),   # diffusers' 1-step schedule is NaN
])
def test_bad_inputs_are_rejected_by_name_before_model_work(qwen_server, inputs, words):
    before = scrape(qwen_server.metrics_url).get(("nv_inference_count", "text_encoder"), 0)
    with grpcclient.InferenceServerClient(qwen_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("txt2img", grpc_inputs(GenerationRequest("a cat", seed=1, **inputs)))
        for word in words:
            assert word in err.value.message(), err.value.message()
        assert scrape(qwen_server.metrics_url).get(("nv_inference_count", "text_encoder"), 0) == before
        image = client.infer("txt2img", grpc_inputs(GenerationRequest("a cat", seed=1, num_inference_steps=2)))
        assert image.as_numpy("image").shape == (64, 64, 3)
