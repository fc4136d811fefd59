"""Wan2.1 text-to-video: the step contract over diffusers' WanPipeline.

Mirrors `WanPipeline.__call__` for Wan2.1 (one transformer, no `boundary_ratio`): UMT5
embeddings cut at each prompt's length and zero-padded to `max_sequence_length`, float32
latents [1, C, f, h, w] cast to the transformer's dtype for every forward, CFG as
[negative, prompt] rows, flow-matching UniPC per request, and the VAE's per-channel
latent statistics undone before decoding.
"""
from __future__ import annotations

import math

import torch
from diffusers import AutoencoderKLWan, WanPipeline

from ..schema import GenerationParams
from ..state import RequestState, TextConditioning
from .base import FamilyAdapter
from .wan_vae import WanStyleVAE


# The WanPipeline variants, by the family that serves them.
WAN_T2V_VARIANTS = {"wan-t2v": "Wan2.1 (one transformer, no boundary_ratio)",
                    "wan22-t2v": "two-expert Wan2.2 A14B (boundary_ratio, transformer_2)",
                    "wan22-ti2v": "Wan2.2 TI2V-5B (expand_timesteps: a timestep per token)"}


def wan_t2v_family(config) -> str:
    """The family that serves a WanPipeline checkpoint with this model_index config."""
    if config.get("expand_timesteps"):
        return "wan22-ti2v"
    return "wan-t2v" if config.get("boundary_ratio") is None else "wan22-t2v"


class WanT2VAdapter(WanStyleVAE, FamilyAdapter):
    pipeline_class = WanPipeline
    vae_class = AutoencoderKLWan
    family = "wan-t2v"
    # transformer_2: Wan2.2's low-noise expert (wan22.py); Wan2.1 checkpoints have none.
    component_names = ("tokenizer", "text_encoder", "transformer", "transformer_2", "vae", "scheduler")
    cache_blocks = "blocks"   # quality tiers (cache.first_block_cache)

    @torch.inference_mode()
    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask is all ones: the Wan transformer takes none and attends to the zeroed padding."""
        embeds, _ = self.pipe.encode_prompt(
            texts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.deployment.model.max_sequence_length,
        )
        return embeds, torch.ones(embeds.shape[:2], dtype=torch.int64, device=embeds.device)

    @property
    def latent_dtype(self) -> torch.dtype:
        return torch.float32  # WanPipeline.prepare_latents; the scheduler steps in float32

    @property
    def num_channels_latents(self) -> int:
        """Channels of the noise the scheduler steps: WanPipeline takes the transformer's input channels
        (the VAE's z_dim, which is what vae_decode, loading only the VAE, knows)."""
        if self.pipe.transformer is None:
            return self._vae_config["z_dim"]
        return self.pipe.transformer.config.in_channels

    def latent_shape(self, params: GenerationParams) -> tuple[int, ...]:
        frames = (params.num_frames - 1) // self.vae_scale_factor_temporal + 1
        scale = self.vae_scale_factor
        return (1, self.num_channels_latents, frames, params.height // scale, params.width // scale)

    def prepare(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        state = super().prepare(key, params, cond)
        state.scheduler.set_begin_index(0)  # as WanPipeline: step i uses sigma i even if timesteps repeat
        return state

    @property
    def vae_scale_factor(self) -> int:
        return self._vae_config["scale_factor_spatial"]

    @property
    def vae_scale_factor_temporal(self) -> int:
        """Frames per latent frame after the first."""
        return self._vae_config["scale_factor_temporal"]

    @property
    def text_embed_dim(self) -> int:
        return self.pipe.transformer.config.text_dim

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        return self.run_transformer(self.pipe.transformer, latents, timesteps, cond)

    @staticmethod
    def run_transformer(transformer: torch.nn.Module, latents: torch.Tensor, timesteps: torch.Tensor,
                        cond: TextConditioning) -> torch.Tensor:
        """Output stays in the transformer's dtype: WanPipeline applies CFG in that dtype too."""
        return transformer(hidden_states=latents.to(transformer.dtype), timestep=timesteps,
                           encoder_hidden_states=cond.embeds, return_dict=False)[0]

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """[N, C, f, h, w] latents -> [N, F, 3, H, W] frames, un-normalised exactly as WanPipeline does."""
        latents_mean, latents_std = self.latent_stats(latents.device, latents.dtype)
        video = self.pipe.vae.decode(latents / latents_std + latents_mean, return_dict=False)[0]
        return video.transpose(1, 2)

    def check_variant(self) -> None:
        """A WanPipeline checkpoint is served by the family its config names (wan_t2v_family)."""
        family = wan_t2v_family(self.pipe.config)
        if family != self.family:
            raise ValueError(f"{self.deployment.model.path} is a {WAN_T2V_VARIANTS[family]} pipeline: "
                             f"set [model] family = \"{family}\"")

    def check_limits(self, stage: str) -> None:
        self.check_variant()
        if stage != "dit":
            return
        limits, path = self.deployment.limits, self.deployment.model.path
        _, patch_h, patch_w = self.pipe.transformer.config.patch_size
        need = math.lcm(self.vae_scale_factor * patch_h, self.vae_scale_factor * patch_w)
        if limits.size_multiple % need:
            raise ValueError(f"deployment [limits] size_multiple={limits.size_multiple} must be a multiple of {need} "
                             f"(vae spatial scale x transformer patch size) for {path}; set size_multiple = {need}")
        if limits.frames_step % self.vae_scale_factor_temporal:
            raise ValueError(f"deployment [limits] frames_step={limits.frames_step} must be a multiple of "
                             f"{self.vae_scale_factor_temporal} (the VAE's temporal compression) for {path}; "
                             f"set frames_step = {self.vae_scale_factor_temporal}")
