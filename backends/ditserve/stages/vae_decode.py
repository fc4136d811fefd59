"""`vae_decode`: latents -> uint8 `media` made on the device (dynamic batching):
[H, W, 3] per image generation, [F, H, W, 3] per video generation. The media goes back on
the host unless `[engine] media_on_host = false` (deployment.py says why).

Triton's dynamic batcher only merges requests of equal shape, so a batch is one size.
Progress never reaches this stage: only final latents do. A batch whose decode fails is
retried one request at a time, and media that is not finite (NaN/inf from the VAE) is an
error for its request, never an image.
"""
from __future__ import annotations

import torch
import triton_python_backend_utils as pb_utils

from ..adapters import adapter_for
from ..adapters.base import instance_device
from ..faults import FaultInjector, Subject, injector
from ..isolation import isolating_failures
from .common import error_response, stage_deployment, warm_up
from .torch_io import to_pb, to_torch
from .warm_path import warm_request_path, warm_requests



class VaeDecodeStage:
    def __init__(self, args: dict, model_config: dict):
        self.deployment = stage_deployment(model_config)
        self.adapter = adapter_for(self.deployment.model.family)(self.deployment, "vae_decode", instance_device(args))
        self.accel_metrics = warm_up(self.adapter, args["model_name"])
        self.faults = injector(self.deployment, "vae_decode")
        warm_request_path(args["model_name"], self._warm_request_path)
        self.accel_metrics.watch(self.adapter.stage_runner)

    def _warm_request_path(self) -> None:
        """A decode through the batch path (media to the host, response) per warm size, with no
        faults injected: the deployment's faults are for requests."""
        for params in warm_requests(self.adapter):
            self._decode_batch([(0, torch.zeros(self.adapter.latent_shape(params)))], [None], FaultInjector())

    def execute(self, requests):
        responses: list = [None] * len(requests)
        items = []
        for i, request in enumerate(requests):
            latents = to_torch(pb_utils.get_input_tensor_by_name(request, "latents"))
            problem = self._check(latents)
            if problem:  # vae_decode is reachable directly, not only through txt2img
                responses[i] = error_response(problem, pb_utils.TritonError.INVALID_ARG)
            else:
                items.append((i, latents))
        self._decode(items, responses)
        self.accel_metrics.count()
        return responses

    def _check(self, latents: torch.Tensor) -> str | None:
        lim = self.deployment.limits
        if latents.ndim < 4:
            return f"latents must have shape [batch, channels, (frames,) h, w], got {list(latents.shape)}"
        height, width = self.adapter.media_height(latents), int(latents.shape[-1]) * self.adapter.vae_scale_factor
        if not (lim.min_size <= height <= lim.max_size and lim.min_size <= width <= lim.max_size):
            return (f"latents of shape {list(latents.shape)} decode to {height}x{width}; allowed "
                    f"[{lim.min_size}, {lim.max_size}] per side")
        return None

    def _decode(self, items: list, responses: list) -> None:
        """Decode the latents of `items` in one VAE call; a failing batch is retried per request."""
        def fail(item, exc: Exception) -> None:
            responses[item[0]] = error_response(f"decode failed: {type(exc).__name__}: {exc}")

        isolating_failures(items, lambda batch: self._decode_batch(batch, responses, self.faults), fail)

    def _decode_batch(self, items: list, responses: list, faults: FaultInjector) -> None:
        if not items:
            return
        rows = [Subject(height=self.adapter.media_height(lat)) for _, lat in items for _ in range(lat.shape[0])]
        latents = faults.at("decode", rows, torch.cat([lat for _, lat in items]))
        media, finite = self.adapter.decode(latents)
        if self.deployment.engine.media_on_host:
            media = media.cpu()
        start = 0
        for i, lat in items:
            n = lat.shape[0]
            if not all(finite[start:start + n]):
                responses[i] = error_response("decode produced non-finite pixels (NaN/inf); no media is returned")
            else:
                responses[i] = pb_utils.InferenceResponse([to_pb("media", media[start:start + n])])
            start += n

    def finalize(self) -> None:
        pass
