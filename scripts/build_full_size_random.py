#!/usr/bin/env python
"""Build a FULL-SIZE pipeline with RANDOM weights, for GPU perf runs.

  --family pixart-sigma (default): same classes and configs as
      `PixArt-alpha/PixArt-Sigma-XL-2-1024-MS` (transformer 0.6B, T5-v1.1-XXL encoder 4.8B,
      SDXL VAE, DPM-Solver++), ~11 GB in bf16, into `models/pixart-sigma-1024-random/`.
  --family wan-t2v: same classes and configs as `Wan-AI/Wan2.1-T2V-1.3B-Diffusers`
      (transformer 1.3B, UMT5-XXL encoder 5.7B, Wan2.1 VAE, flow UniPC), ~14 GB in bf16,
      into `models/wan2.1-t2v-1.3b-random/`.
  --family wan-i2v: same classes and configs as `Wan-AI/Wan2.1-I2V-14B-480P-Diffusers`
      (transformer 16.4B with image cross-attention and 36 input channels, UMT5-XXL encoder
      5.7B, CLIP ViT-H/14 vision encoder 0.63B + CLIPImageProcessor, Wan2.1 VAE, flow UniPC),
      ~46 GB in bf16, into `models/wan2.1-i2v-14b-480p-random/`.
  --family wan22-t2v: same classes and configs as `Wan-AI/Wan2.2-T2V-A14B-Diffusers` (two
      14.3B experts, high-noise `transformer` and low-noise `transformer_2`, switched at
      boundary_ratio 0.875; UMT5-XXL encoder 5.7B, Wan2.1 VAE, flow UniPC), ~68 GB in bf16, into
      `models/wan2.2-t2v-a14b-random/`: more than one H200 machine's 64 GiB disk, so build it on
      nvidia-h200-x2 (128 GiB) or with fewer --transformer-layers.
  --family qwen-image: same classes and configs as `Qwen/Qwen-Image` (MMDiT 20.4B of 60
      blocks, Qwen2.5-VL-7B text encoder 8.3B with its vision tower, Qwen-Image VAE,
      size-shifted flow-match Euler), ~58 GB in bf16, into `models/qwen-image-random/`.
  --family flux: same classes and configs as `black-forest-labs/FLUX.1-dev` (transformer 11.9B:
      19 double- and 38 single-stream blocks, CLIP-L text 0.12B, T5-v1.1-XXL encoder 4.8B,
      16-channel VAE, dynamic-shift flow-match Euler), ~34 GB in bf16, into
      `models/flux.1-dev-random/`. FLUX.1-schnell is the same without the guidance embedding.
  --family sd3: same classes and configs as `stabilityai/stable-diffusion-3.5-large` (MMDiT
      8.1B, CLIP-L 0.12B and CLIP-G 0.69B text towers with projection, T5-v1.1-XXL encoder
      4.8B, 16-channel VAE, flow-match Euler with shift 3), ~27 GB in bf16, into
      `models/sd3.5-large-random/`.

Speed and memory match the real checkpoint; the outputs are noise. Written in diffusers
layout (safetensors). No network: the tokenizers are the tiny offline ones from
build_tiny_pipelines.py (their ids are all below the real vocabularies, and the pipelines pad
every prompt to max_sequence_length tokens (CLIP: 77) anyway, so encoder cost is the real one).

Fast on a GPU: modules are created directly on the device in the target dtype (no fp32
copy on the host), random-initialised there, checked for finite outputs, then saved.

    python scripts/build_full_size_random.py                       # GPU, bf16, full size
    python scripts/build_full_size_random.py --family wan-t2v      # GPU, bf16, full size
    python scripts/build_full_size_random.py --family wan-i2v      # GPU, bf16, full size (~46 GB)
    python scripts/build_full_size_random.py --device cpu --text-encoder-layers 1 \\
        --transformer-layers 1 --out /tmp/fs-smoke --verify        # CPU smoke of the layout

Reduced layer counts are for smoke tests only (they cut the text encoder's and the
transformer's depth; widths, the CLIP tower, the VAE and the scheduler stay full size); the
folder records them in its `build_info.json`.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub

import argparse
import contextlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from build_tiny_pipelines import (  # noqa: E402  (offline T5 and CLIP tokenizers, real configs)
    CLIP_G_TEXT_CONFIG,
    CLIP_L_TEXT_CONFIG,
    FLUX_DEV_SCHEDULER_CONFIG,
    FLUX_TRANSFORMER_CONFIG,
    FLUX_VAE_CONFIG,
    PIXART_SIGMA_SCHEDULER_CONFIG,
    PIXART_SIGMA_TRANSFORMER_CONFIG,
    QWEN25_VL_TEXT_CONFIG,
    QWEN25_VL_VISION_CONFIG,
    QWEN_IMAGE_SCHEDULER_CONFIG,
    QWEN_IMAGE_TRANSFORMER_CONFIG,
    QWEN_IMAGE_VAE_CONFIG,
    SD3_SCHEDULER_CONFIG,
    SD3_TRANSFORMER_CONFIG,
    SD3_VAE_CONFIG,
    SDXL_VAE_CONFIG,
    WAN_I2V_IMAGE_ENCODER_CONFIG,
    WAN_I2V_IMAGE_PROCESSOR_CONFIG,
    WAN22_T2V_BOUNDARY_RATIO,
    WAN22_T2V_TRANSFORMER_CONFIG,
    WAN_I2V_TRANSFORMER_CONFIG,
    WAN_T2V_SCHEDULER_CONFIG,
    WAN_T2V_TRANSFORMER_CONFIG,
    WAN_VAE_CONFIG,
    name_clip_image_processor,
    qwen25_vl_config,
    tiny_clip_tokenizer,
    tiny_input_image,
    tiny_qwen_tokenizer,
    tiny_t5_tokenizer,
)
from diffusers import (  # noqa: E402
    AutoencoderKL,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
    DiffusionPipeline,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    PixArtSigmaPipeline,
    PixArtTransformer2DModel,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import (  # noqa: E402
    CLIPImageProcessor,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionConfig,
    CLIPVisionModel,
    Qwen2_5_VLForConditionalGeneration,
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

SEED = 0

# --- configs of PixArt-alpha/PixArt-Sigma-XL-2-1024-MS -------------------------------------
# text_encoder/config.json (google/t5-v1_1-xxl, encoder only)
T5_CONFIG = dict(
    vocab_size=32128,
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=24,
    num_decoder_layers=24,
    num_heads=64,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu",  # dense_act_fn gelu_new, is_gated_act true
    dropout_rate=0.1,  # as in the checkpoint; inactive in eval mode
    classifier_dropout=0.0,
    layer_norm_epsilon=1e-6,
    initializer_factor=1.0,
    tie_word_embeddings=False,
    is_encoder_decoder=True,
    use_cache=True,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)

# --- configs of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (transformer, VAE, scheduler: build_tiny_pipelines)
# text_encoder/config.json (google/umt5-xxl, encoder only: T5-XXL shapes, a 256k multilingual
# vocabulary and a relative attention bias in every layer)
UMT5_CONFIG = {**T5_CONFIG, "vocab_size": 256384}


def log(msg: str) -> None:
    print(f"[build_full_size_random] {msg}", flush=True)


@contextlib.contextmanager
def build_context(device: torch.device, dtype: torch.dtype):
    """Create parameters directly on `device` in `dtype` (no fp32 host copy of 4.8B params)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


