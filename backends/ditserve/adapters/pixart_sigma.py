"""PixArt-Sigma (text-to-image): the step contract over diffusers' PixArtSigmaPipeline.

Mirrors `PixArtSigmaPipeline.__call__` with `use_resolution_binning=False` and
`clean_caption=False`: T5 embeddings padded to `max_sequence_length`, CFG as
[negative, prompt] rows, a learned-sigma transformer whose second half of channels is
dropped, DPM-Solver++ multistep per request, SD-style VAE.
"""
from __future__ import annotations

from functools import cached_property

import torch
from diffusers import AutoencoderKL, PixArtSigmaPipeline

from ..schema import GenerationParams
from ..state import TextConditioning
from .base import FamilyAdapter


class PixArtSigmaAdapter(FamilyAdapter):
    pipeline_class = PixArtSigmaPipeline
    family = "pixart-sigma"
    component_names = ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")

    @torch.inference_mode()
    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, mask, _, _ = self.pipe.encode_prompt(
            texts, do_classifier_free_guidance=False, device=self.device, clean_caption=False,
            max_sequence_length=self.deployment.model.max_sequence_length,
        )
        return embeds, mask

    def latent_shape(self, params: GenerationParams) -> tuple[int, ...]:
        scale = self.vae_scale_factor
        # The transformer's input channels are the VAE's latent channels (vae_decode loads only the VAE).
        channels = (self.pipe.transformer.config.in_channels if self.pipe.transformer is not None
                    else self.pipe.vae.config.latent_channels)
        return (1, channels, params.height // scale, params.width // scale)

    @cached_property
    def vae_scale_factor(self) -> int:
        # The dit stage does not load the VAE (diffusers would then assume 8): read its config.
        vae = self.pipe.vae
        config = vae.config if vae is not None else AutoencoderKL.load_config(self.deployment.model_location(), subfolder="vae")
        return 2 ** (len(config["block_out_channels"]) - 1)

    @property
    def text_embed_dim(self) -> int:
        return self.pipe.transformer.config.caption_channels

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        transformer = self.pipe.transformer
        out = transformer(
            latents, encoder_hidden_states=cond.embeds, encoder_attention_mask=cond.mask, timestep=timesteps,
            added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False,
        )[0]
        if transformer.config.out_channels // 2 == transformer.config.in_channels:
            out = out.chunk(2, dim=1)[0]  # learned sigma: keep the noise prediction
        return out

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        return vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]

    def check_limits(self, stage: str) -> None:
        if stage != "dit":
            return
        need = self.vae_scale_factor * self.pipe.transformer.config.patch_size
        if self.deployment.limits.size_multiple % need:
            raise ValueError(
                f"deployment [limits] size_multiple={self.deployment.limits.size_multiple} must be a multiple of "
                f"{need} (vae scale factor x patch size) for {self.deployment.model.path}"
            )
