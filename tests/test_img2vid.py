"""img2vid / img2vid_stream (tiny Wan2.1 I2V) on a real tritonserver, through the real tritonclient.

The conditioning image goes through `vae_encode` (CLIP image embeddings + first-frame VAE
condition), then `dit` steps it like any video request. Parity with plain diffusers
`WanImageToVideoPipeline` at the same seed: helpers.TOLERANCE uint8 levels (why: test_wan_adapter.py).
"""
from __future__ import annotations

import numpy as np
import PIL.Image
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ditserve.client import DitClient, GenerationRequest
from helpers import assert_matches, cancel_mid_denoise, grpc_inputs, run_staggered_batched, scrape, wait_for_metric
from wan_helpers import conditioning_image

STREAM = "img2vid_stream"


@pytest.fixture(scope="module")
def diffusers_i2v():
    from diffusers import WanImageToVideoPipeline

    from conftest import TINY_WAN_I2V

    pipe = WanImageToVideoPipeline.from_pretrained(str(TINY_WAN_I2V))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def request(prompt: str, seed: int = 1, image_seed: int = 0, **kwargs) -> GenerationRequest:
    return GenerationRequest(prompt, **{"seed": seed, "num_inference_steps": 4, "num_frames": 9,
                                        "image": conditioning_image(image_seed), **kwargs})


def expected_video(pipe, req: GenerationRequest) -> np.ndarray:
    frames = pipe(PIL.Image.fromarray(req.image), req.prompt, negative_prompt=req.negative_prompt or "",
                  height=req.height or 64, width=req.width or 64, num_frames=req.num_frames,
                  num_inference_steps=req.num_inference_steps, guidance_scale=req.guidance_scale or 5.0,
                  generator=torch.Generator("cpu").manual_seed(req.seed), max_sequence_length=512,
                  output_type="np").frames
    return (frames[0] * 255).round().astype(np.uint8)


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-stream"])
def test_parity_with_diffusers_on_every_protocol(i2v_server, diffusers_i2v, protocol):
    url = i2v_server.http_url if protocol == "http" else i2v_server.grpc_url
    req = request("the cat turns its head", seed=7, num_inference_steps=5)
    with DitClient(url, protocol, task="img2vid") as client:
        result = client.generate(req)
    assert result.media.shape == (9, 64, 64, 3)
    assert result.steps_reported == (5 if protocol == "grpc-stream" else 0)
    assert_matches(result.media, expected_video(diffusers_i2v, req))


def test_parity_without_cfg_from_a_tall_image(i2v_server, diffusers_i2v):
    req = request("waves", seed=3, image_seed=4, guidance_scale=1.0, num_frames=5, height=96, width=64)
    req.image = conditioning_image(4, height=120, width=30)
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid") as client:
        served = client.generate(req).media
    assert_matches(served, expected_video(diffusers_i2v, req))


def test_staggered_i2v_requests_batch_stepwise_and_each_matches_its_solo_run(i2v_server):
    """Different images, seeds and step counts: their conditioning is per-request state. The first
    runs 300 steps so that the others always join it (a fast host finished 100 tiny Wan2.2 steps
    before the next request was admitted: tests/test_wan22.py)."""
    requests = [request("a", seed=1, image_seed=1, num_inference_steps=300),
                request("b", seed=2, image_seed=2, num_inference_steps=70),
                request("c", seed=3, image_seed=3, num_inference_steps=60)]
    results = run_staggered_batched(i2v_server, requests, task="img2vid")
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid") as client:
        for req, (_, frames) in zip(requests, results):
            assert_matches(frames, client.generate(req).media)