class Timer:
    def __init__(self, device: torch.device):
        self.device = device
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times[name] = round(time.perf_counter() - start, 3)
        log(f"{name}: {self.times[name]:.2f}s")


def cast_if_needed(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast floating tensors not created in `dtype` (e.g. PixArt's fp32 sin-cos pos_embed buffer).

    Plain `nn.Module.to`: diffusers' `ModelMixin.to` would warn about fp32-kept modules,
    and these models have none.
    """
    tensors = [*module.parameters(), *module.buffers()]
    if any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        module = torch.nn.Module.to(module, dtype)
    return module


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_finite(name: str, tensor: torch.Tensor) -> dict:
    t = tensor.float()
    if not torch.isfinite(t).all():
        raise RuntimeError(f"{name}: non-finite values in a random-weight forward (dtype {tensor.dtype})")
    stats = {"shape": list(tensor.shape), "mean": round(t.mean().item(), 4), "std": round(t.std().item(), 4),
             "absmax": round(t.abs().max().item(), 4)}
    log(f"  check {name}: {stats}")
    return stats


def random_latents(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator("cpu").manual_seed(SEED)).to(device, dtype)


def check_text_encoder(c: dict, device: torch.device, max_sequence_length: int
                       ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One encode of a prompt and an empty negative, padded to max_sequence_length as the pipelines do."""
    ids = c["tokenizer"](["a photo of a red cat on a blue sofa", ""], padding="max_length",
                         max_length=max_sequence_length, truncation=True, return_tensors="pt")
    mask = ids.attention_mask.to(device)
    embeds = c["text_encoder"](ids.input_ids.to(device), attention_mask=mask)[0]
    return embeds, mask, check_finite("text_encoder", embeds)


# --- PixArt-Sigma -------------------------------------------------------------------------------
PIXART_MAX_SEQUENCE_LENGTH = 300  # PixArt-Sigma's T5 length (configs/*.toml max_sequence_length)


def pixart_components(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, timer: Timer) -> dict:
    with timer("tokenizer"):
        tokenizer = tiny_t5_tokenizer(model_max_length=PIXART_MAX_SEQUENCE_LENGTH)
    with timer("text_encoder init"), build_context(device, dtype):
        t5_config = T5Config(**{**T5_CONFIG, "num_layers": args.text_encoder_layers})
        text_encoder = cast_if_needed(T5EncoderModel(t5_config), dtype).eval()
    with timer("transformer init"), build_context(device, dtype):
        transformer = PixArtTransformer2DModel(**{**PIXART_SIGMA_TRANSFORMER_CONFIG,
                                                  "num_layers": args.transformer_layers})
        transformer = cast_if_needed(transformer, dtype).eval()
    with timer("vae init"), build_context(device, dtype):
        vae = cast_if_needed(AutoencoderKL(**SDXL_VAE_CONFIG), dtype).eval()
    scheduler = DPMSolverMultistepScheduler(**PIXART_SIGMA_SCHEDULER_CONFIG)
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler)


@torch.inference_mode()
def pixart_check(c: dict, device: torch.device, latent_side: int) -> dict:
    """One T5 encode, one transformer forward and one VAE decode on random inputs: all finite.
    Default latents: 1024px on a GPU, 256px on a CPU."""
    transformer, vae = c["transformer"], c["vae"]
    embeds, mask, encoded = check_text_encoder(c, device, PIXART_MAX_SEQUENCE_LENGTH)
    side = latent_side or (128 if device.type == "cuda" else 32)
    latents = random_latents((2, 4, side, side), device, transformer.dtype)
    noise = transformer(latents, encoder_hidden_states=embeds, encoder_attention_mask=mask,
                        timestep=torch.tensor([999, 500], device=device),
                        added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)[0]
    image = vae.decode(latents[:1] / vae.config.scaling_factor, return_dict=False)[0]
    return {"text_encoder": encoded, "transformer": check_finite("transformer", noise),
            "vae_decode": check_finite("vae_decode", image)}


# --- Wan2.1 text-to-video -----------------------------------------------------------------------
WAN_MAX_SEQUENCE_LENGTH = 512  # Wan's UMT5 length


def wan_components(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, timer: Timer,
                   transformer_config: dict = WAN_T2V_TRANSFORMER_CONFIG) -> dict:
    with timer("tokenizer"):
        tokenizer = tiny_t5_tokenizer(model_max_length=WAN_MAX_SEQUENCE_LENGTH)
    with timer("text_encoder init"), build_context(device, dtype):
        umt5_config = UMT5Config(**{**UMT5_CONFIG, "num_layers": args.text_encoder_layers})
        text_encoder = cast_if_needed(UMT5EncoderModel(umt5_config), dtype).eval()
    with timer("transformer init"), build_context(device, dtype):
        # No cast: its only fp32 tensors are the rope tables, which from_pretrained keeps in fp32
        # too (WanTransformer3DModel._keep_in_fp32_modules).
        transformer = WanTransformer3DModel(**{**transformer_config, "num_layers": args.transformer_layers}).eval()
    with timer("vae init"), build_context(device, dtype):
        vae = cast_if_needed(AutoencoderKLWan(**WAN_VAE_CONFIG), dtype).eval()
    scheduler = UniPCMultistepScheduler(**WAN_T2V_SCHEDULER_CONFIG)
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler)


