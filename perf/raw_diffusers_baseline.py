"""Baseline for perf runs: the deployment's plain diffusers pipeline, no server.

    python perf/raw_diffusers_baseline.py [--deployment configs/tiny-pixart-sigma.toml] [--runs 20]
        [--warmup 2] [--batch-sizes 1,2,4] [--prompt ...] [--height H --width W --steps N --frames F]

The served numbers only mean something next to what diffusers does alone on the same
machine, so this runs the same request as the perf input data, end to end (prompt
encoding, denoise loop, VAE decode, numpy uint8 media as the server returns):

  serial   one generation at a time, `--warmup` then `--runs`; latencies in ms. The
           served latency at concurrency 1 is compared with this.
  batched  for each B of `--batch-sizes` (default: powers of two up to the deployment's
           capacity, i.e. what the server may batch): B prompts in one pipeline call, one
           warm-up then `--batch-runs` timed calls. The best generations/s is the ceiling
           request batching could reach without a server.

The pipeline class follows the deployment's family (PIPELINES), as do the model folder,
dtype, device and the request defaults; every request option overrides them. Prints one
JSON object on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "backends"))
DEFAULT_PROMPT = "a red fox sitting in the snow, watercolor"


@dataclass(frozen=True)
class Family:
    """How to call one family's diffusers pipeline the way the server runs it."""

    pipeline: str                   # class name in `diffusers`
    output: str                     # attribute of the pipeline output holding the media batch
    call_kwargs: dict = field(default_factory=dict)
    video: bool = False
    image: bool = False             # conditioned on an input image (--image-data)
    guidance: str = "guidance_scale"  # the call argument our guidance_scale is (Qwen-Image: true_cfg_scale)
    negative_prompt: bool = True    # FLUX.1 has no CFG rows: the server takes no negative prompt
    sequence_length: bool = False   # pass the deployment's max_sequence_length (MMDiTs: tiny configs differ)


PIPELINES = {
    # The server never bins resolutions nor cleans captions (that needs bs4/ftfy).
    "pixart-sigma": Family("PixArtSigmaPipeline", "images", {"use_resolution_binning": False, "clean_caption": False}),
    "wan-t2v": Family("WanPipeline", "frames", video=True),
    "wan-i2v": Family("WanImageToVideoPipeline", "frames", video=True, image=True),
    "wan22-t2v": Family("WanPipeline", "frames", video=True),
    "qwen-image": Family("QwenImagePipeline", "images", guidance="true_cfg_scale"),
    "flux": Family("FluxPipeline", "images", negative_prompt=False, sequence_length=True),
    "sd3": Family("StableDiffusion3Pipeline", "images", sequence_length=True),
}


def input_data_image(path: str):
    """The first entry's `image` of a perf_analyzer input-data JSON ({content, shape}), as PIL:
    the same pixels the served sweep sends."""
    import numpy as np
    from PIL import Image

    image = json.loads(Path(path).read_text())["data"][0]["image"]
    return Image.fromarray(np.array(image["content"], dtype=np.uint8).reshape(image["shape"]))


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


