"""Wan2.1 image-to-video: the step contract over diffusers' WanImageToVideoPipeline.

Mirrors `WanImageToVideoPipeline.__call__` for Wan2.1 I2V (one transformer with image
cross-attention: `image_dim` set, no `boundary_ratio`, no `expand_timesteps`, no last
image). Text encoding, noise, scheduling and decoding are Wan2.1 T2V's (WanT2VAdapter);
the image adds two pieces of per-request conditioning, made by a vae_encode stage and
carried in `TextConditioning.extra`:

  image_embeds  CLIP vision penultimate hidden states of the input image as the pipeline's
                image processor sees it [1, T, image_dim]; every forward's
                `encoder_hidden_states_image`, the same for both CFG rows
  condition     [1, 4 + 16, f, h, w] float32: a mask marking latent frame 0 as given, then
                the VAE's latents (its mode) of [image, zeros x (F - 1)], normalised with its
                per-channel statistics; the image resized to the video's size exactly as
                `video_processor.preprocess` does (PIL Lanczos stretch, no crop, [-1, 1])

Every forward feeds the transformer [16 noise | 4 mask | 16 condition] = 36 channels per
row; the scheduler steps the 16 noise channels only.
"""
from __future__ import annotations

import numpy as np
import PIL.Image
import torch
from diffusers import WanImageToVideoPipeline
from diffusers.pipelines.wan.pipeline_wan_i2v import retrieve_latents
from transformers import CLIPVisionConfig

from ..schema import GenerationParams
from ..state import RequestState, TextConditioning
from .wan import WanT2VAdapter

IMAGE_EMBEDS = "image_embeds"
CONDITION = "condition"


def check_image(image: torch.Tensor, name: str = "image") -> None:
    """An input image is a uint8 [H, W, 3] tensor (RGB, channels last, 0..255) with H, W >= 1."""
    if not isinstance(image, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of uint8 [H, W, 3], got {type(image).__name__}")
    if image.dtype != torch.uint8:
        raise ValueError(f"{name} must be uint8 (0..255), got dtype {image.dtype}")
    if image.ndim != 3:
        raise ValueError(f"{name} must be [H, W, 3] (RGB, channels last), got shape {tuple(image.shape)}")
    if image.shape[-1] != 3:
        raise ValueError(f"{name} must have 3 channels (RGB, channels last), got {image.shape[-1]} "
                         f"(shape {tuple(image.shape)})")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(image.shape)}; height and width must be >= 1")


def to_pil(image: torch.Tensor) -> PIL.Image.Image:
    """The RGB PIL image of a checked uint8 [H, W, 3] tensor: the pipeline's processors then
    resize it exactly as they resize a user's PIL image."""
    check_image(image)
    return PIL.Image.fromarray(np.ascontiguousarray(image.cpu().numpy()))