def wan_i2v_components(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, timer: Timer) -> dict:
    """Wan2.1 I2V: the T2V family's tokenizer, UMT5, VAE and scheduler, the 14B transformer
    with image cross-attention, and the CLIP ViT-H/14 vision tower with its image processor."""
    components = wan_components(args, device, dtype, timer, WAN_I2V_TRANSFORMER_CONFIG)
    with timer("image_encoder init"), build_context(device, dtype):
        image_encoder = CLIPVisionModel(CLIPVisionConfig(**WAN_I2V_IMAGE_ENCODER_CONFIG))
        image_encoder = cast_if_needed(image_encoder, dtype).eval()
    return {**components, "image_encoder": image_encoder,
            "image_processor": CLIPImageProcessor(**WAN_I2V_IMAGE_PROCESSOR_CONFIG)}


def wan22_components(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, timer: Timer) -> dict:
    """Wan2.2 A14B T2V: the Wan2.1 parts with the 14B transformer, and a second one as the low-noise expert."""
    components = wan_components(args, device, dtype, timer, WAN22_T2V_TRANSFORMER_CONFIG)
    with timer("transformer_2 init"), build_context(device, dtype):
        transformer_2 = WanTransformer3DModel(**{**WAN22_T2V_TRANSFORMER_CONFIG,
                                                 "num_layers": args.transformer_layers}).eval()
    return {**components, "transformer_2": transformer_2, "boundary_ratio": WAN22_T2V_BOUNDARY_RATIO}


