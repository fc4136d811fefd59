"""`txt2img` / `txt2img_stream`: the public models, one implementation for both.

The request is validated here, before any model work, then driven through
`text_encoder` -> `dit` -> `vae_decode` with BLS. `dit` streams one progress response
per step; the streaming variant (decoupled) forwards them to the client, the unary
variant only uses them to notice a cancelled client between steps. Only the final
latents are decoded. A decoupled model cannot answer unary or HTTP calls, hence two
models on this one class: `model_transaction_policy { decoupled }` picks the variant.

Every request gets exactly one terminal response: the image, or one error (invalid
input, cancelled, or the failing stage named).
"""
from __future__ import annotations

import time
import uuid
from typing import Callable

import numpy as np
import triton_python_backend_utils as pb_utils

from ..cancellation import CancelRegistry
from ..deployment import load_deployment
from ..schema import TXT2IMG_INPUTS, GenerationParams, InvalidRequest, decode_request
from .common import TensorSpec, declare, error_response, input_numpy, to_pb, to_torch
from .metrics import GenerateMetrics

_TYPES = {"BYTES": "TYPE_STRING", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "FP32": "TYPE_FP32"}
INPUTS = tuple(TensorSpec(s.name, _TYPES[s.dtype], (1,), s.optional) for s in TXT2IMG_INPUTS)
# Triton 2.51's Python backend cannot set response parameters, so the seed actually used
# (drawn when the request gave none) is returned as the output `seed`.
OUTPUTS = (
    TensorSpec("image", "TYPE_UINT8", (-1, -1, 3)),
    TensorSpec("seed", "TYPE_INT64", (1,)),
    TensorSpec("progress", "TYPE_INT32", (2,)),
)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class StageError(RuntimeError):
    """A downstream model answered with an error; the message names the stage."""


class Cancelled(RuntimeError):
    """The client went away; nothing more is computed for it."""


def _bls(model: str, inputs: list, outputs: list[str], **kwargs):
    return pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs, **kwargs)


def _checked(response, stage: str):
    if response.has_error():
        raise StageError(f"{stage}: {response.error().message()}")
    return response


class GenerateStage:
    @staticmethod
    def auto_complete(config):
        return declare(config, INPUTS, OUTPUTS)

    def __init__(self, args: dict, model_config: dict):
        self.deployment = load_deployment()
        self.streaming = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self.cancels = CancelRegistry()
        self.metrics = GenerateMetrics(args["model_name"])

    def execute(self, requests):
        # Generations run in the execute thread: BLS and response sending from worker threads
        # crashed tritonserver 2.51 (SIGSEGV in libtriton_python.so) under concurrent streams.
        # Concurrency comes from instance count instead (scripts/render_repository.py).
        if self.streaming:
            for request in requests:
                self._serve_stream(request)
            return None
        return [self._respond(request, on_progress=None) for request in requests]

    def _serve_stream(self, request) -> None:
        sender = request.get_response_sender()
        response = self._respond(request, lambda progress: sender.send(pb_utils.InferenceResponse([progress])))
        sender.send(response, flags=FINAL)

    def _respond(self, request, on_progress: Callable | None):
        """Run one generation and turn its outcome into the one terminal response."""
        try:
            params, image = self.generate(request, on_progress)
        except InvalidRequest as exc:
            self.metrics.failed.increment(1)
            return error_response(str(exc), pb_utils.TritonError.INVALID_ARG)
        except Cancelled:
            self.metrics.cancelled.increment(1)
            return error_response("request cancelled", pb_utils.TritonError.CANCELLED)
        except StageError as exc:
            self.metrics.failed.increment(1)
            return error_response(str(exc))
        self.metrics.completed.increment(1)
        return pb_utils.InferenceResponse([image, pb_utils.Tensor("seed", np.array([params.seed], dtype=np.int64))])

    # ---- the pipeline ------------------------------------------------------------------
    def generate(self, request, on_progress: Callable | None) -> tuple[GenerationParams, object]:
        """Validate, encode, denoise step by step, decode; returns the params and `image`."""
        arrival = time.monotonic()
        params = decode_request({spec.name: input_numpy(request, spec.name) for spec in TXT2IMG_INPUTS}, self.deployment)
        encoded = self._timed("encode", self._encode, request, params)
        latents = self._denoise(request, params, encoded, on_progress, arrival)
        return params, self._timed("decode", self._decode, request, latents)

    def _timed(self, stage: str, fn, request, *args):
        if request.is_cancelled():
            raise Cancelled()
        start = time.monotonic()
        result = fn(*args)
        self.metrics.stage[stage].observe(time.monotonic() - start)
        return result

    def _encode(self, params: GenerationParams):
        texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
        text = pb_utils.Tensor("text", np.array([[t.encode("utf-8") for t in texts]], dtype=np.object_))
        return _checked(_bls("text_encoder", [text], ["embeds", "mask"]).exec(), "text_encoder")

    def _denoise(self, request, params: GenerationParams, encoded, on_progress: Callable | None, arrival: float):
        """Stream dit's per-step responses; on a client cancel, flag dit and drain to its end."""
        if request.is_cancelled():
            raise Cancelled()
        dit_id = uuid.uuid4().hex
        params_tensor = pb_utils.Tensor("params", np.array([[params.to_json().encode()]], dtype=np.object_))
        dit = _bls("dit", [*encoded.output_tensors(), params_tensor], ["progress", "latents", "error"],
                   request_id=dit_id)
        start, first_step, latents, cancelled = time.monotonic(), None, None, False
        for response in dit.exec(decoupled=True):
            if not cancelled and request.is_cancelled():
                self.cancels.cancel(dit_id)  # dit ends it at the next step boundary
                cancelled = True
            error = pb_utils.get_output_tensor_by_name(response, "error")
            if response.has_error() or error is not None:
                if cancelled:
                    break
                message = response.error().message() if response.has_error() else error.as_numpy().reshape(-1)[0]
                raise StageError(f"dit: {message.decode() if isinstance(message, bytes) else message}")
            if first_step is None:
                first_step = time.monotonic()
                self.metrics.first_step.observe(first_step - arrival)
            progress = pb_utils.get_output_tensor_by_name(response, "progress")
            if progress is not None and on_progress is not None and not cancelled:
                on_progress(to_pb("progress", to_torch(progress)[0]))
            final = pb_utils.get_output_tensor_by_name(response, "latents")
            latents = final if final is not None else latents
        if cancelled:
            self.cancels.clear(dit_id)  # dit may have finished before it saw the flag
            raise Cancelled()
        if latents is None:
            raise StageError("dit: finished without latents")
        self.metrics.stage["denoise"].observe(time.monotonic() - start)
        return latents

    def _decode(self, latents):
        decoded = _checked(_bls("vae_decode", [latents], ["image"]).exec(), "vae_decode")
        image = to_torch(pb_utils.get_output_tensor_by_name(decoded, "image"))[0]
        return to_pb("image", image)

    def finalize(self) -> None:
        pass
