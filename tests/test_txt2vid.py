"""txt2vid / txt2vid_stream (tiny Wan2.1 T2V) on a real tritonserver, through the real tritonclient.

Parity tolerance: served frames equal plain diffusers `WanPipeline` at the same seed within
helpers.TOLERANCE uint8 levels. Both run the same fp32 CPU kernels; we run [negative, prompt] as one
transformer batch where diffusers runs two forwards, which can move a last float bit and so
cross a rounding boundary.
"""
from __future__ import annotations


import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import diffusers_video
from ditserve.client import DitClient, GenerationRequest
from ditserve.media import decode_mp4
from helpers import assert_matches, cancel_mid_denoise, grpc_inputs, run_staggered_batched, scrape, stage_calls

LUMA_TOLERANCE = 4.0   # mean |luma| levels after an MP4 round trip (measured 2.8 on the tiny model)
STREAM = "txt2vid_stream"


def video(prompt: str, **kwargs) -> GenerationRequest:
    return GenerationRequest(prompt, **{"seed": 1, "num_inference_steps": 4, "num_frames": 9, **kwargs})


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-stream"])
def test_parity_with_diffusers_on_every_protocol(wan_server, diffusers_wan, protocol):
    url = wan_server.http_url if protocol == "http" else wan_server.grpc_url
    graphed, eager = stage_calls(wan_server, "text_encoder")
    request = video("waves rolling onto a beach", seed=7, num_inference_steps=6, guidance_scale=5.0)
    with DitClient(url, protocol, task="txt2vid") as client:
        result = client.generate(request)
    assert result.media.shape == (9, 64, 64, 3) and result.seed == 7
    assert result.steps_reported == (6 if protocol == "grpc-stream" else 0)
    assert_matches(result.media, diffusers_video(diffusers_wan, request.prompt, 7, 6, 5.0, 9))
    # the deployment's [accel] text_encoder = "cuda_graphs": UMT5 ran from its graphs
    assert stage_calls(wan_server, "text_encoder") == (graphed + 1, eager)


def test_parity_without_cfg_and_at_another_shape(wan_server, diffusers_wan):
    request = video("a bird", seed=3, num_inference_steps=5, guidance_scale=1.0, num_frames=5, height=96, width=64,
                    negative_prompt="blurry")
    with DitClient(wan_server.grpc_url, "grpc", task="txt2vid") as client:
        served = client.generate(request).media
    expected = diffusers_video(diffusers_wan, "a bird", 3, 5, 1.0, 5, height=96, width=64, negative_prompt="blurry")
    assert_matches(served, expected)


def test_staggered_videos_batch_stepwise_and_each_matches_its_solo_run(wan_server):
    """Different seeds, step counts, frame counts (two compatibility groups) and arrival times. The
    first runs 300 steps so that the others always join it (as in the fast-tier test below)."""
    requests = [video("a red car", seed=11, num_inference_steps=300), video("a blue sea", seed=22, num_inference_steps=70),
                video("a green hill", seed=33, num_inference_steps=60, num_frames=5),
                video("a dark sky", seed=44, num_inference_steps=50, guidance_scale=1.0)]
    results = run_staggered_batched(wan_server, requests, task="txt2vid")
    with DitClient(wan_server.grpc_url, "grpc", task="txt2vid") as client:
        for request, (progress, frames) in zip(requests, results):
            assert [done for done, _ in progress] == list(range(1, request.num_inference_steps + 1))
            assert_matches(frames, client.generate(request).media)


def test_mp4_output_decodes_back_to_the_raw_frames(wan_server):
    request = video("a spinning top", seed=5, num_frames=17, fps=12, output_format="mp4")
    with DitClient(wan_server.grpc_url, "grpc-stream", task="txt2vid") as client:
        result = client.generate(request)
    frames, fps = decode_mp4(result.video_mp4)
    assert frames.shape == result.media.shape == (17, 64, 64, 3) and fps == 12
    # Random-weight frames are close to noise, whose colour 4:2:0 chroma subsampling cannot
    # keep; compare luma (BT.709), which H.264 keeps at full resolution.
    error = np.abs(luma(frames) - luma(result.media))
    assert error.mean() < LUMA_TOLERANCE, f"codec luma error mean {error.mean():.2f} levels"


def luma(frames: np.ndarray) -> np.ndarray:
    return frames.astype(float) @ np.array([0.2126, 0.7152, 0.0722])