@torch.inference_mode()
def wan_check(c: dict, device: torch.device, latent_side: int) -> dict:
    """One UMT5 encode, one transformer forward and one VAE decode on random inputs: all finite.
    Image-to-video adds one CLIP encode of a test image and one VAE encode of a first-frame
    condition video, and feeds the transformer its 36 channels and the image tokens.
    Default latents: 81 frames at 480x832 on a GPU, 9 frames at 64x64 on a CPU."""
    transformer, vae = c["transformer"], c["vae"]
    embeds, _, encoded = check_text_encoder(c, device, WAN_MAX_SEQUENCE_LENGTH)
    checks = {"text_encoder": encoded}
    frames, size = (21, (60, 104)) if device.type == "cuda" else (3, (8, 8))
    if latent_side:
        size = (latent_side, latent_side)
    image_kwargs = {}
    if c.get("image_encoder") is not None:
        encoder = c["image_encoder"]
        pixels = c["image_processor"](images=tiny_input_image(), return_tensors="pt").pixel_values
        image_embeds = encoder(pixels.to(device, encoder.dtype), output_hidden_states=True).hidden_states[-2]
        checks["image_encoder"] = check_finite("image_encoder", image_embeds)
        # [image, zeros x (F - 1)] in [-1, 1] at the video's pixel size, as the pipeline encodes it
        video = torch.zeros(1, 3, 4 * (frames - 1) + 1, 8 * size[0], 8 * size[1])
        video[:, :, 0] = torch.rand(1, 3, 8 * size[0], 8 * size[1],
                                    generator=torch.Generator("cpu").manual_seed(SEED)) * 2 - 1
        condition = vae.encode(video.to(device, vae.dtype)).latent_dist.mode()
        checks["vae_encode"] = check_finite("vae_encode", condition)
        image_kwargs["encoder_hidden_states_image"] = image_embeds.expand(2, -1, -1)
    latents = random_latents((2, transformer.config.in_channels, frames, *size), device, transformer.dtype)
    noise = transformer(hidden_states=latents, timestep=torch.tensor([999, 500], device=device),
                        encoder_hidden_states=embeds, return_dict=False, **image_kwargs)[0]
    checks["transformer"] = check_finite("transformer", noise)
    video = vae.decode(latents[:1, :vae.config.z_dim], return_dict=False)[0]
    checks["vae_decode"] = check_finite("vae_decode", video)
    return checks


# --- FLUX.1 and Stable Diffusion 3.5 ------------------------------------------------------------
def clip_text_tower(model_class: type, config: dict, tokenizer, dtype: torch.dtype) -> torch.nn.Module:
    """A full-size CLIP text tower whose special token ids are the offline tokenizer's (the pooled
    output is read at its end-of-text token)."""
    config = CLIPTextConfig(**{**config, "bos_token_id": tokenizer.bos_token_id,
                               "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id})
    return cast_if_needed(model_class(config), dtype).eval()


def t5_encoder(args: argparse.Namespace, dtype: torch.dtype) -> torch.nn.Module:
    return cast_if_needed(T5EncoderModel(T5Config(**{**T5_CONFIG, "num_layers": args.text_encoder_layers})), dtype).eval()


def clip_pooled(c: dict, tokenizer: str, text_encoder: str, device: torch.device) -> torch.Tensor:
    """One prompt through a CLIP tower, padded to CLIP's 77 tokens: its pooled (or projected) vector."""
    ids = c[tokenizer](["a photo of a red cat on a blue sofa"], padding="max_length", max_length=77, truncation=True,
                       return_tensors="pt").input_ids.to(device)
    out = c[text_encoder](ids)
    return out.text_embeds if hasattr(out, "text_embeds") else out.pooler_output



FLUX_MAX_SEQUENCE_LENGTH = 512  # FLUX.1-dev's T5 length (schnell: 256)


def flux_components(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, timer: Timer) -> dict:
    """CLIP-L text tower (pooled), T5-v1.1-XXL, the FLUX.1-dev transformer (--transformer-layers
    double-stream blocks and twice as many single-stream ones), the 16-channel VAE."""
    with timer("tokenizers"):
        tokenizer = tiny_clip_tokenizer()
        tokenizer_2 = tiny_t5_tokenizer(model_max_length=FLUX_MAX_SEQUENCE_LENGTH)
    with timer("text_encoder init"), build_context(device, dtype):
        text_encoder = clip_text_tower(CLIPTextModel, CLIP_L_TEXT_CONFIG, tokenizer, dtype)
    with timer("text_encoder_2 init"), build_context(device, dtype):
        text_encoder_2 = t5_encoder(args, dtype)
    with timer("transformer init"), build_context(device, dtype):
        transformer = FluxTransformer2DModel(**{**FLUX_TRANSFORMER_CONFIG, "num_layers": args.transformer_layers,
                                                "num_single_layers": 2 * args.transformer_layers})
        transformer = cast_if_needed(transformer, dtype).eval()
    with timer("vae init"), build_context(device, dtype):
        vae = cast_if_needed(AutoencoderKL(**FLUX_VAE_CONFIG), dtype).eval()
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
                transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER_CONFIG))


