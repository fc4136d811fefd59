"""txt2img / txt2img_stream on a real tritonserver, through the real tritonclient.

Parity tolerance: the served image must equal diffusers' within 1 uint8 level per
pixel (max abs diff <= 1). Both run the same fp32 CPU kernels in the same order; the
only difference is that we encode [negative, prompt] in one T5 batch and diffusers in
two calls, which may flip a last float bit and so at most one rounding boundary.
Measured: max diff 0 on every case below.
"""
from __future__ import annotations

import queue
import signal
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, diffusers_image
from ditserve.client import DitClient, GenerationRequest
from helpers import assert_matches, settled_scrape, wait_for_metric



@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-stream"])
def test_parity_with_diffusers_on_every_protocol(server, diffusers_pixart, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    request = GenerationRequest("a photo of a red cat", seed=42, num_inference_steps=8, guidance_scale=4.5)
    with DitClient(url, protocol) as client:
        result = client.generate(request)
    assert result.seed == 42
    assert_matches(result.media, diffusers_image(diffusers_pixart, request.prompt, 42, 8, 4.5))


@pytest.mark.parametrize("height, width, guidance, negative", [
    (96, 64, 1.0, None),         # no CFG, non-square
    (32, 128, 7.0, "blurry"),    # CFG with a negative prompt
])
def test_parity_other_shapes_and_guidance(server, diffusers_pixart, height, width, guidance, negative):
    request = GenerationRequest("a dog in the snow", negative_prompt=negative, height=height, width=width,
                                num_inference_steps=5, guidance_scale=guidance, seed=7)
    with DitClient(server.grpc_url, "grpc") as client:
        result = client.generate(request)
    assert result.media.shape == (height, width, 3)
    expected = diffusers_image(diffusers_pixart, request.prompt, 7, 5, guidance, height, width, negative or "")
    assert_matches(result.media, expected)


def test_stream_reports_every_step_then_the_image(server):
    progress = []
    with DitClient(server.grpc_url, "grpc-stream") as client:
        result = client.generate(GenerationRequest("a castle", num_inference_steps=6, seed=3),
                                 on_progress=lambda done, total: progress.append((done, total)))
    assert progress == [(i, 6) for i in range(1, 7)]
    assert result.media.shape == (64, 64, 3)


def test_unary_model_answers_a_grpc_stream_with_one_response(server):
    """`txt2img` is not decoupled, so a streaming gRPC client gets exactly one response."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = GenerationRequest("a boat", seed=5, num_inference_steps=3).infer_inputs(grpcclient)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("txt2img", inputs)
    result, error = responses.get(timeout=120)
    client.stop_stream()
    client.close()
    assert error is None and result.as_numpy("image").shape == (64, 64, 3)
    assert responses.empty()


def test_missing_seed_is_drawn_returned_and_reproducible(server):
    with DitClient(server.grpc_url, "grpc") as client:
        first = client.generate(GenerationRequest("a forest", num_inference_steps=3))
        again = client.generate(GenerationRequest("a forest", num_inference_steps=3, seed=first.seed))
    assert np.array_equal(first.media, again.media)


@pytest.mark.parametrize("field, value, words", [
    ("height", 72, ["height", "multiple of 16"]),
    ("width", 1024, ["width", "[32, 256]"]),
    ("num_inference_steps", 0, ["num_inference_steps", "[1, 100]"]),
    ("guidance_scale", -2.0, ["guidance_scale", "[0.0, 30.0]"]),
    ("prompt", "", ["prompt", "empty"]),
    ("prompt", "x" * 5000, ["prompt", "4096"]),
])
def test_bad_input_is_rejected_and_the_server_stays_healthy(server, field, value, words):
    request = GenerationRequest("a cat", seed=1, num_inference_steps=2)
    setattr(request, field, value)
    for protocol in ("http", "grpc-stream"):
        url = server.http_url if protocol == "http" else server.grpc_url
        with DitClient(url, protocol) as client, pytest.raises(InferenceServerException) as err:
            client.generate(request, timeout_s=60)
        for word in words:
            assert word in err.value.message()
    with httpclient.InferenceServerClient(server.http_url) as health:
        assert health.is_server_ready()
    with DitClient(server.grpc_url, "grpc") as client:
        assert client.generate(GenerationRequest("a cat", seed=1, num_inference_steps=2)).media.shape == (64, 64, 3)


def test_wrong_dtype_is_rejected_by_name(server):
    prompt = httpclient.InferInput("prompt", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"a cat"], dtype=np.object_))
    steps = httpclient.InferInput("num_inference_steps", [1], "FP32")
    steps.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    with httpclient.InferenceServerClient(server.http_url) as client, \
            pytest.raises(InferenceServerException, match="num_inference_steps"):
        client.infer("txt2img", [prompt, steps])


def test_cli_writes_a_png_with_a_progress_bar(server, tmp_path):
    out = tmp_path / "cat.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate.py"), "a cat", "--seed", "1", "--steps", "4",
         "--url", server.grpc_url, "--output", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "4/4" in proc.stderr  # the tqdm bar reached the last step
    from PIL import Image

    assert Image.open(out).size == (64, 64)


@pytest.mark.parametrize("protocol", ["grpc-stream", "http"])
def test_cli_ctrl_c_cancels_the_generation_on_the_server(server, tmp_path, protocol):
    """SIGINT mid-denoise: the CLI cancels by request id, the server counts one cancel of the model
    it called and decodes nothing, and the CLI says so and exits 130 without a traceback."""
    model = "txt2img_stream" if protocol == "grpc-stream" else "txt2img"
    before = settled_scrape(server.metrics_url)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "generate.py"), "a slow cat", "--steps", "100", "--height", "256",
         "--width", "256", "--protocol", protocol, "--url", server.http_url if protocol == "http" else server.grpc_url,
         "--output", str(tmp_path / "never.png")], stderr=subprocess.PIPE, text=True)
    first_steps = ("ditserve_time_to_first_step_seconds_count", model)
    expected = before.get(first_steps, 0) + 1
    assert wait_for_metric(server.metrics_url, *first_steps, expected) == expected   # it denoises
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "cancelled on the server" in stderr and "Traceback" not in stderr, stderr
    expected = before.get(("ditserve_requests_cancelled_total", model), 0) + 1
    assert wait_for_metric(server.metrics_url, "ditserve_requests_cancelled_total", model, expected) == expected
    decodes = ("nv_inference_count", "vae_decode")
    assert settled_scrape(server.metrics_url).get(decodes, 0) == before.get(decodes, 0)
    assert not (tmp_path / "never.png").exists()


def test_cli_reports_a_bad_request_clearly(server, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate.py"), "a cat", "--height", "70",
         "--url", server.grpc_url, "--output", str(tmp_path / "x.png")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1 and "height" in proc.stderr and "multiple of 16" in proc.stderr
