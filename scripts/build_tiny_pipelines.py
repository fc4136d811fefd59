#!/usr/bin/env python
"""Build tiny, randomly initialised diffusers pipelines for offline tests.

Each pipeline uses the real diffusers/transformers classes and a config shaped
like the real checkpoint, only shrunk, so serving code paths (loading, text
encoding, denoising, VAE decode) run end to end in milliseconds with no hub
access. Weights come from a fixed seed, so rebuilding gives byte-identical
safetensors files.

    python scripts/build_tiny_pipelines.py [--out models] [--only NAME] [--force]
"""

from __future__ import annotations

import os

# The builders and the verification reload must never reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"

import argparse
import shutil
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLWan,
    DiffusionPipeline,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    AutoencoderKLQwenImage,
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
from PIL import Image
from transformers import (
    CLIPImageProcessor,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    CLIPVisionConfig,
    CLIPVisionModel,
    PreTrainedModel,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,
    T5EncoderModel,
    T5Tokenizer,
    UMT5EncoderModel,
)

SEED = 0

# Whole words get their own piece so prompts tokenize to few, meaningful ids;
# anything else falls back to single characters.
COMMON_WORDS = """
a an the of and in on with at by for from to is under over near
photo picture painting portrait drawing art style digital detailed quality high
cat dog bird horse fish man woman girl boy child people astronaut robot
tree flower forest mountain river lake sea ocean beach sky cloud sun moon star
house city street road car boat castle garden field snow rain water fire
red blue green yellow orange purple pink black white gray brown golden
small large big tiny beautiful cute old young bright dark light night day sunset
riding sitting standing flying running wearing holding looking
""".split()
COMMON_SUFFIXES = ["es", "ed", "er", "est", "ing", "ly", "tion"]

# PixArt-alpha/PixArt-Sigma-XL-2-1024-MS transformer/config.json: the tiny build shrinks it,
# scripts/build_full_size_random.py uses it whole.
PIXART_SIGMA_TRANSFORMER_CONFIG = dict(
    sample_size=128,  # latent side at 1024px
    patch_size=2,
    in_channels=4,
    out_channels=8,  # eps + learned sigma
    num_layers=28,
    num_attention_heads=16,
    attention_head_dim=72,  # hidden 1152
    cross_attention_dim=1152,
    caption_channels=4096,  # T5-XXL d_model
    activation_fn="gelu-approximate",
    attention_bias=True,
    num_embeds_ada_norm=1000,
    norm_type="ada_norm_single",
    norm_elementwise_affine=False,
    norm_eps=1e-6,
    norm_num_groups=32,
    interpolation_scale=2,
    use_additional_conditions=False,
    upcast_attention=False,
    attention_type="default",
    # The checkpoint's only_cross_attention/double_self_attention/use_linear_projection
    # (all false) are legacy Transformer2DModel keys this class no longer takes.
    dropout=0.0,
)

# Its scheduler/scheduler_config.json: DPMSolverMultistepScheduler's defaults, spelled out so a
# change of diffusers defaults cannot drift it.
PIXART_SIGMA_SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    beta_start=0.0001,
    beta_end=0.02,
    beta_schedule="linear",
    algorithm_type="dpmsolver++",
    solver_order=2,
    solver_type="midpoint",
    prediction_type="epsilon",
    lower_order_final=True,
    timestep_spacing="linspace",
    steps_offset=0,
)

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json: the tiny build shrinks it,
# scripts/build_full_size_random.py uses it whole.
WAN_T2V_TRANSFORMER_CONFIG = dict(
    patch_size=[1, 2, 2],  # (frames, height, width)
    num_attention_heads=12,
    attention_head_dim=128,  # hidden 1536
    in_channels=16,
    out_channels=16,
    text_dim=4096,  # UMT5-XXL d_model
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)

# Wan-AI/Wan2.1-I2V-14B-480P-Diffusers transformer/config.json: the 14B block with image
# cross-attention (CLIP tokens lifted to the hidden width, hence added_kv_proj_dim = 40 * 128)
# and 36 input channels (16 noise + 4 first-frame mask + 16 condition latents).
WAN_I2V_TRANSFORMER_CONFIG = {
    **WAN_T2V_TRANSFORMER_CONFIG,
    "num_attention_heads": 40,
    "attention_head_dim": 128,  # hidden 5120
    "in_channels": 36,
    "ffn_dim": 13824,
    "num_layers": 40,
    "image_dim": 1280,  # CLIP ViT-H/14 width
    "added_kv_proj_dim": 5120,
}

