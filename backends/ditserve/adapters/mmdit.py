"""What the MMDiT image families (FLUX.1, Stable Diffusion 3.x) share: a transformer that
attends jointly over a T5 (+ CLIP) token sequence and the image tokens, conditioned on a
pooled CLIP vector, under a flow-matching Euler schedule whose shift may depend on the image
size (`mu`, flow_shift.py), so requests of different sizes get different sigmas.

A family implements `encode_pooled` (its pipeline's `encode_prompt`, one row per text); the
pooled vectors travel per row as `TextConditioning.extra["pooled_embeds"]`
(deployment.FAMILY_TEXT_CONDITIONING), beside `embeds`, to every forward.
"""
from __future__ import annotations

from abc import abstractmethod

import torch

from ..schema import GenerationParams
from ..state import RequestState, TextConditioning
from .autoencoder_kl import AutoencoderKLAdapter
from .flow_shift import SizeShiftedSchedule

POOLED = "pooled_embeds"


class MMDiTAdapter(SizeShiftedSchedule, AutoencoderKLAdapter):
    # ---- text_encoder stage --------------------------------------------------------------
    @abstractmethod
    def encode_pooled(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence embeddings [N, L, D] and pooled embeddings [N, P] of N texts, as the pipeline makes them."""

    @torch.inference_mode()
    def encode_prompts(self, texts: list[str]) -> TextConditioning:
        """The mask is all ones: these pipelines pass the transformer none."""
        embeds, pooled = self.encode_pooled(texts)
        mask = torch.ones(embeds.shape[:2], dtype=torch.int64, device=embeds.device)
        return TextConditioning(embeds, mask, {POOLED: pooled})

    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        cond = self.encode_prompts(texts)
        return cond.embeds, cond.mask

    # ---- dit stage -------------------------------------------------------------------------
    @property
    def text_embed_dim(self) -> int:
        return self.pipe.transformer.config.joint_attention_dim

    def example_conditioning(self, params: GenerationParams) -> TextConditioning:
        """The text's zeros plus a zero pooled vector per text row (what warming needs)."""
        cond = super().example_conditioning(params)
        cond.extra = {POOLED: torch.zeros(cond.embeds.shape[0], self.pipe.transformer.config.pooled_projection_dim,
                                          dtype=self.dtype)}
        return cond

    def prepare(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        """The pooled embeddings checked (one row per text row) and cast as the pipeline has them."""
        pooled = cond.extra.get(POOLED)
        want = (cond.embeds.shape[0], self.pipe.transformer.config.pooled_projection_dim)
        if pooled is None or tuple(pooled.shape) != want:
            got = None if pooled is None else tuple(pooled.shape)
            raise ValueError(f"conditioning '{POOLED}' must be {list(want)} (the pooled CLIP embedding of each text "
                             f"row), got {got}")
        state = super().prepare(key, params, cond)
        state.cond.extra[POOLED] = state.cond.extra[POOLED].to(self.dtype)
        return state
