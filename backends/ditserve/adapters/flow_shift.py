"""Flow-matching schedules whose shift depends on the image size (FLUX.1, SD3.5, Qwen-Image):
the pipelines compute a shift `mu` from the request's image token count, so requests of
different sizes get different sigmas (each request has its own scheduler anyway).
"""
from __future__ import annotations

import numpy as np
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

from ..schema import GenerationParams


class SizeShiftedSchedule:
    """Mixin for a FamilyAdapter whose latents are [1, C, h, w] and whose transformer takes
    `spatial_patch` x `spatial_patch` latent patches as tokens."""

    def shift_mu(self, scheduler, params: GenerationParams, max_shift: float) -> float:
        """The request's schedule shift, from its image token count, as the pipelines compute it
        (`max_shift`: the pipeline's default where the scheduler config has none)."""
        _, _, h, w = self.latent_shape(params)
        tokens = (h // self.spatial_patch) * (w // self.spatial_patch)
        config = scheduler.config
        return calculate_shift(tokens, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                               config.get("base_shift", 0.5), config.get("max_shift", max_shift))

    def set_timesteps(self, scheduler, params: GenerationParams) -> None:
        """As FluxPipeline and QwenImagePipeline: sigmas linspace(1, 1/N, N) (unless the scheduler
        makes flow sigmas itself) shifted by the request's `mu`, stepped from index 0."""
        steps = params.num_inference_steps
        sigmas = None if scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas,
                           mu=self.shift_mu(scheduler, params, max_shift=1.15))
        scheduler.set_begin_index(0)