# Wan-AI/Wan2.2-T2V-A14B-Diffusers: model_index.json's boundary_ratio (the high-noise expert
# `transformer` runs while t >= boundary_ratio x 1000, the low-noise `transformer_2` after) and
# the experts' transformer/config.json (both alike): Wan2.1's 14B block over 16 channels, no
# image inputs.
WAN22_T2V_BOUNDARY_RATIO = 0.875
WAN22_T2V_TRANSFORMER_CONFIG = {
    **WAN_T2V_TRANSFORMER_CONFIG,
    "num_attention_heads": 40,
    "attention_head_dim": 128,  # hidden 5120
    "ffn_dim": 13824,
    "num_layers": 40,
}

# Its image_encoder/config.json (CLIPVisionModel, open_clip ViT-H/14 laion2B; the pipeline
# feeds the transformer the penultimate layer's 257 tokens) and image_processor/
# preprocessor_config.json (CLIPImageProcessor: shortest edge 224, bicubic, center crop 224,
# OpenAI CLIP mean/std).
WAN_I2V_IMAGE_ENCODER_CONFIG = dict(
    hidden_size=1280,
    intermediate_size=5120,
    projection_dim=1024,
    num_hidden_layers=32,
    num_attention_heads=16,
    num_channels=3,
    image_size=224,
    patch_size=14,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    attention_dropout=0.0,
    initializer_range=0.02,
    initializer_factor=1.0,
)
WAN_I2V_IMAGE_PROCESSOR_CONFIG = dict(
    do_resize=True,
    size={"shortest_edge": 224},
    resample=3,  # bicubic
    do_center_crop=True,
    crop_size={"height": 224, "width": 224},
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
    do_convert_rgb=True,
)

# Its vae/config.json (the Wan2.1 VAE: 8x spatial and 4x temporal compression, 16 latent
# channels with per-channel statistics the pipeline un-normalises before decoding).
WAN_VAE_CONFIG = dict(
    base_dim=96,
    z_dim=16,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    dropout=0.0,
    latents_mean=[-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                  0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
    latents_std=[2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                 3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160],
)

# Its scheduler/scheduler_config.json: UniPC on flow-matching sigmas shifted by 3.0 (480p).
WAN_T2V_SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    beta_start=0.0001,
    beta_end=0.02,
    beta_schedule="linear",
    solver_order=2,
    prediction_type="flow_prediction",
    predict_x0=True,
    solver_type="bh2",
    lower_order_final=True,
    disable_corrector=[],
    use_flow_sigmas=True,
    flow_shift=3.0,
    timestep_spacing="linspace",
    steps_offset=0,
    final_sigmas_type="zero",
)

# Wan-AI/Wan2.2-TI2V-5B-Diffusers: model_index.json's expand_timesteps (a timestep per latent
# token), its transformer/config.json (24 heads x 128, 30 layers, 48 channels) and the Wan2.2
# VAE (vae/config.json: 48 latent channels, 2x2 pixel patches then 8x, i.e. 16x spatial and 4x
# temporal compression, residual blocks, separate decoder width). Its per-channel latent
# statistics are not reproduced here: the tiny build uses mean 0 / std 1.
WAN22_TI2V_TRANSFORMER_CONFIG = {
    **WAN_T2V_TRANSFORMER_CONFIG,
    "num_attention_heads": 24,
    "attention_head_dim": 128,  # hidden 3072
    "in_channels": 48,
    "out_channels": 48,
    "ffn_dim": 14336,
    "num_layers": 30,
}
WAN22_VAE_CONFIG = {
    **WAN_VAE_CONFIG,
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    "latents_mean": [0.0] * 48,
    "latents_std": [1.0] * 48,
}


# black-forest-labs/FLUX.1-dev transformer/config.json: 19 double-stream and 38 single-stream
# blocks of 24 heads x 128 (hidden 3072), 2x2-packed 16-channel latents (64 inputs), T5-XXL
# context and the pooled CLIP-L vector, RoPE over (text/image index, row, column). FLUX.1-schnell
# has the same transformer without the guidance embedding.
FLUX_TRANSFORMER_CONFIG = dict(
    patch_size=1,
    in_channels=64,
    out_channels=None,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,  # T5-XXL d_model
    pooled_projection_dim=768,  # CLIP ViT-L/14 text width
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)