class WanI2VAdapter(WanT2VAdapter):
    pipeline_class = WanImageToVideoPipeline
    family = "wan-i2v"
    component_names = WanT2VAdapter.component_names + ("image_encoder", "image_processor")

    # ---- vae_encode stage: the input image -> image_embeds + condition ----------------
    def preprocess_image(self, image: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """uint8 [H, W, 3] -> float32 [1, 3, height, width] in [-1, 1] on the device, as
        `video_processor.preprocess(image, height=height, width=width)` makes it."""
        if height < 1 or width < 1:
            raise ValueError(f"preprocess_image needs a positive video size, got height={height}, width={width}")
        pixels = self.pipe.video_processor.preprocess(to_pil(image), height=height, width=width)
        return pixels.to(self.device, dtype=torch.float32)

    @torch.inference_mode()
    def encode_image(self, images: list[torch.Tensor]) -> torch.Tensor:
        """CLIP image embeddings [N, T, image_dim] of N uint8 [H, W, 3] images (each as given,
        not resized to the video: the image processor crops and resizes them itself)."""
        if not images:
            raise ValueError("encode_image needs at least one image")
        pils = [to_pil(image) for image in images]
        return self.pipe.encode_image(pils, device=self.device)

    @torch.inference_mode()
    def encode_condition(self, pixels: torch.Tensor, num_frames: int) -> torch.Tensor:
        """[N, 3, H, W] preprocessed first frames -> condition [N, 4 + z_dim, f, h, w] float32:
        WanImageToVideoPipeline.prepare_latents' second output for each row."""
        temporal = self.vae_scale_factor_temporal
        if num_frames < 1 or (num_frames - 1) % temporal:
            raise ValueError(f"num_frames={num_frames}: num_frames - 1 must be a multiple of {temporal}")
        if pixels.ndim != 4 or pixels.shape[1] != 3:
            raise ValueError(f"pixels must be [N, 3, H, W] (preprocess_image's output), got {tuple(pixels.shape)}")
        vae = self.pipe.vae
        n, _, height, width = pixels.shape
        image = pixels.to(self.device, torch.float32).unsqueeze(2)  # [N, 3, 1, H, W]
        video = torch.cat([image, image.new_zeros(n, 3, num_frames - 1, height, width)], dim=2)
        latents = retrieve_latents(vae.encode(video.to(vae.dtype)), sample_mode="argmax")
        latents_mean, latents_std = self.latent_stats(self.device, torch.float32)
        latents = (latents.to(self.device, torch.float32) - latents_mean) * latents_std
        # The pipeline's mask: the first pixel frame repeated `temporal` times, then the
        # others, regrouped per latent frame: ones on latent frame 0, zeros after.
        mask = latents.new_zeros(n, temporal, *latents.shape[2:])
        mask[:, :, 0] = 1
        return torch.cat([mask, latents], dim=1)

    def encode_conditioning(self, image: torch.Tensor, params: GenerationParams) -> dict[str, torch.Tensor]:
        """One request's `TextConditioning.extra` from its uint8 [H, W, 3] input image."""
        pixels = self.preprocess_image(image, params.height, params.width)
        return {IMAGE_EMBEDS: self.encode_image([image]),
                CONDITION: self.encode_condition(pixels, params.num_frames)}

    # ---- dit stage ---------------------------------------------------------------------
    @property
    def num_channels_latents(self) -> int:
        """WanImageToVideoPipeline draws noise with the VAE's latent channels (the transformer takes 36)."""
        return self._vae_config["z_dim"]

    def prepare(self, key: str, params: GenerationParams, cond: TextConditioning) -> RequestState:
        self.check_conditioning(params, cond.extra)
        state = super().prepare(key, params, cond)
        extra = state.cond.extra
        extra[IMAGE_EMBEDS] = extra[IMAGE_EMBEDS].to(self.pipe.transformer.dtype)  # as the pipeline casts them
        extra[CONDITION] = extra[CONDITION].to(torch.float32)  # joined to the float32 latents, then cast
        return state

    def example_conditioning(self, params: GenerationParams) -> TextConditioning:
        """The text's zeros plus image conditioning of a real request's shapes (CLIP tokens from
        the image encoder's config: the dit stage does not load the encoder)."""
        vision = CLIPVisionConfig.from_pretrained(self.deployment.model_location(), subfolder="image_encoder")
        tokens = (vision.image_size // vision.patch_size) ** 2 + 1
        _, _, frames, h, w = self.latent_shape(params)
        condition = torch.zeros(1, self.pipe.transformer.config.in_channels - self.num_channels_latents, frames, h, w)
        cond = super().example_conditioning(params)
        cond.extra = {IMAGE_EMBEDS: torch.zeros(1, tokens, self.pipe.transformer.config.image_dim),
                      CONDITION: condition}
        return cond

    def check_conditioning(self, params: GenerationParams, extra: dict[str, torch.Tensor]) -> None:
        """Both pieces present and shaped for this request and model, before any work."""
        missing = [name for name in (IMAGE_EMBEDS, CONDITION) if name not in extra]
        if missing:
            raise ValueError(f"image-to-video conditioning lacks {missing} (made from the input image by "
                             f"WanI2VAdapter.encode_conditioning); got {sorted(extra)}")
        config = self.pipe.transformer.config
        _, _, frames, h, w = self.latent_shape(params)
        want = (1, config.in_channels - self.num_channels_latents, frames, h, w)
        if tuple(extra[CONDITION].shape) != want:
            raise ValueError(f"conditioning '{CONDITION}' has shape {tuple(extra[CONDITION].shape)}; "
                             f"{params.num_frames} frames at {params.height}x{params.width} need {want}")
        embeds = extra[IMAGE_EMBEDS]
        if embeds.ndim != 3 or embeds.shape[0] != 1 or embeds.shape[-1] != config.image_dim:
            raise ValueError(f"conditioning '{IMAGE_EMBEDS}' has shape {tuple(embeds.shape)}; "
                             f"need [1, tokens, {config.image_dim}]")

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        """[noise | mask | condition] rows in the transformer's dtype, as WanImageToVideoPipeline builds them."""
        transformer = self.pipe.transformer
        hidden_states = torch.cat([latents, cond.extra[CONDITION]], dim=1).to(transformer.dtype)
        return transformer(hidden_states=hidden_states, timestep=timesteps, encoder_hidden_states=cond.embeds,
                           encoder_hidden_states_image=cond.extra[IMAGE_EMBEDS], return_dict=False)[0]

    def check_variant(self) -> None:
        """Only Wan2.1 I2V (image cross-attention, one transformer) is mirrored here."""
        if self.pipe.config.boundary_ratio is not None or self.pipe.config.expand_timesteps:
            raise ValueError(f"{self.deployment.model.path} is a Wan2.2 image-to-video pipeline (boundary_ratio / "
                             f"expand_timesteps); family \"wan-i2v\" serves Wan2.1 I2V checkpoints only")

    def check_limits(self, stage: str) -> None:
        path = self.deployment.model.path
        self.check_variant()
        if stage == "vae_encode":
            for name in ("image_encoder", "image_processor"):
                if getattr(self.pipe, name) is None:
                    raise ValueError(f"{path} has no {name}: family \"wan-i2v\" needs Wan2.1 I2V's CLIP image "
                                     f"encoder and processor")
        if stage != "dit":
            return
        config = self.pipe.transformer.config
        z_dim, temporal = self.num_channels_latents, self.vae_scale_factor_temporal
        if config.image_dim is None or config.in_channels != 2 * z_dim + temporal:
            raise ValueError(f"{path}'s transformer (image_dim={config.image_dim}, in_channels={config.in_channels}) "
                             f"is not Wan2.1 I2V's (image_dim set, in_channels = 2 x {z_dim} latent + {temporal} "
                             f"mask channels = {2 * z_dim + temporal})")
        super().check_limits(stage)