def default_batch_sizes(capacity: int) -> list[int]:
    """Powers of two up to the capacity, plus the capacity itself."""
    sizes = [1]
    while sizes[-1] * 2 <= capacity:
        sizes.append(sizes[-1] * 2)
    return sizes if sizes[-1] == capacity else sizes + [capacity]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", default="configs/tiny-pixart-sigma.toml",
                    help="picks the family (pipeline class), model, dtype, device and request defaults")
    ap.add_argument("--model", default=None, help="diffusers folder (default: the deployment's)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--negative-prompt", default=None)
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--guidance-scale", type=float, default=None)
    ap.add_argument("--frames", type=int, default=None, help="video families only")
    ap.add_argument("--image-data", default=None,
                    help="image-conditioned families: perf_analyzer input-data JSON whose first entry's `image` is used")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-sizes", default=None,
                    help="comma list; default powers of two up to the deployment's capacity; '' skips")
    ap.add_argument("--batch-runs", type=int, default=3, help="timed calls per batch size (after 1 warm-up)")
    ap.add_argument("--device", default=None, help="default: the deployment's (auto = cuda:0 when present, else cpu)")
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--save-media", default=None,
                    help="write the first timed serial generation's uint8 media here (.npy): the oracle for PSNR")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    import torch
    import diffusers
    from ditserve.deployment import load_deployment

    dep = load_deployment(args.deployment)
    family = PIPELINES[dep.model.family]
    d = dep.defaults
    request = {
        "prompt": args.prompt,
        "negative_prompt": d.negative_prompt if args.negative_prompt is None else args.negative_prompt,
        "height": args.height or d.height,
        "width": args.width or d.width,
        "num_inference_steps": args.steps or d.num_inference_steps,
        family.guidance: d.guidance_scale if args.guidance_scale is None else args.guidance_scale,
    }
    if not family.negative_prompt:
        del request["negative_prompt"]
    if family.sequence_length:
        request["max_sequence_length"] = dep.model.max_sequence_length
    if family.video:
        request["num_frames"] = args.frames or d.num_frames
    if family.image:
        if not args.image_data:
            raise SystemExit(f"{dep.model.family} is conditioned on an image: pass --image-data FILE")
        request["image"] = input_data_image(args.image_data)
    media_shape = ((request["num_frames"],) if family.video else ()) + (request["height"], request["width"], 3)

    device = args.device or dep.model.device
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dtype_name = args.dtype or dep.model.dtype
    model = args.model or dep.model_location()
    pipe = getattr(diffusers, family.pipeline).from_pretrained(model, torch_dtype=getattr(torch, dtype_name)).to(device)
    pipe.set_progress_bar_config(disable=True)
    cuda = device.startswith("cuda")

    saved = []

    def generate(batch: int) -> float:
        """One pipeline call for `batch` prompts; ms, including the uint8 conversion the server does."""
        gens = [torch.Generator("cpu").manual_seed(args.seed + i) for i in range(batch)]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        prompts = {key: [request[key]] * batch for key in ("prompt", "negative_prompt") if key in request}
        out = pipe(**{**request, **prompts},
                   generator=gens, output_type="np", **family.call_kwargs)
        media = (getattr(out, family.output) * 255).round().clip(0, 255).astype("uint8")
        if cuda:
            torch.cuda.synchronize()
        assert media.shape == (batch, *media_shape), media.shape
        saved[:] = [media[0]]
        return (time.perf_counter() - t0) * 1000.0

    sizes = (default_batch_sizes(dep.engine.capacity) if args.batch_sizes is None
             else [int(b) for b in args.batch_sizes.split(",") if b.strip()])
    batched = []
    with torch.inference_mode():
        for _ in range(args.warmup):
            generate(1)
        lat = [generate(1) for _ in range(args.runs)]
        if args.save_media:
            import numpy as np
            np.save(args.save_media, saved[0])
        for b in sizes:
            generate(b)
            mean = statistics.fmean(generate(b) for _ in range(args.batch_runs))
            batched.append({"batch_size": b, "runs": args.batch_runs, "mean_ms": round(mean, 3),
                            "ms_per_generation": round(mean / b, 3), "generations_per_s": round(1000.0 * b / mean, 4)})

    print(json.dumps({
        "pipeline": f"diffusers.{family.pipeline}",
        "deployment": args.deployment,
        "model": model,
        "device": device,
        "dtype": dtype_name,
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                     "python": sys.version.split()[0]},
        "request": {**{k: v for k, v in request.items() if k != "image"}, "seed": args.seed, **family.call_kwargs,
                    "output": f"uint8 {list(media_shape)}",
                    **({"image": f"first entry of {args.image_data}"} if family.image else {})},
        "runs": args.runs,
        "warmup": args.warmup,
        **latency_stats(lat),
        "batched": batched,
        "best_batch": max(batched, key=lambda r: r["generations_per_s"], default=None),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