# Its scheduler/scheduler_config.json: flow-matching Euler with the resolution-dependent shift
# mu (interpolated between base_shift at 256 and max_shift at 4096 packed image tokens).
FLUX_DEV_SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)
# FLUX.1-schnell's: no dynamic shifting, shift 1.0 (its 4 steps use the plain linear sigmas).
FLUX_SCHNELL_SCHEDULER_CONFIG = {**FLUX_DEV_SCHEDULER_CONFIG, "shift": 1.0, "use_dynamic_shifting": False}

# PixArt-Sigma's vae/config.json (the SDXL VAE as shipped with PixArt-Sigma: sample_size 512, force_upcast false)
SDXL_VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=32,
    sample_size=512,
    scaling_factor=0.13025,
    force_upcast=False,
)

# FLUX.1's vae/config.json: the same architecture with 16 latent channels, no quant convs, and
# latents scaled and shifted (scaling_factor, shift_factor) before the transformer sees them.
FLUX_VAE_CONFIG = {
    **SDXL_VAE_CONFIG,
    "latent_channels": 16,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "force_upcast": True,
    "mid_block_add_attention": True,
}

# Its text_encoder/config.json (openai/clip-vit-large-patch14's text tower; the pipeline takes
# the pooled output, 77 tokens).
CLIP_L_TEXT_CONFIG = dict(
    vocab_size=49408,
    hidden_size=768,
    intermediate_size=3072,
    projection_dim=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    max_position_embeddings=77,
    hidden_act="quick_gelu",
    layer_norm_eps=1e-5,
    attention_dropout=0.0,
    initializer_range=0.02,
    initializer_factor=1.0,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=1,
)


# stabilityai/stable-diffusion-3.5-large transformer/config.json: 38 MMDiT blocks of 38 heads
# x 64 (hidden 2432) with QK RMS norm, 2x2 patches of 16-channel latents, T5-XXL context and the
# CLIP-L + CLIP-G pooled vector (768 + 1280).
SD3_TRANSFORMER_CONFIG = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    num_layers=38,
    attention_head_dim=64,
    num_attention_heads=38,
    joint_attention_dim=4096,
    caption_projection_dim=2432,
    pooled_projection_dim=2048,
    out_channels=16,
    pos_embed_max_size=192,
    dual_attention_layers=(),
    qk_norm="rms_norm",
)

# Its scheduler/scheduler_config.json: flow-matching Euler with a static shift of 3.0.
SD3_SCHEDULER_CONFIG = dict(num_train_timesteps=1000, shift=3.0)

# Its vae/config.json: FLUX.1's 16-channel VAE architecture with SD3's scale and shift.
SD3_VAE_CONFIG = {**FLUX_VAE_CONFIG, "scaling_factor": 1.5305, "shift_factor": 0.0609}

# Its text_encoder_2/config.json (laion CLIP-ViT-bigG-14's text tower, with projection).
CLIP_G_TEXT_CONFIG = {
    **CLIP_L_TEXT_CONFIG,
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "projection_dim": 1280,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "hidden_act": "gelu",
}

# Qwen/Qwen-Image: transformer/config.json (60 dual-stream blocks of 24 heads x 128, 2x2-packed
# 16-channel latents, Qwen2.5-VL-7B context of width 3584, no guidance embedding), its VAE
# (AutoencoderKLQwenImage: the Wan2.1 VAE's layout and per-channel latent statistics, run on
# one frame) and scheduler/scheduler_config.json (flow-match Euler, dynamic shift up to 0.9
# over 8192 tokens, stretched to a terminal sigma of 0.02).
QWEN_IMAGE_TRANSFORMER_CONFIG = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=60,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=3584,
    guidance_embeds=False,
    axes_dims_rope=(16, 56, 56),  # sums to the head dim
)
QWEN_IMAGE_VAE_CONFIG = WAN_VAE_CONFIG
QWEN_IMAGE_SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=0.9,
    base_image_seq_len=256,
    max_image_seq_len=8192,
    shift_terminal=0.02,
    time_shift_type="exponential",
)
# Its text_encoder/config.json (Qwen/Qwen2.5-VL-7B-Instruct): the language model the pipeline
# reads the last hidden state of, and the vision tower it never runs for text-to-image.
QWEN25_VL_TEXT_CONFIG = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    hidden_act="silu",
    max_position_embeddings=128000,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
    tie_word_embeddings=False,
)
QWEN25_VL_VISION_CONFIG = dict(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    out_hidden_size=3584,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
    tokens_per_second=2,
)
# Qwen2.5-VL's special tokens (the chat template's and the vision placeholders), in its id order.
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>", "<|video_pad|>")
# Words of QwenImagePipeline's prompt template, given whole-word pieces like COMMON_WORDS.
QWEN_TEMPLATE_WORDS = ("system user assistant Describe describe image detailing color shape size texture quantity "
                       "text spatial relationships objects background").split()


