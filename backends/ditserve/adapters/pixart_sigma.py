"""PixArt-Sigma (text-to-image): the step contract over diffusers' PixArtSigmaPipeline.

Mirrors `PixArtSigmaPipeline.__call__` with `use_resolution_binning=False` and
`clean_caption=False`: T5 embeddings padded to `max_sequence_length`, CFG as
[negative, prompt] rows, a learned-sigma transformer whose second half of channels is
dropped, DPM-Solver++ multistep per request, SD-style VAE (autoencoder_kl.py).
"""
from __future__ import annotations

import torch
from diffusers import PixArtSigmaPipeline

from ..cache import RowCache, apply_first_block_cache
from ..schema import GenerationParams
from ..state import TextConditioning
from .autoencoder_kl import AutoencoderKLAdapter


class PixArtSigmaAdapter(AutoencoderKLAdapter):
    pipeline_class = PixArtSigmaPipeline
    family = "pixart-sigma"
    component_names = ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")
    caches = True   # quality tiers: cached_forward below

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

    def cached_forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning,
                       caches: list[RowCache | None]) -> torch.Tensor:
        """`PixArtTransformer2DModel.forward` in its pieces (diffusers 0.42: no resolution
        conditioning, no self-attention mask), with the blocks after the first cached per request."""
        t = self.pipe.transformer
        batch, patch = latents.shape[0], t.config.patch_size
        height, width = latents.shape[-2] // patch, latents.shape[-1] // patch
        # The encoder mask becomes an additive bias [B, 1, L], as diffusers does.
        bias = ((1 - cond.mask.to(latents.dtype)) * -10000.0).unsqueeze(1)
        hidden = t.pos_embed(latents)
        temb, embedded = t.adaln_single(timesteps, {"resolution": None, "aspect_ratio": None}, batch_size=batch,
                                        hidden_dtype=hidden.dtype)
        text = t.caption_projection(cond.embeds).view(batch, -1, hidden.shape[-1])

        def block(module, states: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
            pick = (lambda x: x) if index is None else (lambda x: x.index_select(0, index))
            return module(states, attention_mask=None, encoder_hidden_states=pick(text),
                          encoder_attention_mask=pick(bias), timestep=pick(temb), cross_attention_kwargs=None,
                          class_labels=None)

        def run_rest(index: torch.Tensor | None, states: torch.Tensor) -> torch.Tensor:
            for module in t.transformer_blocks[1:]:
                states = block(module, states, index)
            return states

        first = block(t.transformer_blocks[0], hidden, None)
        hidden = apply_first_block_cache(hidden, first, caches, run_rest)
        shift, scale = (t.scale_shift_table[None] + embedded[:, None]).chunk(2, dim=1)
        hidden = t.proj_out(t.norm_out(hidden) * (1 + scale) + shift).squeeze(1)
        hidden = hidden.reshape(-1, height, width, patch, patch, t.out_channels)
        out = torch.einsum("nhwpqc->nchpwq", hidden).reshape(-1, t.out_channels, height * patch, width * patch)
        return self._noise_prediction(out)

    def _noise_prediction(self, out: torch.Tensor) -> torch.Tensor:
        """A learned-sigma transformer's second half of channels is the variance: dropped."""
        config = self.pipe.transformer.config
        return out.chunk(2, dim=1)[0] if config.out_channels // 2 == config.in_channels else out
