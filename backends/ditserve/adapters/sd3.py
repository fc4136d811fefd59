"""Stable Diffusion 3 / 3.5 text-to-image: the step contract over diffusers'
StableDiffusion3Pipeline.

Mirrors `StableDiffusion3Pipeline.__call__` without skip-layer guidance or image prompts:
three text encoders (CLIP-L and CLIP-G penultimate states, zero-padded to T5's width, then
T5 to `max_sequence_length`; the two pooled CLIP vectors concatenated, mmdit.py), CFG as
[negative, prompt] rows (the pooled vectors too), latents [1, 16, H/8, W/8] that the
transformer patches itself, flow-matching Euler per request (with the size-dependent shift
`mu` where the scheduler has dynamic shifting), the VAE's scale and shift undone.
"""
from __future__ import annotations

import torch
from diffusers import StableDiffusion3Pipeline
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import retrieve_timesteps

from ..schema import GenerationParams
from ..state import TextConditioning
from .mmdit import POOLED, MMDiTAdapter


class SD3Adapter(MMDiTAdapter):
    pipeline_class = StableDiffusion3Pipeline
    family = "sd3"
    component_names = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2", "tokenizer_3", "text_encoder_3",
                       "transformer", "vae", "scheduler")

    def encode_pooled(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Negative and prompt alike: the pipeline encodes a negative prompt exactly as a prompt."""
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            texts, prompt_2=None, prompt_3=None, device=self.device, do_classifier_free_guidance=False,
            max_sequence_length=self.deployment.model.max_sequence_length)
        return embeds, pooled

    @property
    def text_sequence_length(self) -> int:
        """CLIP's tokens (77; the dit stage loads no tokenizer, so the pipeline's default), then T5's."""
        return self.pipe.tokenizer_max_length + self.deployment.model.max_sequence_length

    def set_timesteps(self, scheduler, params: GenerationParams) -> None:
        kwargs = {"mu": self.shift_mu(scheduler, params, max_shift=1.16)} \
            if scheduler.config.get("use_dynamic_shifting") else {}
        retrieve_timesteps(scheduler, params.num_inference_steps, self.device, **kwargs)

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        return self.pipe.transformer(hidden_states=latents, timestep=timesteps, encoder_hidden_states=cond.embeds,
                                     pooled_projections=cond.extra[POOLED], return_dict=False)[0]

    def check_limits(self, stage: str) -> None:
        path = self.deployment.model.path
        if stage == "text_encoder" and self.pipe.text_encoder_3 is None:
            raise ValueError(f"{path} has no text_encoder_3 (T5): family \"sd3\" serves checkpoints with all three "
                             f"text encoders")
        if stage == "dit":
            config = self.pipe.transformer.config
            largest = config.pos_embed_max_size * config.patch_size * self.vae_scale_factor
            if self.deployment.limits.max_size > largest:
                raise ValueError(f"deployment [limits] max_size={self.deployment.limits.max_size}: {path}'s position "
                                 f"embedding covers at most {largest} px per side; set max_size <= {largest}")
        super().check_limits(stage)