def test_raw_requests_get_no_mp4(wan_server):
    with grpcclient.InferenceServerClient(wan_server.grpc_url) as client:
        result = client.infer("txt2vid", grpc_inputs(video("x", num_inference_steps=2)))
    assert result.as_numpy("video").shape == (9, 64, 64, 3) and result.as_numpy("video_mp4") is None


def stream_outputs(url: str, request: GenerationRequest, names: list[str]) -> list[set[str]]:
    """The output names of every response to one streamed request that asks for `names`."""
    responses: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(STREAM, grpc_inputs(request),
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in names])
        seen = []
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            response = result.get_response()
            seen.append({output.name for output in response.outputs})
            if "video" in seen[-1]:
                client.stop_stream()
                return seen


@pytest.mark.parametrize("names", [["video"], ["video", "progress"], ["progress", "seed", "video"]])
def test_streamed_responses_carry_only_the_requested_outputs(wan_server, names):
    # An output the client did not ask for crashes the 2.51 stub on a CUDA host when a
    # decoupled model sends it (perf/results/2026-11-29-h200-gpu-matrix.md).
    seen = stream_outputs(wan_server.grpc_url, video("only what was asked", num_inference_steps=3), names)
    progress = seen[:-1]
    assert seen[-1] == set(names) - {"progress"}
    assert progress == ([{"progress"}] * 3 if "progress" in names else [])


def test_cancel_mid_video_frees_state_and_never_decodes(wan_server):
    cancel_mid_denoise(wan_server, video("doomed", num_inference_steps=60), "txt2vid")
    with DitClient(wan_server.grpc_url, "grpc", task="txt2vid") as client:
        assert client.generate(video("next", num_inference_steps=2)).media.shape == (9, 64, 64, 3)


@pytest.mark.parametrize("inputs, field", [
    (dict(num_frames=10), "num_frames"),          # not 4k + 1
    (dict(num_frames=85), "num_frames"),          # above max_frames
    (dict(fps=0), "fps"),
    (dict(output_format="gif"), "output_format"),
    (dict(height=72), "height"),
])
def test_bad_video_inputs_are_rejected_before_any_model_work(wan_server, inputs, field):
    with grpcclient.InferenceServerClient(wan_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("txt2vid", grpc_inputs(video("x", **inputs)))
    assert field in err.value.message() and err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_image_models_reject_video_inputs(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="num_frames"):
            client.infer("txt2img", grpc_inputs(GenerationRequest("x", num_inference_steps=1, num_frames=9)))


def test_a_family_with_one_transformer_refuses_guidance_scale_2(wan_server):
    """Only two-expert deployments (wan22-t2v) declare `guidance_scale_2`: Triton refuses it by name
    here, before our model sees the request (tests/test_schema.py: dit's own check)."""
    with grpcclient.InferenceServerClient(wan_server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="guidance_scale_2"):
            client.infer("txt2vid", grpc_inputs(video("a cat", guidance_scale_2=2.0)))
        inputs = client.get_model_metadata("txt2vid", as_json=True)["inputs"]
        assert "guidance_scale_2" not in {spec["name"] for spec in inputs}


def test_fast_tier_reuses_steps_and_a_lossless_video_beside_it_stays_exact(wan_server):
    """Quality tiers on Wan (its block list cached per request, ditserve/cache.py): a `fast`
    request says how many steps it reused; a `lossless` request step-batched with `fast` ones
    matches its solo result as plain step batching does (the exact half: tests/test_cache.py)."""
    lossless = video("a paper boat", seed=5, num_inference_steps=60)
    # The first runs long, so that the others always join it (a fast host finishes 60 tiny steps
    # before the next request is admitted).
    fast = [video("a paper boat", seed=6 + i, num_inference_steps=steps, quality="fast")
            for i, steps in enumerate((300, 60))]
    with DitClient(wan_server.grpc_url, "grpc", task="txt2vid") as client:
        solo = client.generate(lossless)
        fast_solo = client.generate(fast[0])
    assert solo.cache_hits == 0 and fast_solo.cache_hits >= 1
    hits = scrape(wan_server.metrics_url).get(("ditserve_cache_hits_total", "dit"), 0.0)
    results = run_staggered_batched(wan_server, [fast[0], lossless, fast[1]], task="txt2vid")
    assert scrape(wan_server.metrics_url).get(("ditserve_cache_hits_total", "dit"), 0.0) > hits
    assert_matches(results[1][1], solo.media)
