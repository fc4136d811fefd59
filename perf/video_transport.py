#!/usr/bin/env python
"""Large-output transport: one video request delivered by plain gRPC, system shm and CUDA shm.

    python perf/video_transport.py --deployment configs/wan2.1-t2v-1.3b-random.toml \
        --frames 81 --height 480 --width 832 --steps 2 --reps 3 --out video_transport.json
    python perf/video_transport.py --deployment configs/wan2.1-i2v-14b-480p-random.toml \
        --image-size 480x832 --steps 2 --guidance 5 --reps 1 --transports grpc,system \
        --skip-mp4 --out i2v_stage_times.json

Starts tritonserver on the repository rendered for the deployment, warms up, then runs the
same `<task>_stream` request (`txt2vid_stream`, or `img2vid_stream` for an image-to-video
deployment, with a synthetic uint8 conditioning image of `--image-size`) `--reps` times per
transport (round-robin, so drift hits all alike) and once more with `output_format=mp4`
(unless `--skip-mp4`). Per request it records, on the client clock:

  total          submit -> media usable by the client
  after_denoise  last progress response (end of denoise) -> final response received:
                 VAE decode + uint8 conversion on the device, the vae_decode -> txt2vid hop,
                 and the output transport into the client's buffer or region
  materialise    final response -> media usable: numpy from the gRPC bytes, numpy copy of
                 the system region, or (cuda) a torch view of the region plus one reduction
                 on the GPU (no host copy); `cuda_host` adds a host copy for comparison

and, from the server's /metrics deltas over the measured requests, the mean time of every
stage (text encode, img2vid's condition with its image-encode and VAE-encode parts, denoise
and one dit step, decode, MP4 encode), plus a standalone timing of the uint8 conversion on
the same device. `cuda` needs a GPU host.
"""
from __future__ import annotations

import argparse
import json
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
from ditserve.client import GenerationRequest  # noqa: E402
from ditserve.deployment import TASK_CONDITIONING, load_deployment  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from ditserve.shm import OutputRegionPool  # noqa: E402
from matched_control import loadgen  # noqa: E402  (perf/loadgen.py: /metrics scraping)

TRANSPORTS = ("grpc", "system", "cuda", "cuda_host")


