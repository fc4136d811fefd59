"""`txt2img` / `txt2img_stream`: the public models, one implementation for both.

The request is validated here, before any model work, then driven through
`text_encoder` -> `dit` -> `vae_decode` with BLS. `dit` streams one progress response
per step; the streaming variant (decoupled) forwards them to the client, the unary
variant only uses them to notice a cancelled client between steps. Only the final
latents are decoded. A decoupled model cannot answer unary or HTTP calls, hence two
models on this one class: `model_transaction_policy { decoupled }` picks the variant.
"""
from __future__ import annotations

import threading
import uuid
from typing import Callable

import numpy as np
import triton_python_backend_utils as pb_utils

from ..deployment import load_deployment
from ..schema import TXT2IMG_INPUTS, GenerationParams, InvalidRequest, decode_request
from .common import TensorSpec, declare, error_response, input_numpy, to_pb, to_torch

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

    def execute(self, requests):
        if self.streaming:
            for request in requests:
                threading.Thread(target=self._serve_stream, args=(request,), daemon=True).start()
            return None
        return [self._serve_unary(request) for request in requests]

    # ---- the two variants -------------------------------------------------------------
    def _serve_unary(self, request):
        try:
            params, image = self.generate(request, on_progress=None)
        except (InvalidRequest, StageError) as exc:
            return error_response(str(exc))
        return pb_utils.InferenceResponse(self._final_outputs(params, image))

    def _serve_stream(self, request) -> None:
        sender = request.get_response_sender()

        def on_progress(progress) -> None:
            sender.send(pb_utils.InferenceResponse([progress]))

        try:
            params, image = self.generate(request, on_progress)
            response = pb_utils.InferenceResponse(self._final_outputs(params, image))
        except (InvalidRequest, StageError) as exc:
            response = error_response(str(exc))
        sender.send(response, flags=FINAL)

    @staticmethod
    def _final_outputs(params: GenerationParams, image) -> list:
        return [image, pb_utils.Tensor("seed", np.array([params.seed], dtype=np.int64))]

    # ---- the pipeline ------------------------------------------------------------------
    def generate(self, request, on_progress: Callable | None) -> tuple[GenerationParams, object]:
        """Validate, encode, denoise step by step, decode; returns the params and `image`."""
        params = decode_request({spec.name: input_numpy(request, spec.name) for spec in TXT2IMG_INPUTS}, self.deployment)
        texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
        text = pb_utils.Tensor("text", np.array([[t.encode("utf-8") for t in texts]], dtype=np.object_))
        encoded = _checked(_bls("text_encoder", [text], ["embeds", "mask"]).exec(), "text_encoder")

        params_tensor = pb_utils.Tensor("params", np.array([[params.to_json().encode()]], dtype=np.object_))
        dit = _bls("dit", [*encoded.output_tensors(), params_tensor], ["progress", "latents"],
                   request_id=uuid.uuid4().hex)
        latents = None
        for response in dit.exec(decoupled=True):
            _checked(response, "dit")
            progress = pb_utils.get_output_tensor_by_name(response, "progress")
            if progress is not None and on_progress is not None:
                on_progress(to_pb("progress", to_torch(progress)[0]))
            final = pb_utils.get_output_tensor_by_name(response, "latents")
            latents = final if final is not None else latents
        if latents is None:
            raise StageError("dit: finished without latents")

        decoded = _checked(_bls("vae_decode", [latents], ["image"]).exec(), "vae_decode")
        image = to_torch(pb_utils.get_output_tensor_by_name(decoded, "image"))[0]
        return params, to_pb("image", image)

    def finalize(self) -> None:
        pass
