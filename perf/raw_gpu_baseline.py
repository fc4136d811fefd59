"""GPU baseline for perf runs: the plain diffusers PixArtSigmaPipeline, no server.

    python perf/raw_gpu_baseline.py [--model DIR] [--runs 5] [--warmup 1] \
        [--batch-sizes 1,2,4,8] [--batch-runs 2] [--out FILE]

The GPU counterpart of perf/raw_diffusers_baseline.py (same options, same top-level JSON
keys for the serial measurement, so tools reading one read the other), for the full-size
1024px deployment (configs/pixart-sigma-1024-random.toml): 1024x1024, 20 steps,
guidance 4.5, bf16, use_resolution_binning=False, clean_caption=False, uint8 HWC output
as the server returns, seeds as the server draws them (torch.Generator("cpu")).

Measures:
  serial    one prompt at a time, end to end (encode, denoise loop, VAE decode, uint8),
            `--warmup` then `--runs` generations; latencies in ms.
  batched   for each batch size B: a list of B different prompts in one pipeline call
            (num_images_per_prompt 1; CFG makes the transformer batch 2B); one warm-up
            call, then `--batch-runs` timed calls; ms per call, images/s.
  components for each B: encode_prompt (B prompts + negatives), one transformer forward at
            batch 2B (CFG), VAE decode of B latents; ms, CUDA-synchronised means.
Writes one JSON object to --out (and stdout).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", message=".*torch_dtype.*deprecated.*")
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "perf"))
from raw_diffusers_baseline import DEFAULT_PROMPT, latency_stats  # noqa: E402

PROMPTS_FILE = REPO_ROOT / "perf" / "data" / "txt2img_prompts.json"


def prompt_pool(first: str, n: int) -> list[str]:
    """`n` distinct prompts: the perf input data's, then numbered variants."""
    pool = [first]
    try:
        for entry in json.loads(PROMPTS_FILE.read_text())["data"]:
            p = entry["prompt"][0]
            if p not in pool:
                pool.append(p)
    except (OSError, KeyError, ValueError):
        pass
    while len(pool) < n:
        pool.append(f"{first}, variation {len(pool)}")
    return pool[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO_ROOT / "models" / "pixart-sigma-1024-random"))
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--negative-prompt", default="")
    ap.add_argument("--height", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guidance-scale", type=float, default=4.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5, help="serial timed generations")
    ap.add_argument("--warmup", type=int, default=1, help="serial warm-up generations")
    ap.add_argument("--batch-sizes", default="1,2,4,8", help="comma list; empty skips the batched part")
    ap.add_argument("--batch-runs", type=int, default=2, help="timed calls per batch size (after 1 warm-up)")
    ap.add_argument("--component-iters", type=int, default=5, help="timed iterations per component and B (0 skips)")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu | auto")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()

    import numpy as np
    import torch
    import diffusers
    import transformers
    from diffusers import PixArtSigmaPipeline

    device = args.device
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    cuda = device.startswith("cuda")
    dtype = getattr(torch, args.dtype)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def log(msg: str) -> None:
        print(f"[raw_gpu_baseline] {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    pipe = PixArtSigmaPipeline.from_pretrained(args.model, torch_dtype=dtype).to(device)
    sync()
    load_s = time.perf_counter() - t0
    pipe.set_progress_bar_config(disable=True)
    log(f"loaded {args.model} on {device} in {load_s:.1f}s")
    build_info = {}
    if (Path(args.model) / "build_info.json").exists():
        build_info = json.loads((Path(args.model) / "build_info.json").read_text())

    call = dict(height=args.height, width=args.width, num_inference_steps=args.steps,
                guidance_scale=args.guidance_scale, output_type="np",
                use_resolution_binning=False, clean_caption=False)

    def generate(prompts: list[str]) -> float:
        gens = [torch.Generator("cpu").manual_seed(args.seed + i) for i in range(len(prompts))]
        sync()
        start = time.perf_counter()
        out = pipe(prompt=prompts, negative_prompt=[args.negative_prompt] * len(prompts),
                   generator=gens if len(gens) > 1 else gens[0], num_images_per_prompt=1, **call)
        # The server answers uint8 HWC; include that conversion in the measured time.
        images = (out.images * 255).round().clip(0, 255).astype("uint8")
        sync()
        assert images.shape == (len(prompts), args.height, args.width, 3), images.shape
        return (time.perf_counter() - start) * 1000.0

    result: dict = {}
    with torch.inference_mode():
        # --- serial ------------------------------------------------------------------------
        for i in range(args.warmup):
            log(f"serial warm-up {i + 1}/{args.warmup}: {generate([args.prompt]):.0f} ms")
        lat = []
        for i in range(args.runs):
            lat.append(generate([args.prompt]))
            log(f"serial run {i + 1}/{args.runs}: {lat[-1]:.0f} ms")

        # --- batched -----------------------------------------------------------------------
        sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        batched = []
        for b in sizes:
            prompts = prompt_pool(args.prompt, b)
            warm = generate(prompts)
            times = [generate(prompts) for _ in range(args.batch_runs)]
            mean = statistics.fmean(times)
            row = {"batch_size": b, "warmup_ms": round(warm, 3), "runs": args.batch_runs,
                   "mean_ms": round(mean, 3), "min_ms": round(min(times), 3),
                   "ms_per_image": round(mean / b, 3), "images_per_s": round(1000.0 * b / mean, 4),
                   "latencies_ms": [round(x, 3) for x in times]}
            batched.append(row)
            log(f"batch {b}: {mean:.0f} ms/call, {row['ms_per_image']:.0f} ms/image, {row['images_per_s']:.3f} img/s")

        # --- components --------------------------------------------------------------------
        components = []
        if args.component_iters > 0:
            tr = pipe.transformer
            scale = pipe.vae_scale_factor
            for b in sizes:
                prompts = prompt_pool(args.prompt, b)

                def timed(fn, iters=args.component_iters):
                    fn()
                    sync()
                    start = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    sync()
                    return (time.perf_counter() - start) * 1000.0 / iters

                def encode():
                    return pipe.encode_prompt(prompts, do_classifier_free_guidance=True,
                                              negative_prompt=args.negative_prompt, device=device,
                                              clean_caption=False, max_sequence_length=300)

                enc_ms = timed(encode)
                pe, pm, ne, nm = encode()
                embeds, mask = torch.cat([ne, pe]), torch.cat([nm, pm])
                lat_in = torch.randn((2 * b, tr.config.in_channels, args.height // scale, args.width // scale),
                                     device=device, dtype=dtype)
                ts = torch.full((2 * b,), 500, device=device)
                fwd_ms = timed(lambda: tr(lat_in, encoder_hidden_states=embeds, encoder_attention_mask=mask,
                                          timestep=ts, added_cond_kwargs={"resolution": None, "aspect_ratio": None},
                                          return_dict=False))
                vae_in = lat_in[:b] / pipe.vae.config.scaling_factor
                vae_ms = timed(lambda: pipe.vae.decode(vae_in, return_dict=False), iters=max(1, args.component_iters // 2))
                row = {"batch_size": b, "encode_prompt_ms": round(enc_ms, 3),
                       "transformer_forward_ms": round(fwd_ms, 3), "transformer_batch": 2 * b,
                       "vae_decode_ms": round(vae_ms, 3),
                       "denoise_loop_estimate_ms": round(fwd_ms * args.steps, 3)}
                components.append(row)
                log(f"components B{b}: encode {enc_ms:.1f} ms, forward(2B) {fwd_ms:.1f} ms, vae {vae_ms:.1f} ms")
                del lat_in, vae_in, embeds, mask, pe, pm, ne, nm

    result = {
        "pipeline": "diffusers.PixArtSigmaPipeline",
        "model": args.model,
        "model_build": {k: build_info.get(k) for k in ("full_size", "text_encoder_layers", "transformer_layers",
                                                        "dtype", "params", "reference")} if build_info else None,
        "device": device,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "dtype": args.dtype,
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "python": sys.version.split()[0]},
        "request": {"prompt": args.prompt, "negative_prompt": args.negative_prompt,
                    "height": args.height, "width": args.width, "num_inference_steps": args.steps,
                    "guidance_scale": args.guidance_scale, "seed": args.seed,
                    "use_resolution_binning": False, "clean_caption": False, "output": "uint8 HWC",
                    "generator": "torch.Generator('cpu').manual_seed(seed + i)"},
        "load_s": round(load_s, 2),
        "runs": args.runs,
        "warmup": args.warmup,
        **latency_stats(lat),
        "batched": batched,
        "components": components,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