def gpu_memory_used() -> str | None:
    """nvidia-smi's memory.used per GPU (all stages loaded, after the measured requests), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"n/a ({exc})"


def model_build(deployment) -> dict | None:
    """What a random-weight build says about itself (scripts/build_full_size_random.py's
    build_info.json: depths, params, size), so a reduced-depth run is never read as full size."""
    path = Path(deployment.model_location()) / "build_info.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {k: info.get(k) for k in ("family", "reference", "full_size", "text_encoder_layers",
                                     "transformer_layers", "params", "size_bytes", "times_s")}


def synthetic_image(height: int, width: int) -> np.ndarray:
    """A deterministic uint8 [H, W, 3] RGB conditioning image: gradients and a square."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                       (x + y) * 127 // max(height + width, 1)], axis=-1).astype(np.uint8)
    pixels[height // 4:height // 2, width // 4:width // 2] = (250, 20, 60)
    return pixels


def parse_size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HxW, e.g. 480x832") from None
    if height < 1 or width < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: height and width must be >= 1")
    return height, width


def one_request(url: str, model: str, request: GenerationRequest, transport: str,
                pool: OutputRegionPool | None) -> dict:
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
    inputs = request.infer_inputs(grpcclient)
    names = ["video", "progress"] + (["video_mp4"] if request.output_format == "mp4" else [])
    outputs = [grpcclient.InferRequestedOutput(n) for n in names]
    region = None
    if pool is not None:
        region = pool.acquire(request.media_bytes())
        outputs[0].set_shared_memory(region.name, request.media_bytes())
    start = time.perf_counter()
    client.async_stream_infer(model, inputs, outputs=outputs)
    last_progress = None
    try:
        while True:
            at, result, error = responses.get(timeout=900)
            if error is not None:
                raise RuntimeError(error.message())
            if result.as_numpy("progress") is not None and result.get_output("video") is None:
                last_progress = at
                continue
            break
        shape = list(result.get_output("video").shape)
        if transport == "grpc":
            media = result.as_numpy("video")
            check = int(media[-1, -1, -1, -1])
        elif transport == "system":
            media = pool.read(region, shape)
            check = int(media[-1, -1, -1, -1])
        elif transport == "cuda":
            media = pool.as_torch(region, shape)
            check = int(media.view(-1)[-1].item())  # one device read: the bytes are usable on the GPU
        else:  # cuda_host
            media = pool.read(region, shape)
            check = int(media[-1, -1, -1, -1])
        done = time.perf_counter()
        mp4 = result.as_numpy("video_mp4")
    finally:
        client.stop_stream()
        client.close()
        if region is not None:
            pool.release(region)
    return {"transport": transport, "total_s": done - start, "after_denoise_s": at - (last_progress or start),
            "materialise_s": done - at, "shape": shape, "bytes": int(np.prod(shape)), "check": check,
            "mp4_bytes": None if mp4 is None else len(mp4.reshape(-1)[0])}


def uint8_conversion_seconds(shape: list[int], device: str) -> float | None:
    """The decode stage's float -> uint8 conversion alone, on a tensor of the video's size."""
    try:
        import torch
    except ImportError:
        return None
    frames, height, width, _ = shape
    x = torch.rand(frames, 3, height, width, device=device) * 2 - 1
    times = []
    for _ in range(5):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        y = ((x / 2 + 0.5).clamp(0, 1).movedim(-3, -1).float() * 255).round().to(torch.uint8)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        del y
    return statistics.median(times[1:])


def summarise(runs: list[dict]) -> dict:
    out = {}
    for transport in sorted({r["transport"] for r in runs}):
        rows = [r for r in runs if r["transport"] == transport]
        out[transport] = {key: {"median": statistics.median(r[key] for r in rows), "min": min(r[key] for r in rows),
                                "max": max(r[key] for r in rows)}
                          for key in ("total_s", "after_denoise_s", "materialise_s")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--guidance", type=float, default=1.0, help="1.0 = no CFG: transport is what is measured")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--transports", default="grpc,system,cuda,cuda_host")
    ap.add_argument("--image-size", type=parse_size, metavar="HxW",
                    help="img2vid deployments: size of the synthetic uint8 conditioning image (default: the "
                         "video's --height x --width)")
    ap.add_argument("--skip-mp4", action="store_true", help="skip the closing output_format=mp4 request")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, help="server log (default: beside --out)")
    args = ap.parse_args()
    transports = args.transports.split(",")
    unknown = set(transports) - set(TRANSPORTS)
    if unknown:
        ap.error(f"unknown transports {sorted(unknown)}; choose from {TRANSPORTS}")

    deployment = load_deployment(args.deployment)
    task = deployment.task
    if task not in ("txt2vid", "img2vid"):
        ap.error(f"{args.deployment} serves {task}; video_transport measures txt2vid or img2vid deployments")
    conditioned = task in TASK_CONDITIONING
    if args.image_size and not conditioned:
        ap.error(f"--image-size is for img2vid deployments; {args.deployment} serves {task}")
    model = f"{task}_stream"
    image = synthetic_image(*(args.image_size or (args.height, args.width))) if conditioned else None
    request = GenerationRequest("ocean waves at sunset, aerial shot", seed=1, height=args.height, width=args.width,
                                num_inference_steps=args.steps, guidance_scale=args.guidance, num_frames=args.frames,
                                image=image)
    repo = Path(tempfile.mkdtemp(prefix="video-transport-")) / "repo"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", args.deployment,
                    "--out", str(repo)], check=True)
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerOptions(repo, http, grpc, metrics, deployment=args.deployment),
                          log_path=args.log or args.out.with_suffix(".server.log"))
    started = time.perf_counter()
    server.start()
    runs: list[dict] = []
    try:
        server.wait_ready(timeout_s=900, progress=True)
        ready_s = round(time.perf_counter() - started, 1)
        print(f"[video_transport] server ready in {ready_s}s", flush=True)
        control = grpcclient.InferenceServerClient(server.grpc_url)
        pools = {t: OutputRegionPool(control, "cuda" if t.startswith("cuda") else "system")
                 for t in transports if t != "grpc"}
        print("[video_transport] warm-up", flush=True)
        warm = one_request(server.grpc_url, model, request, transports[0], pools.get(transports[0]))
        before = loadgen.scrape(server.metrics_url)
        for rep in range(args.reps):
            for transport in transports:
                run = one_request(server.grpc_url, model, request, transport, pools.get(transport))
                print(f"[video_transport] rep {rep} {transport}: total {run['total_s']:.3f}s after-denoise "
                      f"{run['after_denoise_s']:.3f}s materialise {run['materialise_s'] * 1e3:.1f}ms", flush=True)
                runs.append(run)
        after = loadgen.scrape(server.metrics_url)
        gpu_memory = gpu_memory_used()
        mp4_request = GenerationRequest(**{**request.__dict__, "output_format": "mp4"})
        mp4_before = loadgen.scrape(server.metrics_url)
        if args.skip_mp4:
            mp4_run = {"skipped": "--skip-mp4"}
        else:
            try:
                mp4_run = one_request(server.grpc_url, model, mp4_request, "grpc", None)
            except RuntimeError as exc:  # e.g. no PyAV on the server: the raw transports still count
                mp4_run = {"error": str(exc)}
        mp4_after = loadgen.scrape(server.metrics_url)
        for pool in pools.values():
            pool.close()
    finally:
        server.stop()

    def mean_delta(b, a, name, label=model):
        return loadgen.histogram_mean(b, a, name, label)

    stage_means = {"encode": mean_delta(before, after, "ditserve_encode_duration_seconds")}
    if conditioned:
        stage_means |= {
            "condition (BLS to vae_encode: image encode + VAE encode + hop back)":
                mean_delta(before, after, "ditserve_condition_duration_seconds"),
            "image encode (vae_encode: CLIP image embeddings)":
                mean_delta(before, after, "ditserve_image_encode_duration_seconds", "vae_encode"),
            "vae encode (vae_encode: first-frame condition)":
                mean_delta(before, after, "ditserve_vae_encode_duration_seconds", "vae_encode"),
        }
    stage_means |= {
        "denoise": mean_delta(before, after, "ditserve_denoise_duration_seconds"),
        "dit step (one step of all groups)": mean_delta(before, after, "ditserve_step_duration_seconds", "dit"),
        "decode (BLS to vae_decode: VAE + uint8 + hop back)": mean_delta(before, after,
                                                                       "ditserve_decode_duration_seconds"),
        "mp4 encode": mean_delta(mp4_before, mp4_after, "ditserve_mp4_duration_seconds"),
    }
    device = "cuda:0" if any(t.startswith("cuda") for t in transports) else "cpu"
    described = {k: v for k, v in request.__dict__.items() if v is not None and k != "image"}
    if image is not None:
        described["image"] = {"shape": list(image.shape), "dtype": str(image.dtype), "kind": "synthetic"}
    report = {
        "command": " ".join(sys.argv), "machine": platform.node(), "python": platform.python_version(),
        "deployment": args.deployment, "task": task, "model": model, "model_build": model_build(deployment),
        "server_ready_s": ready_s, "request": described,
        "warmup": warm, "runs": runs, "summary": summarise(runs), "gpu_memory_used": gpu_memory,
        "server_stage_means_s": stage_means,
        "mp4_run": mp4_run,
        "uint8_conversion_standalone_s": uint8_conversion_seconds(runs[0]["shape"], device) if runs else None,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=2))
    print(json.dumps(report["server_stage_means_s"], indent=2))
    # Printed too: a device run may lose the JSON file (it returns a limited number of files).
    print(json.dumps({k: report[k] for k in ("uint8_conversion_standalone_s", "mp4_run", "gpu_memory_used")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
