"""FLUX.1 text-to-image (dev and schnell): the step contract over diffusers' FluxPipeline.

Mirrors `FluxPipeline.__call__` with `true_cfg_scale=1` (no negative prompt, no CFG rows):

  text       T5 embeddings padded to `max_sequence_length` and the pooled CLIP embedding
             (mmdit.py)
  guidance   dev (`guidance_embeds`): `guidance_scale` feeds the transformer's guidance
             embedding, per request (`extra["guidance"]`); schnell: none
  schedule   flow-matching Euler on sigmas linspace(1, 1/N, N) with the shift `mu` of the
             request's packed token count (flow_shift.py), so requests of different sizes get
             different sigmas; each has its own scheduler anyway
  latents    drawn and stepped in the VAE layout [1, 16, H/8, W/8] (the scheduler step is
             elementwise, so this equals stepping the packed ones); each forward packs them
             into 2x2 patches with their image ids and unpacks the output
  decode     the VAE's scale and shift undone (autoencoder_kl.py)
"""
from __future__ import annotations

import torch
from diffusers import FluxPipeline

from ..schema import GenerationParams
from ..state import RequestState, TextConditioning
from .mmdit import POOLED, MMDiTAdapter

GUIDANCE = "guidance"
MAX_SEQUENCE_LENGTH = 512  # FluxPipeline.check_inputs' limit


class FluxAdapter(MMDiTAdapter):
    pipeline_class = FluxPipeline
    family = "flux"
    component_names = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2", "transformer", "vae", "scheduler")

    def encode_pooled(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, pooled, _ = self.pipe.encode_prompt(texts, prompt_2=None, device=self.device,
                                                    max_sequence_length=self.deployment.model.max_sequence_length)
        return embeds, pooled

    @property
    def num_channels_latents(self) -> int:
        if self.pipe.transformer is None:
            return super().num_channels_latents
        return self.pipe.transformer.config.in_channels // 4  # the transformer takes 2x2 patches

    @property
    def spatial_patch(self) -> int:
        return 2  # FluxPipeline packs 2x2 latents into one token (the transformer's patch_size is 1)

    def prepare(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        """Guidance added for dev: a per-request [1] float32, as the pipeline makes it."""
        state = super().prepare(key, params, cond)
        if self.pipe.transformer.config.guidance_embeds:
            state.cond.extra[GUIDANCE] = torch.full([1], params.guidance_scale, device=self.device, dtype=torch.float32)
        return state

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        """[N, C, h, w] latents -> packed tokens -> transformer -> [N, C, h, w] velocity."""
        transformer = self.pipe.transformer
        n, c, h, w = latents.shape
        dtype = transformer.dtype
        packed = FluxPipeline._pack_latents(latents.to(dtype), n, c, h, w)
        img_ids = FluxPipeline._prepare_latent_image_ids(n, h // 2, w // 2, latents.device, dtype)
        txt_ids = torch.zeros(cond.embeds.shape[1], 3, device=latents.device, dtype=dtype)
        out = transformer(hidden_states=packed, timestep=timesteps.to(dtype) / 1000, guidance=cond.extra.get(GUIDANCE),
                          pooled_projections=cond.extra[POOLED], encoder_hidden_states=cond.embeds, txt_ids=txt_ids,
                          img_ids=img_ids, return_dict=False)[0]
        scale = self.vae_scale_factor
        return FluxPipeline._unpack_latents(out, h * scale, w * scale, scale)

    def check_limits(self, stage: str) -> None:
        path, limits = self.deployment.model.path, self.deployment.limits
        if stage == "text_encoder" and self.deployment.model.max_sequence_length > MAX_SEQUENCE_LENGTH:
            raise ValueError(f"deployment [model] max_sequence_length={self.deployment.model.max_sequence_length}: "
                             f"FLUX.1's T5 takes at most {MAX_SEQUENCE_LENGTH} tokens")
        if stage != "dit":
            return
        if not self.pipe.transformer.config.guidance_embeds and limits.max_guidance_scale != 0:
            raise ValueError(f"{path}'s transformer has no guidance embedding (FLUX.1-schnell): guidance_scale would "
                             f"be ignored; set [limits] max_guidance_scale = 0 and [defaults] guidance_scale = 0")
        super().check_limits(stage)