@torch.inference_mode()
def flux_check(c: dict, device: torch.device, latent_side: int) -> dict:
    """One CLIP and one T5 encode, one transformer forward on packed latents with guidance, one
    VAE decode: all finite. Default latents: 1024px on a GPU (4096 packed tokens), 64px on a CPU."""
    transformer, vae = c["transformer"], c["vae"]
    pooled = clip_pooled(c, "tokenizer", "text_encoder", device)
    t5 = {"tokenizer": c["tokenizer_2"], "text_encoder": c["text_encoder_2"]}
    embeds, _, encoded = check_text_encoder(t5, device, FLUX_MAX_SEQUENCE_LENGTH)
    side = latent_side or (128 if device.type == "cuda" else 8)
    latents = random_latents((1, 16, side, side), device, transformer.dtype)
    packed = FluxPipeline._pack_latents(latents, 1, 16, side, side)
    velocity = transformer(hidden_states=packed.expand(2, -1, -1), timestep=torch.tensor([1.0, 0.5], device=device),
                           guidance=torch.tensor([3.5, 3.5], device=device), pooled_projections=pooled.expand(2, -1),
                           encoder_hidden_states=embeds,
                           txt_ids=torch.zeros(embeds.shape[1], 3, device=device, dtype=transformer.dtype),
                           img_ids=FluxPipeline._prepare_latent_image_ids(1, side // 2, side // 2, device,
                                                                          transformer.dtype),
                           return_dict=False)[0]
    image = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor, return_dict=False)[0]
    return {"text_encoder": check_finite("text_encoder (pooled)", pooled), "text_encoder_2": encoded,
            "transformer": check_finite("transformer", velocity), "vae_decode": check_finite("vae_decode", image)}


SD3_MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default T5 length


def sd3_components(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, timer: Timer) -> dict:
    """CLIP-L and CLIP-G text towers with projection, T5-v1.1-XXL, the SD3.5-Large MMDiT, the VAE."""
    with timer("tokenizers"):
        tokenizer = tiny_clip_tokenizer()
        tokenizer_3 = tiny_t5_tokenizer(model_max_length=SD3_MAX_SEQUENCE_LENGTH)
    with timer("text_encoder init"), build_context(device, dtype):
        text_encoder = clip_text_tower(CLIPTextModelWithProjection, CLIP_L_TEXT_CONFIG, tokenizer, dtype)
    with timer("text_encoder_2 init"), build_context(device, dtype):
        text_encoder_2 = clip_text_tower(CLIPTextModelWithProjection, CLIP_G_TEXT_CONFIG, tokenizer, dtype)
    with timer("text_encoder_3 init"), build_context(device, dtype):
        text_encoder_3 = t5_encoder(args, dtype)
    with timer("transformer init"), build_context(device, dtype):
        transformer = SD3Transformer2DModel(**{**SD3_TRANSFORMER_CONFIG, "num_layers": args.transformer_layers})
        transformer = cast_if_needed(transformer, dtype).eval()
    with timer("vae init"), build_context(device, dtype):
        vae = cast_if_needed(AutoencoderKL(**SD3_VAE_CONFIG), dtype).eval()
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer, text_encoder_2=text_encoder_2,
                tokenizer_3=tokenizer_3, text_encoder_3=text_encoder_3, transformer=transformer, vae=vae,
                scheduler=FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER_CONFIG))


