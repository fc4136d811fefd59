#!/usr/bin/env python
"""Build a FULL-SIZE PixArt-Sigma 1024px pipeline with RANDOM weights, for GPU perf runs.

Same classes and configs as `PixArt-alpha/PixArt-Sigma-XL-2-1024-MS` (transformer 0.6B,
T5-v1.1-XXL encoder 4.8B, SDXL VAE, DPM-Solver++), so speed and memory match the real
checkpoint; the images are noise. Written in diffusers layout (safetensors) into
`models/pixart-sigma-1024-random/` by default, ~11 GB in bf16. No network: the tokenizer
is the tiny offline one from build_tiny_pipelines.py (its ids are all < 32128, and the
pipeline pads every prompt to max_sequence_length tokens anyway, so encoder cost is the
real one).

Fast on a GPU: modules are created directly on the device in the target dtype (no fp32
copy on the host), random-initialised there, checked for finite outputs, then saved.

    python scripts/build_full_size_random.py                       # GPU, bf16, full size
    python scripts/build_full_size_random.py --device cpu --text-encoder-layers 1 \\
        --transformer-layers 1 --out /tmp/fs-smoke --verify        # CPU smoke of the layout

Reduced layer counts are for smoke tests only; the folder records them in its
`build_info.json`.
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
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from build_tiny_pipelines import (  # noqa: E402  (offline T5 tokenizer, real configs)
    PIXART_SIGMA_SCHEDULER_CONFIG as SCHEDULER_CONFIG,
    PIXART_SIGMA_TRANSFORMER_CONFIG as TRANSFORMER_CONFIG,
    tiny_t5_tokenizer,
)
from diffusers import (  # noqa: E402
    AutoencoderKL,
    DPMSolverMultistepScheduler,
    PixArtSigmaPipeline,
    PixArtTransformer2DModel,
)
from transformers import T5Config, T5EncoderModel  # noqa: E402

SEED = 0
DEFAULT_OUT = REPO_ROOT / "models" / "pixart-sigma-1024-random"
MAX_SEQUENCE_LENGTH = 300  # PixArt-Sigma's T5 length (configs/*.toml max_sequence_length)

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

# vae/config.json (SDXL VAE as shipped with PixArt-Sigma: sample_size 512, force_upcast false)
VAE_CONFIG = dict(
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


@torch.inference_mode()
def sanity_forward(tokenizer, text_encoder, transformer, vae, device: torch.device, latent_side: int) -> dict:
    """One T5 encode, one transformer forward and one VAE decode on random inputs: all finite."""
    ids = tokenizer(["a photo of a red cat on a blue sofa", ""], padding="max_length",
                    max_length=MAX_SEQUENCE_LENGTH, truncation=True, return_tensors="pt")
    mask = ids.attention_mask.to(device)
    embeds = text_encoder(ids.input_ids.to(device), attention_mask=mask)[0]
    out = {"text_encoder": check_finite("text_encoder", embeds)}
    gen = torch.Generator("cpu").manual_seed(SEED)
    latents = torch.randn((2, 4, latent_side, latent_side), generator=gen).to(device, transformer.dtype)
    noise = transformer(latents, encoder_hidden_states=embeds, encoder_attention_mask=mask,
                        timestep=torch.tensor([999, 500], device=device),
                        added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)[0]
    out["transformer"] = check_finite("transformer", noise)
    image = vae.decode(latents[:1] / vae.config.scaling_factor, return_dict=False)[0]
    out["vae_decode"] = check_finite("vae_decode", image)
    return out


def build(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    timer = Timer(device)
    info: dict = {"dtype": args.dtype, "device": str(device), "seed": SEED,
                  "text_encoder_layers": args.text_encoder_layers, "transformer_layers": args.transformer_layers,
                  "full_size": args.text_encoder_layers == 24 and args.transformer_layers == 28,
                  "reference": "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS (configs; weights random)",
                  "versions": {"torch": torch.__version__, "diffusers": __import__("diffusers").__version__,
                               "transformers": __import__("transformers").__version__}}
    torch.manual_seed(SEED)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(SEED)

    with timer("tokenizer"):
        tokenizer = tiny_t5_tokenizer()
    with timer("text_encoder init"), build_context(device, dtype):
        t5_config = T5Config(**{**T5_CONFIG, "num_layers": args.text_encoder_layers})
        text_encoder = cast_if_needed(T5EncoderModel(t5_config), dtype).eval()
    with timer("transformer init"), build_context(device, dtype):
        transformer = PixArtTransformer2DModel(**{**TRANSFORMER_CONFIG, "num_layers": args.transformer_layers})
        transformer = cast_if_needed(transformer, dtype).eval()
    with timer("vae init"), build_context(device, dtype):
        vae = cast_if_needed(AutoencoderKL(**VAE_CONFIG), dtype).eval()
    scheduler = DPMSolverMultistepScheduler(**SCHEDULER_CONFIG)
    info["params"] = {"text_encoder": n_params(text_encoder), "transformer": n_params(transformer),
                      "vae": n_params(vae), "tokenizer_vocab": len(tokenizer)}
    log(f"params: {info['params']}")
    if device.type == "cuda":
        info["cuda_memory_allocated_gib"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)

    if not args.skip_check:
        # 1024px latents on a GPU; a small latent on CPU keeps the smoke cheap.
        side = args.check_latent_side or (128 if device.type == "cuda" else 32)
        with timer("sanity forward"):
            info["check"] = sanity_forward(tokenizer, text_encoder, transformer, vae, device, side)

    pipe = PixArtSigmaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                               transformer=transformer, scheduler=scheduler)
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
    del pipe, text_encoder, transformer, vae
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return info


@torch.inference_mode()
def verify_load(path: Path, device: str, dtype: str, size: int) -> dict:
    """Reload with PixArtSigmaPipeline.from_pretrained (as a server would) and run one step."""
    start = time.perf_counter()
    pipe = PixArtSigmaPipeline.from_pretrained(path, torch_dtype=getattr(torch, dtype)).to(device)
    load_s = time.perf_counter() - start
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    image = pipe("a photo of a cat", height=size, width=size, num_inference_steps=1, guidance_scale=4.5,
                 use_resolution_binning=False, clean_caption=False, output_type="np",
                 generator=torch.Generator("cpu").manual_seed(SEED)).images
    run_s = time.perf_counter() - start
    import numpy as np

    image = np.asarray(image)
    if not np.isfinite(image).all():
        raise RuntimeError(f"{path}: reloaded pipeline produced non-finite values")
    result = {"class": type(pipe).__name__, "image_shape": list(image.shape), "mean": round(float(image.mean()), 4),
              "std": round(float(image.std()), 4), "load_s": round(load_s, 2), "one_step_s": round(run_s, 2),
              "components": {k: type(v).__name__ for k, v in pipe.components.items()}}
    log(f"verified reload: {result}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    ap.add_argument("--text-encoder-layers", type=int, default=24, help="T5 encoder blocks (24 = real; fewer for smoke)")
    ap.add_argument("--transformer-layers", type=int, default=28, help="PixArt blocks (28 = real; fewer for smoke)")
    ap.add_argument("--skip-check", action="store_true", help="skip the finite-output forward before saving")
    ap.add_argument("--check-latent-side", type=int, default=0, help="latent side of the check (default 128 cuda, 32 cpu)")
    ap.add_argument("--verify", action="store_true", help="reload with from_pretrained and run 1 step afterwards")
    ap.add_argument("--verify-size", type=int, default=256, help="image side of the --verify step (default 256)")
    ap.add_argument("--if-missing", action="store_true",
                    help="do nothing when --out already holds a finished build of the same shape and dtype")
    args = ap.parse_args()

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU (use --device cpu for a reduced smoke)", file=sys.stderr)
        return 1
    out = Path(args.out)
    if args.if_missing and (out / "build_info.json").exists():
        prev = json.loads((out / "build_info.json").read_text())
        if (prev.get("dtype"), prev.get("text_encoder_layers"), prev.get("transformer_layers")) == (
                args.dtype, args.text_encoder_layers, args.transformer_layers):
            log(f"{out} already built ({prev.get('size_bytes', 0) / 2**30:.2f} GiB); skipping (--if-missing)")
            return 0
    start = time.perf_counter()
    try:
        info = build(args)
        if args.verify:
            info["verify"] = verify_load(out, args.device, args.dtype, args.verify_size)
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