def tiny_qwen_tokenizer() -> Qwen2Tokenizer:
    """Byte-level BPE Qwen2 tokenizer built in memory: the 256 byte symbols, merges that spell
    the template's and COMMON_WORDS' words (after a space first, so they win), and Qwen2.5-VL's
    special tokens; `<|endoftext|>` pads, as in the real one."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    merges = []
    words = dict.fromkeys([*QWEN_TEMPLATE_WORDS, *COMMON_WORDS])
    for word in [*("Ġ" + w for w in words), *words]:   # "Ġ" is the byte-level space
        piece = word[0]
        for symbol in word[1:]:
            if piece + symbol not in vocab:
                vocab[piece + symbol] = len(vocab)
                merges.append((piece, symbol))
            piece += symbol
    for token in QWEN_SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=2048)
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS[1:])})
    return tokenizer


def qwen25_vl_config(tokenizer: Qwen2Tokenizer, text: dict[str, Any], vision: dict[str, Any]) -> Qwen2_5_VLConfig:
    """A Qwen2.5-VL config over `tokenizer`'s special-token ids."""
    ids = {name: tokenizer.convert_tokens_to_ids(f"<|{name}|>") for name in
           ("endoftext", "im_end", "image_pad", "video_pad", "vision_start", "vision_end")}
    return Qwen2_5_VLConfig(
        text_config={**text, "bos_token_id": ids["endoftext"],
                     "eos_token_id": ids["im_end"], "pad_token_id": ids["endoftext"]},
        vision_config=vision, image_token_id=ids["image_pad"], video_token_id=ids["video_pad"],
        vision_start_token_id=ids["vision_start"], vision_end_token_id=ids["vision_end"])