@torch.inference_mode()
def sd3_check(c: dict, device: torch.device, latent_side: int) -> dict:
    """Both CLIP towers and T5 once, one CFG-sized (2-row) transformer forward, one VAE decode:
    all finite. Default latents: 1024px on a GPU, 64px on a CPU."""
    transformer, vae = c["transformer"], c["vae"]
    pooled = torch.cat([clip_pooled(c, "tokenizer", "text_encoder", device),
                        clip_pooled(c, "tokenizer_2", "text_encoder_2", device)], dim=-1)
    t5 = {"tokenizer": c["tokenizer_3"], "text_encoder": c["text_encoder_3"]}
    embeds, _, encoded = check_text_encoder(t5, device, SD3_MAX_SEQUENCE_LENGTH)
    side = latent_side or (128 if device.type == "cuda" else 8)
    latents = random_latents((2, 16, side, side), device, transformer.dtype)
    noise = transformer(hidden_states=latents, timestep=torch.tensor([999.0, 500.0], device=device),
                        encoder_hidden_states=embeds, pooled_projections=pooled.expand(2, -1), return_dict=False)[0]
    image = vae.decode(latents[:1] / vae.config.scaling_factor + vae.config.shift_factor, return_dict=False)[0]
    return {"text_encoders (pooled)": check_finite("text_encoders (pooled)", pooled), "text_encoder_3": encoded,
            "transformer": check_finite("transformer", noise), "vae_decode": check_finite("vae_decode", image)}


QWEN_MAX_SEQUENCE_LENGTH = 512  # QwenImagePipeline's default


def qwen_image_components(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, timer: Timer) -> dict:
    """Qwen2.5-VL-7B (its vision tower too: the checkpoint holds it), the Qwen-Image MMDiT, its VAE."""
    with timer("tokenizer"):
        tokenizer = tiny_qwen_tokenizer()
    with timer("text_encoder init"), build_context(device, dtype):
        config = qwen25_vl_config(tokenizer, {**QWEN25_VL_TEXT_CONFIG, "num_hidden_layers": args.text_encoder_layers},
                                  QWEN25_VL_VISION_CONFIG)
        text_encoder = cast_if_needed(Qwen2_5_VLForConditionalGeneration(config), dtype).eval()
    with timer("transformer init"), build_context(device, dtype):
        transformer = QwenImageTransformer2DModel(**{**QWEN_IMAGE_TRANSFORMER_CONFIG,
                                                     "num_layers": args.transformer_layers})
        transformer = cast_if_needed(transformer, dtype).eval()
    with timer("vae init"), build_context(device, dtype):
        vae = cast_if_needed(AutoencoderKLQwenImage(**QWEN_IMAGE_VAE_CONFIG), dtype).eval()
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG))


