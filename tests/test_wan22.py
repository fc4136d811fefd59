"""txt2vid / txt2vid_stream served by the tiny Wan2.2 A14B deployment (two experts) on a real
tritonserver, through the real tritonclient, against plain diffusers WanPipeline.

The experts have different random weights (tests/test_wan22_adapter.py), so a row run by the
wrong expert would not match. Parity tolerance: 1 uint8 level (tests/test_wan_adapter.py says why).
"""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from diffusers import WanPipeline
from tritonclient.utils import InferenceServerException

from conftest import WAN22_DEPLOYMENT, diffusers_video
from ditserve.client import DitClient, GenerationRequest
from ditserve.deployment import load_deployment
from helpers import assert_matches, grpc_inputs, run_staggered_batched
from wan_helpers import oracle


@pytest.fixture(scope="module")
def wan22_pipe():
    return oracle(WanPipeline, load_deployment(WAN22_DEPLOYMENT))


def expected(pipe, request: GenerationRequest, guidance_scale_2: float | None = None):
    return diffusers_video(pipe, request.prompt, request.seed, request.num_inference_steps, request.guidance_scale,
                           request.num_frames, request.height or 64, request.width or 64,
                           request.negative_prompt or "", guidance_scale_2=guidance_scale_2)


@pytest.mark.parametrize("protocol", ["http", "grpc-stream"])
def test_parity_with_diffusers_across_the_expert_boundary(wan22_server, wan22_pipe, protocol):
    """10 steps: 4 of the high-noise expert, 6 of the low-noise one."""
    url = wan22_server.http_url if protocol == "http" else wan22_server.grpc_url
    request = GenerationRequest("waves rolling onto a beach", negative_prompt="blurry", seed=7,
                                num_inference_steps=10, guidance_scale=4.0, num_frames=9)
    with DitClient(url, protocol, task="txt2vid") as client:
        result = client.generate(request)
    assert result.media.shape == (9, 64, 64, 3)
    assert result.steps_reported == (10 if protocol == "grpc-stream" else 0)
    assert_matches(result.media, expected(wan22_pipe, request))


def test_staggered_videos_straddling_the_boundary_and_of_mixed_sizes_match_diffusers(wan22_server, wan22_pipe):
    """The second request joins the first mid-denoise. The first has 400 steps (the deployment's
    max_steps), so it runs the high-noise expert for its first 121 and is still running when the
    second (48 steps: 15 high-noise, then low-noise) joins: they share the high-noise expert for
    some steps, then their rows need different experts in one step batch (the adapter test shows
    the split forwards). Triton hands dit both requests in some executes only (11-15 of the 15
    shared steps in six runs on this CPU; with 16 steps, 5 high-noise, a run shared none now and
    then). The third is another size and runs without CFG."""
    requests = [GenerationRequest("a red car", seed=11, num_inference_steps=400, guidance_scale=5.0, num_frames=9),
                GenerationRequest("a blue sea", negative_prompt="dark", seed=22, num_inference_steps=48,
                                  guidance_scale=3.0, num_frames=9),
                GenerationRequest("a green hill", seed=33, num_inference_steps=12, guidance_scale=1.0, num_frames=5,
                                  height=48, width=32)]
    results = run_staggered_batched(wan22_server, requests, task="txt2vid")
    for request, (progress, frames) in zip(requests, results):
        assert [done for done, _ in progress] == list(range(1, request.num_inference_steps + 1))
        assert_matches(frames, expected(wan22_pipe, request))


def test_a_separate_low_noise_guidance_scale_matches_diffusers(wan22_server, wan22_pipe):
    """Input `guidance_scale_2` guides the low-noise expert's steps (diffusers' WanPipeline
    `guidance_scale_2`). The second request (32 steps: 10 high-noise, then 22 low-noise; no
    `guidance_scale_2`: its `guidance_scale` guides both experts) starts once the first (200
    steps, low-noise scale 1.5, high-noise for its first 61) has done 70, so they share low-noise
    forwards (21-22 of 22 in five runs on this CPU), each row guided with its own scale."""
    requests = [GenerationRequest("a red kite", seed=5, num_inference_steps=200, guidance_scale=4.0,
                                  guidance_scale_2=1.5, num_frames=9),
                GenerationRequest("a grey owl", seed=6, num_inference_steps=32, guidance_scale=3.0, num_frames=9)]
    results = run_staggered_batched(wan22_server, requests, task="txt2vid", wait_steps=70)
    (_, low_scaled), (_, plain) = results
    assert_matches(low_scaled, expected(wan22_pipe, requests[0], guidance_scale_2=1.5))
    assert_matches(plain, expected(wan22_pipe, requests[1]))
    single = np.abs(low_scaled.astype(int) - expected(wan22_pipe, requests[0]).astype(int))
    assert single.max() > 1, "guidance_scale_2 changed nothing: the low-noise steps ignored it"


@pytest.mark.parametrize("inputs, words", [
    (dict(num_frames=8), ["num_frames", "4 x k + 1"]),
    (dict(height=72), ["height", "multiple of 16"]),
    (dict(guidance_scale=31.0), ["guidance_scale", "[0.0, 30.0]"]),
    (dict(guidance_scale_2=31.0), ["guidance_scale_2", "[0.0, 30.0]"]),
    (dict(guidance_scale=1.0, guidance_scale_2=3.0), ["guidance_scale_2", "guidance_scale > 1"]),
])
def test_bad_inputs_are_rejected_by_name(wan22_server, inputs, words):
    with grpcclient.InferenceServerClient(wan22_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("txt2vid", grpc_inputs(GenerationRequest("a cat", seed=1, **inputs)))
        for word in words:
            assert word in err.value.message(), err.value.message()
        video = client.infer("txt2vid", grpc_inputs(GenerationRequest("a cat", seed=1, num_inference_steps=2,
                                                                      num_frames=5)))
        assert video.as_numpy("video").shape == (5, 64, 64, 3)