def tiny_clip_tokenizer() -> CLIPTokenizer:
    """Byte-pair CLIP tokenizer over printable ASCII, built in memory: every character is a
    piece (with and without the end-of-word mark) and there are no merges, so a word is spelt
    out. 77 tokens, as CLIP's."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase + string.digits + string.punctuation:
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def tiny_clip_text_encoder(tokenizer: CLIPTokenizer, hidden_size: int, config: dict[str, Any] = CLIP_L_TEXT_CONFIG,
                           model_class: type[PreTrainedModel] = CLIPTextModel) -> PreTrainedModel:
    """A 2-layer CLIP text tower over a real one's config; its pooled output sits at the
    tokenizer's end-of-text token. `model_class=CLIPTextModelWithProjection` for SD3's."""
    torch.manual_seed(SEED)
    return model_class(CLIPTextConfig(**{
        **config,
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "projection_dim": hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    })).eval()


def tiny_t5_tokenizer(model_max_length: int = 300, extra_words: tuple[str, ...] = ()) -> T5Tokenizer:
    """Unigram T5 tokenizer over printable ASCII plus common words (and `extra_words`), built in memory.

    Scores are log-prob-like: a whole word beats spelling it out, and a
    word-initial piece ("▁x") beats a bare "▁" followed by the character.
    """
    words = dict.fromkeys([*COMMON_WORDS, *extra_words])  # ordered, no repeats: ids stay stable
    scores = {"▁": -12.0} | {"▁" + word: -5.0 for word in words} | {s: -7.0 for s in COMMON_SUFFIXES}
    for c in string.ascii_lowercase + string.digits + string.punctuation + string.ascii_uppercase:
        scores.setdefault("▁" + c, -9.0)
        scores.setdefault(c, -10.0)
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *scores.items()]  # ids 0, 1, 2 as in real T5
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=model_max_length)


def tiny_t5_encoder(vocab_size: int, d_model: int, model_class: type[PreTrainedModel] = T5EncoderModel,
                    **sizes: int) -> PreTrainedModel:
    """T5 v1.1-style encoder (gated-gelu, no output rescaling) like PixArt's T5-XXL, or with
    `model_class=UMT5EncoderModel` like Wan's UMT5-XXL (per-layer relative attention bias).
    `sizes` overrides d_kv, d_ff, num_layers, num_heads."""
    config = model_class.config_class(
        vocab_size=vocab_size,
        d_model=d_model,
        **{"d_kv": 16, "d_ff": 64, "num_layers": 2, "num_heads": 2, **sizes},
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        tie_word_embeddings=False,  # v1.1 marker; transformers 5 saves it as scale_decoder_outputs=false
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(SEED)
    return model_class(config).eval()


def tiny_sdxl_style_vae() -> AutoencoderKL:
    """Four-level AutoencoderKL: 8x spatial downscale and 4 latent channels, like the SDXL VAE."""
    torch.manual_seed(SEED)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=64,
        scaling_factor=0.13025,
        force_upcast=True,
    )


def build_tiny_pixart_sigma() -> DiffusionPipeline:
    """PixArt-Sigma-XL-2-1024-MS shrunk: same classes, scheduler and conditioning, tiny widths."""
    tokenizer = tiny_t5_tokenizer()
    text_encoder = tiny_t5_encoder(vocab_size=len(tokenizer), d_model=32)
    vae = tiny_sdxl_style_vae()
    torch.manual_seed(SEED)
    transformer = PixArtTransformer2DModel(**{
        **PIXART_SIGMA_TRANSFORMER_CONFIG,
        "sample_size": 8,  # latent side of a 64px image (vae scale factor 8)
        "num_layers": 2,
        "num_attention_heads": 2,
        "attention_head_dim": 8,
        "cross_attention_dim": 16,  # must equal heads * head_dim
        "caption_channels": text_encoder.config.d_model,
    }).eval()
    scheduler = DPMSolverMultistepScheduler(**PIXART_SIGMA_SCHEDULER_CONFIG)
    return PixArtSigmaPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )


def tiny_wan_parts(vae_res_blocks: int = 0) -> dict[str, Any]:
    """The tiny Wan2.1 tokenizer, UMT5 encoder, 2-channel VAE and flow UniPC scheduler,
    shared by the T2V and I2V builds (each part seeded on its own, so both get the same bytes).

    With no residual blocks the VAE only decodes (its encoder never widens the channels its
    downsamplers expect); image-to-video encodes too, so it asks for one per level.
    """
    tokenizer = tiny_t5_tokenizer(model_max_length=512)
    text_encoder = tiny_t5_encoder(vocab_size=len(tokenizer), d_model=32, model_class=UMT5EncoderModel)
    torch.manual_seed(SEED)
    vae = AutoencoderKLWan(**{**WAN_VAE_CONFIG, "base_dim": 2, "num_res_blocks": vae_res_blocks}).eval()
    scheduler = UniPCMultistepScheduler(**WAN_T2V_SCHEDULER_CONFIG)
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler)


def tiny_wan_transformer(config: dict[str, Any], text_dim: int, seed: int = SEED, **changes: Any
                         ) -> WanTransformer3DModel:
    """One narrow Wan transformer block (2 heads of 8) over a real Wan transformer config."""
    torch.manual_seed(seed)
    return WanTransformer3DModel(**{
        **config,
        "num_attention_heads": 2,
        "attention_head_dim": 8,
        "ffn_dim": 32,
        "num_layers": 1,
        "text_dim": text_dim,
        **changes,
    }).eval()


def build_tiny_wan_t2v() -> DiffusionPipeline:
    """Wan2.1-T2V-1.3B shrunk: same classes, compression factors, latent statistics and
    scheduler; one narrow transformer block and a 2-channel VAE, so that even an
    81-frame 480x832 video stays affordable on a CPU."""
    parts = tiny_wan_parts()
    transformer = tiny_wan_transformer(WAN_T2V_TRANSFORMER_CONFIG, parts["text_encoder"].config.d_model)
    return WanPipeline(**parts, transformer=transformer)


def build_tiny_wan22() -> DiffusionPipeline:
    """Wan2.2-T2V-A14B shrunk: tiny-wan-t2v's parts and two of its transformers, seeded apart so
    that running the wrong expert shows, switched at the real checkpoint's boundary_ratio."""
    parts = tiny_wan_parts()
    text_dim = parts["text_encoder"].config.d_model
    experts = {name: tiny_wan_transformer(WAN_T2V_TRANSFORMER_CONFIG, text_dim, seed=SEED + i)
               for i, name in enumerate(("transformer", "transformer_2"))}
    return WanPipeline(**parts, **experts, boundary_ratio=WAN22_T2V_BOUNDARY_RATIO)


