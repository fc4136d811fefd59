"""The Wan2.1 VAE's conventions, shared by the families whose VAE is it or derives from it
(Wan2.1 / Wan2.2 video: AutoencoderKLWan; Qwen-Image: AutoencoderKLQwenImage): latents
normalised per channel by `latents_mean` / `latents_std`, and a config that the dit stage,
which does not load the VAE, reads from the checkpoint.
"""
from __future__ import annotations

import inspect
from functools import cached_property
from typing import ClassVar

import torch


class WanStyleVAE:
    """Mixin for a FamilyAdapter; `vae_class` is the checkpoint's VAE class."""

    vae_class: ClassVar[type]

    @cached_property
    def _vae_config(self) -> dict:
        """The VAE config with class defaults filled in, as `vae.config` has it once loaded.

        The dit stage does not load the VAE, and Wan2.1 checkpoints predate the
        `scale_factor_*` keys, so read the file and fall back to the defaults.
        """
        if self.pipe.vae is not None:
            return dict(self.pipe.vae.config)
        defaults = {name: p.default for name, p in inspect.signature(self.vae_class.__init__).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        return defaults | self.vae_class.load_config(self.deployment.model_location(), subfolder="vae")

    def latent_stats(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's per-channel `latents_mean` and 1 / `latents_std`, [1, C, 1, 1, 1], built as the pipelines do."""
        config = self.pipe.vae.config
        stats = (1, config.z_dim, 1, 1, 1)
        latents_mean = torch.tensor(config.latents_mean).view(stats).to(device, dtype)
        latents_std = 1.0 / torch.tensor(config.latents_std).view(stats).to(device, dtype)
        return latents_mean, latents_std
