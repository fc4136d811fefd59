"""Qwen-Image text-to-image: the step contract over diffusers' QwenImagePipeline.

Mirrors `QwenImagePipeline.__call__` with `true_cfg_scale = guidance_scale` and the request's
negative prompt always passed (so CFG runs whenever guidance_scale > 1, the schema's rule):

  text       Qwen2.5-VL's last hidden state of the prompt in the pipeline's chat template,
             the template's first tokens dropped, cut at `max_sequence_length`; the pipeline
             pads a batch to its longest text, we pad to `max_sequence_length` (one shape for
             every request) with the padding masked out of the joint attention
  CFG        true CFG as [negative, prompt] rows, then each 2x2-patch token of the guided
             output rescaled to the norm of the prompt row's token (`guide`)
  schedule   flow-matching Euler on sigmas linspace(1, 1/N, N) shifted by the request's
             packed token count (flow_shift.py)
  latents    drawn and stepped as [1, 16, H/8, W/8] (the pipeline draws [1, 1, 16, H/8, W/8]:
             the same numbers), packed into 2x2 patches for each forward
  decode     per-channel latent statistics undone (wan_vae.py), the VAE run on one frame
"""
from __future__ import annotations

import torch
from diffusers import AutoencoderKLQwenImage, QwenImagePipeline

from ..schema import GenerationParams
from ..state import TextConditioning
from .base import FamilyAdapter
from .flow_shift import SizeShiftedSchedule
from .wan_vae import WanStyleVAE

PATCH = 2   # QwenImagePipeline packs 2x2 latents into one token


def pack_tokens(latents: torch.Tensor) -> torch.Tensor:
    n, c, h, w = latents.shape
    return QwenImagePipeline._pack_latents(latents, n, c, h, w)


def unpack_tokens(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """[N, tokens, C*4] -> [N, C, h, w] (QwenImagePipeline._unpack_latents without its frame axis)."""
    n, _, channels = tokens.shape
    out = tokens.view(n, h // PATCH, w // PATCH, channels // PATCH**2, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
    return out.reshape(n, channels // PATCH**2, h, w)


class QwenImageAdapter(SizeShiftedSchedule, WanStyleVAE, FamilyAdapter):
    pipeline_class = QwenImagePipeline
    vae_class = AutoencoderKLQwenImage
    family = "qwen-image"
    component_names = ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")
    spatial_patch = PATCH

    # ---- text_encoder stage ----------------------------------------------------------------
    @torch.inference_mode()
    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        length = self.deployment.model.max_sequence_length
        embeds, mask = self.pipe.encode_prompt(texts, device=self.device, max_sequence_length=length)
        if mask is None:   # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.int64, device=embeds.device)
        pad = length - embeds.shape[1]
        return torch.nn.functional.pad(embeds, (0, 0, 0, pad)), torch.nn.functional.pad(mask.to(torch.int64), (0, pad))

    # ---- dit stage -------------------------------------------------------------------------
    @property
    def text_embed_dim(self) -> int:
        return self.pipe.transformer.config.joint_attention_dim

    @property
    def num_channels_latents(self) -> int:
        if self.pipe.transformer is None:
            return self._vae_config["z_dim"]
        return self.pipe.transformer.config.in_channels // PATCH**2

    def latent_shape(self, params: GenerationParams) -> tuple[int, ...]:
        scale = self.vae_scale_factor
        return (1, self.num_channels_latents, params.height // scale, params.width // scale)

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        """[N, C, h, w] latents -> packed tokens -> transformer -> [N, C, h, w] velocity."""
        n, _, h, w = latents.shape
        transformer = self.pipe.transformer
        out = transformer(hidden_states=pack_tokens(latents.to(transformer.dtype)), timestep=timesteps.to(latents.dtype) / 1000,
                          encoder_hidden_states=cond.embeds, encoder_hidden_states_mask=cond.mask,
                          img_shapes=[[(1, h // PATCH, w // PATCH)]] * n, return_dict=False)[0]
        return unpack_tokens(out, h, w)

    def guide(self, uncond: torch.Tensor, text: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """True CFG, then every packed token rescaled to the norm of its prompt-row token, as the pipeline does."""
        h, w = uncond.shape[-2:]
        combined = pack_tokens(super().guide(uncond, text, scales))
        text = pack_tokens(text)
        combined = combined * (torch.norm(text, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))
        return unpack_tokens(combined, h, w)

    # ---- vae_decode stage ------------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** len(self._vae_config["temperal_downsample"])

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """[N, C, h, w] -> one-frame video latents, un-normalised as the pipeline does -> [N, 3, H, W]."""
        latents = latents.unsqueeze(2)
        latents_mean, latents_std = self.latent_stats(latents.device, latents.dtype)
        return self.pipe.vae.decode(latents / latents_std + latents_mean, return_dict=False)[0][:, :, 0]

    def check_limits(self, stage: str) -> None:
        path, model = self.deployment.model.path, self.deployment.model
        if stage == "text_encoder" and model.max_sequence_length > self.pipe.tokenizer_max_length:
            raise ValueError(f"deployment [model] max_sequence_length={model.max_sequence_length}: QwenImagePipeline "
                             f"takes at most {self.pipe.tokenizer_max_length} tokens")
        if stage != "dit":
            return
        if self.pipe.transformer.config.guidance_embeds:
            raise ValueError(f"{path}'s transformer is guidance-distilled (guidance_embeds): family \"qwen-image\" "
                             f"serves true-CFG checkpoints only")
        if self.pipe.scheduler.config.get("shift_terminal") and self.deployment.limits.min_steps < 2:
            raise ValueError(f"{path}'s scheduler stretches its sigmas to shift_terminal="
                             f"{self.pipe.scheduler.config.shift_terminal}, which makes a 1-step schedule NaN "
                             f"(diffusers FlowMatchEulerDiscreteScheduler); set [limits] min_steps = 2")
        need = self.vae_scale_factor * PATCH
        if self.deployment.limits.size_multiple % need:
            raise ValueError(f"deployment [limits] size_multiple={self.deployment.limits.size_multiple} must be a "
                             f"multiple of {need} (vae scale factor x 2x2 packing) for {path}; set size_multiple = {need}")