def build_tiny_wan22_ti2v() -> DiffusionPipeline:
    """Wan2.2-TI2V-5B shrunk: tiny-wan-t2v's text encoder, tokenizer and scheduler, a narrow
    Wan2.2 VAE (48 channels, 16x) and one transformer block over 48 channels, with a timestep
    per token."""
    parts = tiny_wan_parts()
    torch.manual_seed(SEED)
    parts["vae"] = AutoencoderKLWan(**{**WAN22_VAE_CONFIG, "base_dim": 4, "decoder_base_dim": 4,
                                       "num_res_blocks": 1}).eval()
    transformer = tiny_wan_transformer(WAN22_TI2V_TRANSFORMER_CONFIG, parts["text_encoder"].config.d_model)
    return WanPipeline(**parts, transformer=transformer, expand_timesteps=True)


def build_tiny_wan_i2v() -> DiffusionPipeline:
    """Wan2.1-I2V-14B-480P shrunk: tiny-wan-t2v's text encoder and scheduler, its VAE with
    one residual block per level (so that it encodes), a 2-layer CLIP vision tower on 32px
    crops (17 tokens) with its image processor, and one narrow transformer block with image
    cross-attention over 36 input channels."""
    parts = tiny_wan_parts(vae_res_blocks=1)
    torch.manual_seed(SEED)
    image_encoder = CLIPVisionModel(CLIPVisionConfig(**{
        **WAN_I2V_IMAGE_ENCODER_CONFIG,
        "hidden_size": 16,
        "intermediate_size": 32,
        "projection_dim": 16,
        "num_hidden_layers": 2,  # the pipeline reads the penultimate hidden state
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    })).eval()
    image_processor = CLIPImageProcessor(**{
        **WAN_I2V_IMAGE_PROCESSOR_CONFIG,
        "size": {"shortest_edge": 32},
        "crop_size": {"height": 32, "width": 32},
    })
    inner_dim = 2 * 8  # tiny_wan_transformer's heads x head dim
    transformer = tiny_wan_transformer(WAN_I2V_TRANSFORMER_CONFIG, parts["text_encoder"].config.d_model,
                                       image_dim=image_encoder.config.hidden_size, added_kv_proj_dim=inner_dim)
    pipe = WanImageToVideoPipeline(**parts, image_encoder=image_encoder, image_processor=image_processor,
                                   transformer=transformer)
    name_clip_image_processor(pipe)
    return pipe


def name_clip_image_processor(pipe: DiffusionPipeline) -> None:
    """Without torchvision, transformers 5 hands out CLIPImageProcessorPil for CLIPImageProcessor;
    name the class the real checkpoint's model_index.json names, so either backend loads it."""
    pipe.register_to_config(image_processor=("transformers", "CLIPImageProcessor"))


def tiny_autoencoder_kl(config: dict[str, Any]) -> AutoencoderKL:
    """A real AutoencoderKL config (its latent channels, scale and shift) at tiny widths, one block per level."""
    torch.manual_seed(SEED)
    return AutoencoderKL(**{**config, "block_out_channels": (8, 8, 16, 16), "layers_per_block": 1,
                            "norm_num_groups": 4, "sample_size": 64}).eval()


