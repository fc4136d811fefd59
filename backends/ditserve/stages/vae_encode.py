"""`vae_encode`: the conditioning of one img2vid request, made on the device.

Input `image` (uint8 [H, W, 3]) and `params` (the request's GenerationParams JSON: the
video's height, width and frame count decide the resize and the condition's length).
Outputs the task's conditioning tensors (deployment.TASK_CONDITIONING; for Wan2.1 I2V the
CLIP `image_embeds` and the first-frame VAE `condition`), as float32 on the host: they feed
a BLS request into the decoupled `dit`, where GPU tensors stalled (see stages/text_encoder.py).
One request at a time (max_batch_size 0): input images differ in size, so batches would rarely form.
Its two parts are timed apart (stages/metrics.py VaeEncodeMetrics): the CLIP image
embeddings and the first-frame VAE condition.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import triton_python_backend_utils as pb_utils

from ..adapters import adapter_for
from ..adapters.base import instance_device
from ..adapters.wan_i2v import CONDITION, IMAGE_EMBEDS
from ..deployment import TASK_CONDITIONING
from ..schema import GenerationParams, check_params, decode_image
from .common import error_response, input_numpy, stage_deployment
from .metrics import VaeEncodeMetrics
from .torch_io import to_pb, to_torch

class VaeEncodeStage:
    def __init__(self, args: dict, model_config: dict):
        self.deployment = stage_deployment(model_config)
        if self.deployment.task not in TASK_CONDITIONING:
            raise ValueError(f"vae_encode serves image-conditioned tasks; deployment {self.deployment.source} "
                             f"serves {self.deployment.task}: render the repository for it without vae_encode")
        self.adapter = adapter_for(self.deployment.model.family)(self.deployment, "vae_encode", instance_device(args))
        self.outputs = [name for name, _ in TASK_CONDITIONING[self.deployment.task]]
        self.metrics = VaeEncodeMetrics(args["model_name"])

    def execute(self, requests):
        return [self._encode(request) for request in requests]

    def _encode(self, request):
        try:
            # vae_encode is reachable directly too: the same checks as the public models.
            params = check_params(GenerationParams.from_json(input_numpy(request, "params").reshape(-1)[0]),
                                  self.deployment)
            decode_image(input_numpy(request, "image"), self.deployment)
            image = to_torch(pb_utils.get_input_tensor_by_name(request, "image"))
            extra = self._conditioning(image, params)
        except ValueError as exc:  # InvalidRequest, or an image the adapter cannot use
            return error_response(str(exc), pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:
            return error_response(f"encode image failed: {type(exc).__name__}: {exc}")
        return pb_utils.InferenceResponse([to_pb(name, extra[name].float().cpu()) for name in self.outputs])

    def _conditioning(self, image: torch.Tensor, params: GenerationParams) -> dict[str, torch.Tensor]:
        """The adapter's encode_conditioning, one timed part at a time."""
        adapter = self.adapter
        embeds = self._timed(self.metrics.image_encode, adapter.encode_image, [image])
        condition = self._timed(self.metrics.vae_encode, lambda: adapter.encode_condition(
            adapter.preprocess_image(image, params.height, params.width), params.num_frames))
        return {IMAGE_EMBEDS: embeds, CONDITION: condition}

    def _timed(self, histogram, fn: Callable, *args):
        """fn(*args), observed into `histogram` when it succeeds; on a GPU the clock is read
        after its kernels finished."""
        start = time.perf_counter()
        result = fn(*args)
        if self.adapter.device.type == "cuda":
            torch.cuda.synchronize(self.adapter.device)
        histogram.observe(time.perf_counter() - start)
        return result

    def finalize(self) -> None:
        pass
