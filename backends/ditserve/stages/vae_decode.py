"""`vae_decode`: latents -> uint8 media [H, W, 3] made on the device (dynamic batching).

Triton's dynamic batcher only merges requests of equal shape, so a batch is one size.
Progress never reaches this stage: only final latents do.
"""
from __future__ import annotations

import torch
import triton_python_backend_utils as pb_utils

from ..adapters import adapter_for
from ..deployment import load_deployment
from .common import TensorSpec, declare, error_response, to_pb, to_torch

INPUTS = (TensorSpec("latents", "TYPE_FP32", (-1, -1, -1)),)
OUTPUTS = (TensorSpec("image", "TYPE_UINT8", (-1, -1, 3)),)


class VaeDecodeStage:
    @staticmethod
    def auto_complete(config):
        return declare(config, INPUTS, OUTPUTS)

    def __init__(self, args: dict, model_config: dict):
        deployment = load_deployment()
        self.adapter = adapter_for(deployment.model.family)(deployment, "vae_decode")

    def execute(self, requests):
        latents = [to_torch(pb_utils.get_input_tensor_by_name(r, "latents")) for r in requests]
        try:
            media = self.adapter.decode(torch.cat(latents))
        except Exception as exc:
            return [error_response(f"vae_decode failed: {exc}") for _ in requests]
        responses, start = [], 0
        for lat in latents:
            n = lat.shape[0]
            responses.append(pb_utils.InferenceResponse([to_pb("image", media[start:start + n])]))
            start += n
        return responses

    def finalize(self) -> None:
        pass