def build_tiny_flux() -> DiffusionPipeline:
    """FLUX.1-dev shrunk: the same classes, guidance embedding, 16-channel VAE with its
    scale and shift, and dynamic-shift flow-matching scheduler; CLIP and T5 encoders of 2
    layers, one double- and one single-stream block of 2 heads x 16."""
    tokenizer = tiny_clip_tokenizer()
    text_encoder = tiny_clip_text_encoder(tokenizer, hidden_size=16)
    tokenizer_2 = tiny_t5_tokenizer(model_max_length=512)
    text_encoder_2 = tiny_t5_encoder(vocab_size=len(tokenizer_2), d_model=32)
    vae = tiny_autoencoder_kl(FLUX_VAE_CONFIG)
    torch.manual_seed(SEED)
    transformer = FluxTransformer2DModel(**{
        **FLUX_TRANSFORMER_CONFIG,
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": text_encoder_2.config.d_model,
        "pooled_projection_dim": text_encoder.config.hidden_size,
        "axes_dims_rope": (4, 6, 6),  # sums to the head dim
    }).eval()
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER_CONFIG), vae=vae,
                        text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
                        tokenizer_2=tokenizer_2, transformer=transformer)


def build_tiny_sd3() -> DiffusionPipeline:
    """Stable Diffusion 3.5 Large shrunk: the same classes, three text encoders (two CLIP
    towers with projection, T5), QK-normed MMDiT, 16-channel VAE with SD3's scale and shift
    and the static-shift flow-matching scheduler; 2 blocks of 2 heads x 8."""
    tokenizer = tiny_clip_tokenizer()
    text_encoder = tiny_clip_text_encoder(tokenizer, 16, model_class=CLIPTextModelWithProjection)
    text_encoder_2 = tiny_clip_text_encoder(tokenizer, 16, CLIP_G_TEXT_CONFIG, CLIPTextModelWithProjection)
    tokenizer_3 = tiny_t5_tokenizer(model_max_length=256)
    text_encoder_3 = tiny_t5_encoder(vocab_size=len(tokenizer_3), d_model=32)
    vae = tiny_autoencoder_kl(SD3_VAE_CONFIG)
    torch.manual_seed(SEED)
    transformer = SD3Transformer2DModel(**{
        **SD3_TRANSFORMER_CONFIG,
        "sample_size": 8,  # latent side of a 64px image
        "num_layers": 2,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": text_encoder_3.config.d_model,
        "caption_projection_dim": 16,  # heads x head dim
        "pooled_projection_dim": text_encoder.config.projection_dim + text_encoder_2.config.projection_dim,
        "pos_embed_max_size": 16,  # up to 256px
    }).eval()
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER_CONFIG), vae=vae,
        text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer,
        text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3)


