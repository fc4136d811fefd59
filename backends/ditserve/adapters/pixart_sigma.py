"""PixArt-Sigma (text-to-image): the step contract over diffusers' PixArtSigmaPipeline.

Mirrors `PixArtSigmaPipeline.__call__` with `use_resolution_binning=False` and
`clean_caption=False`: T5 embeddings padded to `max_sequence_length`, CFG as
[negative, prompt] rows, a learned-sigma transformer whose second half of channels is
dropped, DPM-Solver++ multistep per request, SD-style VAE (autoencoder_kl.py).
"""
from __future__ import annotations

import torch
from diffusers import PixArtSigmaPipeline

from ..state import TextConditioning
from .autoencoder_kl import AutoencoderKLAdapter


class PixArtSigmaAdapter(AutoencoderKLAdapter):
    pipeline_class = PixArtSigmaPipeline
    family = "pixart-sigma"
    component_names = ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")
    cache_blocks = "transformer_blocks"   # quality tiers (cache.first_block_cache)

    @torch.inference_mode()
    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, mask, _, _ = self.pipe.encode_prompt(
            texts, do_classifier_free_guidance=False, device=self.device, clean_caption=False,
            max_sequence_length=self.deployment.model.max_sequence_length,
        )
        return embeds, mask

    @property
    def text_embed_dim(self) -> int:
        return self.pipe.transformer.config.caption_channels

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        out = self.pipe.transformer(
            latents, encoder_hidden_states=cond.embeds, encoder_attention_mask=cond.mask, timestep=timesteps,
            added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False,
        )[0]
        return self._noise_prediction(out)

    def _noise_prediction(self, out: torch.Tensor) -> torch.Tensor:
        """A learned-sigma transformer's second half of channels is the variance: dropped."""
        config = self.pipe.transformer.config
        return out.chunk(2, dim=1)[0] if config.out_channels // 2 == config.in_channels else out
