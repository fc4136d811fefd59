"""Bad inputs through the real server, beyond tests/test_schema.py and tests/test_txt2img.py
(docs/reliability.md has the whole matrix): each gets one clear error naming the input,
costs no model work, and leaves the server ready for the next request."""
from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ditserve.client import GenerationRequest
from helpers import grpc_inputs, scrape

MODELS = ("txt2img", "txt2img_stream")


def _tensor(module, name: str, value: np.ndarray, dtype: str):
    tensor = module.InferInput(name, list(value.shape), dtype)
    tensor.set_data_from_numpy(value)
    return tensor


def _prompt(module=grpcclient, value=b"a cat", shape=(1,)):
    return _tensor(module, "prompt", np.array([value] * int(np.prod(shape)), dtype=np.object_).reshape(shape), "BYTES")


def _steps(module=grpcclient, n=2):
    return _tensor(module, "num_inference_steps", np.array([n], dtype=np.int32), "INT32")


def _stream_error(server, model: str, inputs: list, outputs=None, **kwargs) -> str:
    """The terminal response of a gRPC stream (after any progress), which must be an error and
    the last response; returns its message."""
    import queue

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(model, inputs, outputs=outputs, **kwargs)
    while True:
        result, error = responses.get(timeout=60)
        if error is not None or result.as_numpy("progress") is None:
            break
    client.stop_stream()   # returns once the server closed the stream
    client.close()
    assert error is not None, "expected an error"
    assert responses.empty(), "a response after the terminal one"
    return error.message()


def _errors(server, inputs_for, outputs=None, **kwargs) -> list[str]:
    """The error of the request on txt2img (gRPC unary and HTTP) and txt2img_stream (gRPC stream)."""
    messages = []
    with grpcclient.InferenceServerClient(server.grpc_url) as client, pytest.raises(InferenceServerException) as err:
        client.infer("txt2img", inputs_for(grpcclient), outputs=outputs and [grpcclient.InferRequestedOutput(o)
                                                                              for o in outputs], **kwargs)
    messages.append(err.value.message())
    with httpclient.InferenceServerClient(server.http_url) as client, pytest.raises(InferenceServerException) as err:
        client.infer("txt2img", inputs_for(httpclient), outputs=outputs and [httpclient.InferRequestedOutput(o)
                                                                              for o in outputs], **kwargs)
    messages.append(err.value.message())
    messages.append(_stream_error(server, "txt2img_stream", inputs_for(grpcclient),
                                  outputs=outputs and [grpcclient.InferRequestedOutput(o) for o in outputs], **kwargs))
    return messages


@pytest.fixture
def no_model_work_and_still_healthy(server):
    """Rejections cost no model work (no encode), and the next good request succeeds."""
    before = scrape(server.metrics_url)
    yield
    after = scrape(server.metrics_url)
    assert after.get(("nv_inference_count", "text_encoder"), 0) == before.get(("nv_inference_count", "text_encoder"), 0)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready() and all(client.is_model_ready(m) for m in MODELS)
        result = client.infer("txt2img", grpc_inputs(GenerationRequest("ok", seed=1, num_inference_steps=1)))
        assert result.as_numpy("image").shape == (64, 64, 3)


# Rejected by Triton itself, from the I/O that auto_complete_config declares.
@pytest.mark.parametrize("case, inputs_for, words", [
    ("missing prompt", lambda m: [_steps(m)], ["prompt"]),
    ("extra input", lambda m: [_prompt(m), _tensor(m, "colour", np.array([1], dtype=np.int32), "INT32")],
     ["colour"]),
    ("prompt shape [2]", lambda m: [_prompt(m, shape=(2,))], ["prompt", "shape"]),
    ("prompt shape [1, 1]", lambda m: [_prompt(m, shape=(1, 1))], ["prompt", "shape"]),
    ("prompt shape [0]", lambda m: [_prompt(m, shape=(0,))], ["prompt", "shape"]),
    ("prompt shape [4096]", lambda m: [_prompt(m, shape=(4096,))], ["prompt", "shape"]),
    ("seed INT32", lambda m: [_prompt(m), _tensor(m, "seed", np.array([1], dtype=np.int32), "INT32")],
     ["seed", "INT64"]),
])
@pytest.mark.usefixtures("no_model_work_and_still_healthy")
def test_triton_rejects_malformed_requests_by_name(server, case, inputs_for, words):
    for message in _errors(server, inputs_for):
        for word in words:
            assert word in message, (case, message)


@pytest.mark.usefixtures("no_model_work_and_still_healthy")
def test_an_unknown_requested_output_is_rejected(server):
    for message in _errors(server, lambda m: [_prompt(m)], outputs=["latents"]):
        assert "latents" in message