def build_tiny_qwen_image() -> DiffusionPipeline:
    """Qwen-Image shrunk: the same classes, chat template, packed 16-channel latents, VAE
    statistics and scheduler; a 2-layer Qwen2.5-VL of width 32 (its vision tower 1 block),
    2 transformer blocks of 2 heads x 16 and a 2-channel VAE."""
    tokenizer = tiny_qwen_tokenizer()
    torch.manual_seed(SEED)
    text_encoder = Qwen2_5_VLForConditionalGeneration(qwen25_vl_config(tokenizer, {
        **QWEN25_VL_TEXT_CONFIG,
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "rope_parameters": {**QWEN25_VL_TEXT_CONFIG["rope_parameters"], "mrope_section": [2, 3, 3]},  # head dim 16
    }, {
        **QWEN25_VL_VISION_CONFIG,
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "out_hidden_size": 32,
        "fullatt_block_indexes": [0],
    })).eval()
    torch.manual_seed(SEED)
    transformer = QwenImageTransformer2DModel(**{
        **QWEN_IMAGE_TRANSFORMER_CONFIG,
        "num_layers": 2,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": text_encoder.config.text_config.hidden_size,
        "axes_dims_rope": (4, 6, 6),
    }).eval()
    torch.manual_seed(SEED)
    vae = AutoencoderKLQwenImage(**{**QWEN_IMAGE_VAE_CONFIG, "base_dim": 2, "num_res_blocks": 0}).eval()
    return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG), vae=vae,
                             text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def tiny_input_image(height: int = 40, width: int = 56) -> Image.Image:
    """A deterministic RGB test image (smooth gradients plus a square), of another size than
    the video so that the pipeline's resize runs."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                       (x + y) * 127 // (height + width)], axis=-1)
    pixels[height // 4:height // 2, width // 4:width // 2] = (250, 20, 60)
    return Image.fromarray(pixels.astype(np.uint8))


@dataclass(frozen=True)
class TinySpec:
    """How to build one tiny pipeline and the cheap call that proves it works."""

    build: Callable[[], DiffusionPipeline]
    smoke_kwargs: dict[str, Any]


PIPELINES: dict[str, TinySpec] = {
    "tiny-pixart-sigma": TinySpec(
        build=build_tiny_pixart_sigma,
        smoke_kwargs=dict(
            prompt="a photo of a cat",
            height=64,
            width=64,
            num_inference_steps=2,
            use_resolution_binning=False,  # binning only knows the real 256-2048px sample sizes
            clean_caption=False,
        ),
    ),
    "tiny-wan-t2v": TinySpec(
        build=build_tiny_wan_t2v,
        smoke_kwargs=dict(prompt="a photo of a cat", height=64, width=64, num_frames=9, num_inference_steps=2),
    ),
    "tiny-wan22": TinySpec(
        build=build_tiny_wan22,
        smoke_kwargs=dict(prompt="a photo of a cat", height=64, width=64, num_frames=9, num_inference_steps=4),
    ),
    "tiny-wan22-ti2v": TinySpec(
        build=build_tiny_wan22_ti2v,
        smoke_kwargs=dict(prompt="a photo of a cat", height=64, width=64, num_frames=9, num_inference_steps=2),
    ),
    "tiny-wan-i2v": TinySpec(
        build=build_tiny_wan_i2v,
        smoke_kwargs=dict(image=tiny_input_image(), prompt="a photo of a cat", height=64, width=64, num_frames=9,
                          num_inference_steps=2),
    ),
    "tiny-flux": TinySpec(
        build=build_tiny_flux,
        smoke_kwargs=dict(prompt="a photo of a cat", height=64, width=64, num_inference_steps=2, guidance_scale=3.5,
                          max_sequence_length=32),
    ),
    "tiny-sd3": TinySpec(
        build=build_tiny_sd3,
        smoke_kwargs=dict(prompt="a photo of a cat", height=64, width=64, num_inference_steps=2, guidance_scale=5.0,
                          max_sequence_length=32),
    ),
    "tiny-qwen-image": TinySpec(
        build=build_tiny_qwen_image,
        smoke_kwargs=dict(prompt="a photo of a cat", negative_prompt=" ", height=64, width=64, num_inference_steps=2,
                          true_cfg_scale=4.0, max_sequence_length=128),
    ),
}


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def verify(path: Path, spec: TinySpec) -> None:
    """Reload from disk (as a server would) and run a short denoise; raise if output is NaN or constant."""
    pipe = DiffusionPipeline.from_pretrained(path)
    out = pipe(**spec.smoke_kwargs, output_type="np", generator=torch.Generator().manual_seed(SEED))[0]
    out = np.asarray(out)
    if not np.isfinite(out).all():
        raise RuntimeError(f"{path}: smoke run produced non-finite values")
    if out.std() < 1e-4:
        raise RuntimeError(f"{path}: smoke run produced a constant output (std={out.std():.2e})")
    print(f"  verified: {type(pipe).__name__} output {out.shape}, mean {out.mean():.3f}, std {out.std():.3f}")


def build_one(name: str, spec: TinySpec, out_dir: Path, force: bool) -> None:
    """Save into a temp dir, verify, then move into place so a failed build never looks finished."""
    target = out_dir / name
    if target.exists() and not force:
        print(f"{name}: exists at {target}, skipping (use --force to rebuild)")
        return
    tmp = out_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{name}: building")
    start = time.perf_counter()
    spec.build().save_pretrained(tmp, safe_serialization=True)
    built_s = time.perf_counter() - start
    verify(tmp, spec)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    print(f"{name}: wrote {target} ({dir_size(target) / 1024:.1f} KiB) built in {built_s:.2f}s, "
          f"total {time.perf_counter() - start:.2f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("models"), help="output directory (default: models)")
    parser.add_argument("--only", choices=sorted(PIPELINES), action="append", help="build only this pipeline")
    parser.add_argument("--force", action="store_true", help="rebuild pipelines that already exist")
    args = parser.parse_args()

    for name in args.only or PIPELINES:
        try:
            build_one(name, PIPELINES[name], args.out, args.force)
        except Exception as exc:  # one clear line per failure, not a bare traceback
            print(f"error: building {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