def test_fast_tier_reuses_steps_and_a_lossless_video_beside_it_stays_exact(i2v_server):
    """Quality tiers on img2vid (issue 20): a `fast` request reports the steps it reused, over a
    stream as over unary gRPC, and `ditserve_cache_hits_total` moves by exactly that; a
    `lossless` request step-batched between two `fast` ones (their image conditioning in the same
    forward) equals its solo result. The first `fast` request runs 300 steps, so the others always
    join it."""
    lossless = request("the cat turns its head", seed=5, image_seed=5, num_inference_steps=60)
    fast = [request("the cat turns its head", seed=6 + i, image_seed=6 + i, num_inference_steps=steps, quality="fast")
            for i, steps in enumerate((300, 60))]
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid") as client:
        solo = client.generate(lossless)
    before = scrape(i2v_server.metrics_url).get(("ditserve_cache_hits_total", "dit"), 0.0)
    with DitClient(i2v_server.grpc_url, "grpc-stream", task="img2vid") as client:
        fast_solo = client.generate(fast[1])
    assert solo.cache_hits == 0 and 0 < fast_solo.cache_hits < 60
    counted = wait_for_metric(i2v_server.metrics_url, "ditserve_cache_hits_total", "dit", before + fast_solo.cache_hits)
    assert counted - before == fast_solo.cache_hits
    results = run_staggered_batched(i2v_server, [fast[0], lossless, fast[1]], task="img2vid")
    assert [len(progress) for progress, _ in results] == [300, 60, 60]
    assert scrape(i2v_server.metrics_url).get(("ditserve_cache_hits_total", "dit"), 0.0) > counted
    assert_matches(results[1][1], solo.media)
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid") as client:
        with pytest.raises(InferenceServerException, match=r"allowed: \['lossless', 'balanced', 'fast'\]"):
            client.generate(request("x", quality="turbo"))


def test_cancel_mid_i2v_frees_state_and_never_decodes(i2v_server):
    """Cancelled by request id: the img2vid repository has its own `cancel` model too."""
    cancel_mid_denoise(i2v_server, request("doomed", num_inference_steps=80), "img2vid", by_id=True)
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid") as client:
        assert client.generate(request("next", num_inference_steps=2)).media.shape == (9, 64, 64, 3)


@pytest.mark.parametrize("image, words", [
    (np.zeros((32, 32, 4), np.uint8), "shape"),          # RGBA: wrong channel count
    (np.zeros((32, 32), np.uint8), "shape"),             # grey, no channel axis
    (np.zeros((0, 32, 3), np.uint8), "image"),           # zero-sized
    (np.zeros((1100, 8, 3), np.uint8), "1024"),          # above max_image_side
    (np.zeros((32, 32, 3), np.float32), "UINT8"),        # not uint8
])
def test_bad_images_are_rejected_before_any_model_work(i2v_server, image, words):
    before = scrape(i2v_server.metrics_url).get(("nv_inference_count", "vae_encode"), 0)
    inputs = grpc_inputs(GenerationRequest("x", seed=1, num_inference_steps=2, num_frames=9))
    tensor = grpcclient.InferInput("image", list(image.shape), "FP32" if image.dtype == np.float32 else "UINT8")
    tensor.set_data_from_numpy(image)
    with grpcclient.InferenceServerClient(i2v_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("img2vid", [*inputs, tensor])
        assert words.lower() in err.value.message().lower(), err.value.message()
        assert client.is_server_ready()
    assert scrape(i2v_server.metrics_url).get(("nv_inference_count", "vae_encode"), 0) == before
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid") as client:
        assert client.generate(request("next", num_inference_steps=2)).media.shape == (9, 64, 64, 3)


def test_img2vid_requires_its_image(i2v_server):
    with grpcclient.InferenceServerClient(i2v_server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="image"):
            client.infer("img2vid", grpc_inputs(GenerationRequest("x", num_inference_steps=1)))


def test_video_lands_in_a_system_shared_memory_region_as_for_txt2vid(i2v_server):
    req = request("into shared memory", seed=5, num_inference_steps=2, height=64, width=64, output_format="mp4")
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid") as plain:
        expected = plain.generate(req).media
    with DitClient(i2v_server.grpc_url, "grpc", task="img2vid", shm="system") as client:
        result = client.generate(req)
        assert client.pool.regions[0].byte_size == 9 * 64 * 64 * 3
    assert np.array_equal(result.media, expected) and result.video_mp4[4:8] == b"ftyp"
    with grpcclient.InferenceServerClient(i2v_server.grpc_url) as client:
        assert not client.get_system_shared_memory_status().regions, "regions unregistered on close"