@torch.inference_mode()
def qwen_image_check(c: dict, device: torch.device, latent_side: int) -> dict:
    """The pipeline's own prompt encode, one 2-row (true CFG) transformer forward, one VAE decode:
    all finite. Default latents: 1328px on a GPU, 64px on a CPU."""
    transformer, vae = c["transformer"], c["vae"]
    embeds, mask = QwenImagePipeline(**c).encode_prompt(["a photo of a red cat on a blue sofa", " "], device=device,
                                                        max_sequence_length=QWEN_MAX_SEQUENCE_LENGTH)
    side = latent_side or (166 if device.type == "cuda" else 8)
    latents = random_latents((2, (side // 2) ** 2, transformer.config.in_channels), device, transformer.dtype)
    noise = transformer(hidden_states=latents, timestep=torch.tensor([1.0, 0.5], device=device, dtype=transformer.dtype),
                        encoder_hidden_states=embeds, encoder_hidden_states_mask=mask,
                        img_shapes=[[(1, side // 2, side // 2)]] * 2, return_dict=False)[0]
    z = random_latents((1, vae.config.z_dim, 1, side, side), device, vae.dtype)
    image = vae.decode(z, return_dict=False)[0]
    return {"text_encoder": check_finite("text_encoder", embeds), "transformer": check_finite("transformer", noise),
            "vae_decode": check_finite("vae_decode", image)}


@dataclass(frozen=True)
class Family:
    """What differs between the families this script builds."""

    reference: str                  # the checkpoint whose configs are used
    default_out: Path
    text_encoder_layers: int        # the real depths (the defaults)
    transformer_layers: int
    pipeline_class: type[DiffusionPipeline]
    components: Callable[[argparse.Namespace, torch.device, torch.dtype, Timer], dict]
    check: Callable[[dict, torch.device, int], dict]   # finite-output forwards; int: --check-latent-side
    verify_kwargs: dict             # a cheap call of the reloaded pipeline, sized by --verify-size
    finish: Callable[[DiffusionPipeline], None] | None = None  # adjusts the pipeline before saving


FAMILIES = {
    "pixart-sigma": Family(
        reference="PixArt-alpha/PixArt-Sigma-XL-2-1024-MS",
        default_out=REPO_ROOT / "models" / "pixart-sigma-1024-random",
        text_encoder_layers=24, transformer_layers=28, pipeline_class=PixArtSigmaPipeline,
        components=pixart_components, check=pixart_check,
        verify_kwargs=dict(guidance_scale=4.5, use_resolution_binning=False, clean_caption=False),
    ),
    "wan-t2v": Family(
        reference="Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
        default_out=REPO_ROOT / "models" / "wan2.1-t2v-1.3b-random",
        text_encoder_layers=24, transformer_layers=30, pipeline_class=WanPipeline,
        components=wan_components, check=wan_check,
        verify_kwargs=dict(guidance_scale=5.0, num_frames=9),
    ),
    "wan-i2v": Family(
        reference="Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
        default_out=REPO_ROOT / "models" / "wan2.1-i2v-14b-480p-random",
        text_encoder_layers=24, transformer_layers=40, pipeline_class=WanImageToVideoPipeline,
        components=wan_i2v_components, check=wan_check,
        verify_kwargs=dict(guidance_scale=5.0, num_frames=9, image=tiny_input_image()),
        finish=name_clip_image_processor,
    ),
    "wan22-t2v": Family(
        reference="Wan-AI/Wan2.2-T2V-A14B-Diffusers",
        default_out=REPO_ROOT / "models" / "wan2.2-t2v-a14b-random",
        text_encoder_layers=24, transformer_layers=40, pipeline_class=WanPipeline,
        components=wan22_components, check=wan_check,
        verify_kwargs=dict(guidance_scale=4.0, num_frames=9),
    ),
    "qwen-image": Family(
        reference="Qwen/Qwen-Image",
        default_out=REPO_ROOT / "models" / "qwen-image-random",
        text_encoder_layers=28, transformer_layers=60, pipeline_class=QwenImagePipeline,
        components=qwen_image_components, check=qwen_image_check,
        # 2 steps: its 1-step schedule (stretched to shift_terminal) is NaN
        verify_kwargs=dict(negative_prompt=" ", true_cfg_scale=4.0, max_sequence_length=QWEN_MAX_SEQUENCE_LENGTH,
                           num_inference_steps=2),
    ),
    "flux": Family(
        reference="black-forest-labs/FLUX.1-dev",
        default_out=REPO_ROOT / "models" / "flux.1-dev-random",
        text_encoder_layers=24, transformer_layers=19, pipeline_class=FluxPipeline,
        components=flux_components, check=flux_check,
        verify_kwargs=dict(guidance_scale=3.5, max_sequence_length=FLUX_MAX_SEQUENCE_LENGTH),
    ),
    "sd3": Family(
        reference="stabilityai/stable-diffusion-3.5-large",
        default_out=REPO_ROOT / "models" / "sd3.5-large-random",
        text_encoder_layers=24, transformer_layers=38, pipeline_class=StableDiffusion3Pipeline,
        components=sd3_components, check=sd3_check,
        verify_kwargs=dict(guidance_scale=3.5, max_sequence_length=SD3_MAX_SEQUENCE_LENGTH),
    ),
}


def build(args: argparse.Namespace, family: Family) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    timer = Timer(device)
    info: dict = {"family": args.family, "dtype": args.dtype, "device": str(device), "seed": SEED,
                  "text_encoder_layers": args.text_encoder_layers, "transformer_layers": args.transformer_layers,
                  "full_size": (args.text_encoder_layers, args.transformer_layers) == (
                      family.text_encoder_layers, family.transformer_layers),
                  "reference": f"{family.reference} (configs; weights random)",
                  "versions": {"torch": torch.__version__, "diffusers": __import__("diffusers").__version__,
                               "transformers": __import__("transformers").__version__}}
    torch.manual_seed(SEED)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(SEED)

    components = family.components(args, device, dtype, timer)
    info["params"] = {name: n_params(module) for name, module in components.items()
                      if isinstance(module, torch.nn.Module)}
    info["params"]["tokenizer_vocab"] = len(components["tokenizer"])
    log(f"params: {info['params']}")
    if device.type == "cuda":
        info["cuda_memory_allocated_gib"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)

    if not args.skip_check:
        with timer("sanity forward"):
            info["check"] = family.check(components, device, args.check_latent_side)

    pipe = family.pipeline_class(**components)
    if family.finish is not None:
        family.finish(pipe)
    out = Path(args.out)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with timer("save_pretrained"):
        pipe.save_pretrained(tmp, safe_serialization=True)
    info["times_s"] = timer.times
    info["size_bytes"] = dir_size(tmp)
    (tmp / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"wrote {out} ({info['size_bytes'] / 2**30:.2f} GiB)")
    del pipe, components
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return info


@torch.inference_mode()
def verify_load(path: Path, family: Family, device: str, dtype: str, size: int) -> dict:
    """Reload with from_pretrained (as a server would) and run one step (or the family's verify steps)."""
    start = time.perf_counter()
    pipe = family.pipeline_class.from_pretrained(path, torch_dtype=getattr(torch, dtype)).to(device)
    load_s = time.perf_counter() - start
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    media = pipe(prompt="a photo of a cat", height=size, width=size, output_type="np",
                 generator=torch.Generator("cpu").manual_seed(SEED), return_dict=False,
                 **{"num_inference_steps": 1, **family.verify_kwargs})[0]
    run_s = time.perf_counter() - start
    media = np.asarray(media)
    if not np.isfinite(media).all():
        raise RuntimeError(f"{path}: reloaded pipeline produced non-finite values")
    result = {"class": type(pipe).__name__, "output_shape": list(media.shape), "mean": round(float(media.mean()), 4),
              "std": round(float(media.std()), 4), "load_s": round(load_s, 2), "one_step_s": round(run_s, 2),
              "components": {k: type(v).__name__ for k, v in pipe.components.items()}}
    log(f"verified reload: {result}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="pixart-sigma", choices=sorted(FAMILIES),
                    help="which architecture (default pixart-sigma)")
    ap.add_argument("--out", help="output folder (default models/pixart-sigma-1024-random, "
                                  "models/wan2.1-t2v-1.3b-random, models/wan2.1-i2v-14b-480p-random, models/wan2.2-t2v-a14b-random, "
                                  "models/qwen-image-random, "
                                  "models/flux.1-dev-random or models/sd3.5-large-random)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    ap.add_argument("--text-encoder-layers", type=int,
                    help="encoder blocks (default: the real 24, Qwen2.5-VL 28; fewer for smoke)")
    ap.add_argument("--transformer-layers", type=int,
                    help="transformer blocks (default: the real 28 PixArt / 30 Wan T2V / 40 Wan I2V and Wan2.2 / 19 "
                         "FLUX double-stream, with twice as many single-stream / 38 SD3.5 / 60 Qwen-Image; fewer for smoke)")
    ap.add_argument("--skip-check", action="store_true", help="skip the finite-output forward before saving")
    ap.add_argument("--check-latent-side", type=int, default=0,
                    help="latent height and width of the check (default: the real size on cuda, small on cpu)")
    ap.add_argument("--verify", action="store_true", help="reload with from_pretrained and run 1 step afterwards")
    ap.add_argument("--verify-size", type=int, default=256, help="image/frame side of the --verify step (default 256)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace --out even when it holds files this script did not finish (no build_info.json)")
    ap.add_argument("--if-missing", action="store_true",
                    help="do nothing when --out already holds a finished build of the same family, shape and dtype")
    args = ap.parse_args()
    family = FAMILIES[args.family]
    args.out = args.out or str(family.default_out)
    args.text_encoder_layers = args.text_encoder_layers or family.text_encoder_layers
    args.transformer_layers = args.transformer_layers or family.transformer_layers

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU (use --device cpu for a reduced smoke)", file=sys.stderr)
        return 1
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not (out / "build_info.json").exists() and not args.overwrite:
        print(f"error: {out} holds files but no build_info.json: another pipeline (e.g. a tiny one) or an "
              f"interrupted build. Remove it, choose another --out, or pass --overwrite", file=sys.stderr)
        return 1
    if args.if_missing and (out / "build_info.json").exists():
        prev = json.loads((out / "build_info.json").read_text())
        if (prev.get("family"), prev.get("dtype"), prev.get("text_encoder_layers"), prev.get("transformer_layers")) == (
                args.family, args.dtype, args.text_encoder_layers, args.transformer_layers):
            log(f"{out} already built ({prev.get('size_bytes', 0) / 2**30:.2f} GiB); skipping (--if-missing)")
            return 0
    start = time.perf_counter()
    try:
        info = build(args, family)
        if args.verify:
            info["verify"] = verify_load(out, family, args.device, args.dtype, args.verify_size)
            (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    except Exception as exc:  # one clear line, then the traceback for the log
        import traceback

        traceback.print_exc()
        print(f"error: building {args.out} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    log(f"done in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
