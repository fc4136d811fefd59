"""Baseline for perf runs: the plain diffusers PixArtSigmaPipeline, serial, no server.

    python perf/raw_diffusers_baseline.py [--runs 20] [--warmup 2] [--prompt ...] [--model DIR]

Same request as the perf input data (64x64, 10 steps, guidance 4.5, fixed seed), one
generation at a time, end to end (prompt encoding, denoise loop, VAE decode, numpy
uint8 image as the server returns). Prints one JSON object on stdout; latencies in ms.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROMPT = "a red fox sitting in the snow, watercolor"


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]), as numpy's default."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def latency_stats(lat: list[float]) -> dict:
    """The latency summary every baseline report carries (ms)."""
    return {
        "mean_ms": statistics.fmean(lat),
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "min_ms": min(lat),
        "max_ms": max(lat),
        "stdev_ms": statistics.stdev(lat) if len(lat) > 1 else 0.0,
        "latencies_ms": [round(x, 3) for x in lat],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO_ROOT / "models" / "tiny-pixart-sigma"))
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--negative-prompt", default="")
    ap.add_argument("--height", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--guidance-scale", type=float, default=4.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="auto", help="auto = cuda:0 when present, else cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = ap.parse_args()

    import torch
    import diffusers
    from diffusers import PixArtSigmaPipeline

    device = args.device
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    pipe = PixArtSigmaPipeline.from_pretrained(args.model, torch_dtype=dtype).to(device)
    pipe.set_progress_bar_config(disable=True)

    def once() -> float:
        gen = torch.Generator(device=device).manual_seed(args.seed)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = pipe(
            prompt=args.prompt, negative_prompt=args.negative_prompt,
            height=args.height, width=args.width, num_inference_steps=args.steps,
            guidance_scale=args.guidance_scale, generator=gen, output_type="np",
            use_resolution_binning=False, clean_caption=False,
        )
        # The server answers uint8 HWC; include that conversion in the measured time.
        image = (out.images[0] * 255).round().clip(0, 255).astype("uint8")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        assert image.shape == (args.height, args.width, 3), image.shape
        return (time.perf_counter() - t0) * 1000.0

    with torch.inference_mode():
        for _ in range(args.warmup):
            once()
        lat = [once() for _ in range(args.runs)]

    print(json.dumps({
        "pipeline": "diffusers.PixArtSigmaPipeline",
        "model": args.model,
        "device": device,
        "dtype": args.dtype,
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                     "python": sys.version.split()[0]},
        "request": {"prompt": args.prompt, "negative_prompt": args.negative_prompt,
                    "height": args.height, "width": args.width, "num_inference_steps": args.steps,
                    "guidance_scale": args.guidance_scale, "seed": args.seed,
                    "use_resolution_binning": False, "clean_caption": False, "output": "uint8 HWC"},
        "runs": args.runs,
        "warmup": args.warmup,
        **latency_stats(lat),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
