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
    PixArtSigmaPipeline,
    PixArtTransformer2DModel,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import PreTrainedModel, T5EncoderModel, T5Tokenizer, UMT5EncoderModel

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


def tiny_t5_tokenizer(model_max_length: int = 300) -> T5Tokenizer:
    """Unigram T5 tokenizer over printable ASCII plus common words, built in memory.

    Scores are log-prob-like: a whole word beats spelling it out, and a
    word-initial piece ("▁x") beats a bare "▁" followed by the character.
    """
    scores = {"▁": -12.0} | {"▁" + word: -5.0 for word in COMMON_WORDS} | {s: -7.0 for s in COMMON_SUFFIXES}
    for c in string.ascii_lowercase + string.digits + string.punctuation + string.ascii_uppercase:
        scores.setdefault("▁" + c, -9.0)
        scores.setdefault(c, -10.0)
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *scores.items()]  # ids 0, 1, 2 as in real T5
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=model_max_length)


def tiny_t5_encoder(vocab_size: int, d_model: int,
                    model_class: type[PreTrainedModel] = T5EncoderModel) -> PreTrainedModel:
    """T5 v1.1-style encoder (gated-gelu, no output rescaling) like PixArt's T5-XXL, or with
    `model_class=UMT5EncoderModel` like Wan's UMT5-XXL (per-layer relative attention bias)."""
    config = model_class.config_class(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
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


def build_tiny_wan_t2v() -> DiffusionPipeline:
    """Wan2.1-T2V-1.3B shrunk: same classes, compression factors, latent statistics and
    scheduler; one narrow transformer block and a 2-channel VAE, so that even an
    81-frame 480x832 video stays affordable on a CPU."""
    tokenizer = tiny_t5_tokenizer(model_max_length=512)
    text_encoder = tiny_t5_encoder(vocab_size=len(tokenizer), d_model=32, model_class=UMT5EncoderModel)
    torch.manual_seed(SEED)
    vae = AutoencoderKLWan(**{**WAN_VAE_CONFIG, "base_dim": 2, "num_res_blocks": 0}).eval()
    torch.manual_seed(SEED)
    transformer = WanTransformer3DModel(**{
        **WAN_T2V_TRANSFORMER_CONFIG,
        "num_attention_heads": 2,
        "attention_head_dim": 8,
        "ffn_dim": 32,
        "num_layers": 1,
        "text_dim": text_encoder.config.d_model,
    }).eval()
    scheduler = UniPCMultistepScheduler(**WAN_T2V_SCHEDULER_CONFIG)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=scheduler)


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
