"""Image families whose latents come from an AutoencoderKL (PixArt-Sigma, FLUX.1): the
latent shape, the VAE's scale, the decode and the size limit they share.

Latents stay in the VAE's layout [1, C, H / s, W / s] in the request state, whatever the
transformer takes (FLUX.1 packs them into 2x2 patches inside its forward), so the scheduler,
the dit -> vae_decode hop and the decode are the same for every such family.
"""
from __future__ import annotations

from functools import cached_property

import torch
from diffusers import AutoencoderKL

from ..schema import GenerationParams
from .base import FamilyAdapter


class AutoencoderKLAdapter(FamilyAdapter):
    @property
    def num_channels_latents(self) -> int:
        """Channels of the noise the pipeline draws (PixArt-Sigma: the transformer's input channels;
        they are the VAE's latent channels, which is what vae_decode, loading only the VAE, knows)."""
        if self.pipe.transformer is None:
            return self._vae_config["latent_channels"]
        return self.pipe.transformer.config.in_channels

    @property
    def spatial_patch(self) -> int:
        """Latent elements per transformer token along height and width."""
        return self.pipe.transformer.config.patch_size

    def latent_shape(self, params: GenerationParams) -> tuple[int, ...]:
        scale = self.vae_scale_factor
        return (1, self.num_channels_latents, params.height // scale, params.width // scale)

    @cached_property
    def _vae_config(self) -> dict:
        # The dit stage does not load the VAE (diffusers would then assume 8): read its config.
        vae = self.pipe.vae
        return dict(vae.config) if vae is not None else AutoencoderKL.load_config(self.deployment.model_location(),
                                                                                 subfolder="vae")

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self._vae_config["block_out_channels"]) - 1)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Undo the VAE's scaling (and shift, where it has one: FLUX.1, SD3) as the pipelines do, then decode."""
        config = self.pipe.vae.config
        latents = latents / config.scaling_factor
        if config.get("shift_factor") is not None:
            latents = latents + config.shift_factor
        return self.pipe.vae.decode(latents, return_dict=False)[0]

    def check_limits(self, stage: str) -> None:
        if stage != "dit":
            return
        need = self.vae_scale_factor * self.spatial_patch
        if self.deployment.limits.size_multiple % need:
            raise ValueError(
                f"deployment [limits] size_multiple={self.deployment.limits.size_multiple} must be a multiple of "
                f"{need} (vae scale factor x patch size) for {self.deployment.model.path}"
            )
