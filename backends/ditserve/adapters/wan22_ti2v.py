"""Wan2.2 TI2V-5B, text-to-video: WanPipeline with `expand_timesteps`, over the Wan2.1 step
contract (wan.py).

Mirrors `WanPipeline.__call__` with `expand_timesteps` and no image: the transformer takes a
timestep per latent token (all equal to the step's t without a conditioning image), and the
Wan2.2 VAE (48 channels, 16x spatial compression) decodes. The per-token timesteps are made
inside the forward from each row's own t, so requests at different steps still share one.
Without an image every token's t is the same, and a [rows] timestep gives the same output
(measured 5e-7 apart on the tiny model); the per-token form is the pipeline's computation,
and what an image-conditioned request (first-frame tokens at t = 0) will need.
"""
from __future__ import annotations

import torch

from ..state import TextConditioning
from .wan import WanT2VAdapter


class Wan22TI2VAdapter(WanT2VAdapter):
    family = "wan22-ti2v"
    cache_blocks = None   # quality tiers not tried with per-token timesteps yet

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        """Each row's t repeated over its f x h/2 x w/2 tokens, in float32 as the pipeline's mask x t."""
        _, _, frames, height, width = latents.shape
        _, patch_h, patch_w = self.pipe.transformer.config.patch_size
        tokens = frames * (height // patch_h) * (width // patch_w)
        per_token = timesteps.to(torch.float32)[:, None].expand(-1, tokens)
        return self.run_transformer(self.pipe.transformer, latents, per_token, cond)