# Rejected by our validation (ditserve.schema), before any model work.
@pytest.mark.parametrize("case, inputs_for, words", [
    ("guidance NaN", lambda m: [_prompt(m), _tensor(m, "guidance_scale", np.array([np.nan], np.float32), "FP32")],
     ["guidance_scale", "finite"]),
    ("guidance inf", lambda m: [_prompt(m), _tensor(m, "guidance_scale", np.array([np.inf], np.float32), "FP32")],
     ["guidance_scale", "finite"]),
    ("seed -1", lambda m: [_prompt(m), _tensor(m, "seed", np.array([-1], np.int64), "INT64")],
     ["seed", "[0, 9223372036854775807]"]),
    ("steps 101", lambda m: [_prompt(m), _steps(m, 101)], ["num_inference_steps", "[1, 100]"]),
    ("negative prompt too long", lambda m: [_prompt(m), _tensor(m, "negative_prompt",
                                                                 np.array([b"x" * 4097], np.object_), "BYTES")],
     ["negative_prompt", "4096 bytes"]),
])
@pytest.mark.usefixtures("no_model_work_and_still_healthy")
def test_out_of_range_values_are_rejected_by_name_and_limit(server, case, inputs_for, words):
    for message in _errors(server, inputs_for):
        for word in words:
            assert word in message, (case, message)


@pytest.mark.usefixtures("no_model_work_and_still_healthy")
def test_invalid_utf8_prompt_is_rejected(server):
    # HTTP's JSON cannot carry invalid UTF-8, so gRPC (unary and stream) only.
    bad = lambda: [_prompt(grpcclient, b"\xff\xfe a cat")]  # noqa: E731
    with grpcclient.InferenceServerClient(server.grpc_url) as client, pytest.raises(InferenceServerException) as err:
        client.infer("txt2img", bad())
    for message in (err.value.message(), _stream_error(server, "txt2img_stream", bad())):
        assert "prompt" in message and "UTF-8" in message


def test_request_timeout_is_a_deadline_naming_the_stage(server):
    """Triton's request-level `timeout` (us) bounds the whole generation; 0 means none."""
    slow = GenerationRequest("slow", seed=1, num_inference_steps=100, height=256, width=256)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("txt2img", grpc_inputs(slow), timeout=200_000)
        assert "timeout of 0.2 s expired" in err.value.message() and "dit" in err.value.message()
        assert "UNAVAILABLE" in str(err.value.status())
        with pytest.raises(InferenceServerException, match="timeout of 1e-06 s expired"):
            client.infer("txt2img", grpc_inputs(GenerationRequest("x", seed=1, num_inference_steps=2)), timeout=1)
        assert client.infer("txt2img", grpc_inputs(GenerationRequest("x", seed=1, num_inference_steps=2)),
                            timeout=0).as_numpy("image").shape == (64, 64, 3)
    message = _stream_error(server, "txt2img_stream", grpc_inputs(slow), timeout=200_000)
    assert "timeout of 0.2 s expired" in message


def _direct_dit(url: str, height: int, outputs: list[str] | None) -> list:
    """Stream one request straight to `dit` asking for `outputs` (None: name none, so all come);
    every (result, error) until the final one."""
    params = {"prompt": "a cat", "negative_prompt": "", "height": height, "width": 64, "num_inference_steps": 3,
              "guidance_scale": 4.5, "seed": 1, "seed_was_drawn": False}
    inputs = [_tensor(grpcclient, "embeds", np.zeros((1, 2, 300, 32), np.float32), "FP32"),
              _tensor(grpcclient, "mask", np.ones((1, 2, 300), np.int64), "INT64"),
              _tensor(grpcclient, "params", np.array([[json.dumps(params).encode()]], np.object_), "BYTES")]
    responses: queue.Queue = queue.Queue()
    seen = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        requested = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
        client.async_stream_infer("dit", inputs, outputs=requested, enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=60)
            seen.append((result, error))
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                client.stop_stream()
                return seen


def test_internal_models_called_directly_enforce_the_same_limits(server):
    """text_encoder, dit and vae_decode are reachable by any client of the server: they check too."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="shape"):
            client.infer("text_encoder", [_tensor(grpcclient, "text", np.array([[b"a"] * 5], np.object_), "BYTES")])
        with pytest.raises(InferenceServerException, match="4096"):
            client.infer("text_encoder", [_tensor(grpcclient, "text", np.array([[b"a" * 5000]], np.object_),
                                                  "BYTES")])
        with pytest.raises(InferenceServerException, match="decode to 2048x2048"):
            client.infer("vae_decode", [_tensor(grpcclient, "latents", np.zeros((1, 4, 256, 256), np.float32),
                                                "FP32")])
    (result, error), = _direct_dit(server.grpc_url, 4096, None)
    assert error is None and "height" in result.as_numpy("error").reshape(-1).tobytes().decode()


def test_a_direct_dit_client_gets_only_the_outputs_it_asked_for(server):
    # Asked for latents only: no progress responses, and a failure comes as an error response.
    seen = _direct_dit(server.grpc_url, 64, ["latents"])
    assert [e for _, e in seen] == [None] and {o.name for o in seen[0][0].get_response().outputs} == {"latents"}
    (_, error), = _direct_dit(server.grpc_url, 4096, ["latents"])
    assert error is not None and "height" in error.message()
