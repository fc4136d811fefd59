#!/usr/bin/env python
"""Large-output transport: one video request delivered by plain gRPC, system shm and CUDA shm.

    python perf/video_transport.py --deployment configs/wan2.1-t2v-1.3b-random.toml \
        --frames 81 --height 480 --width 832 --steps 2 --reps 3 --out video_transport.json

Starts tritonserver on the repository rendered for the deployment, warms up, then runs the
same `txt2vid_stream` request `--reps` times per transport (round-robin, so drift hits all
alike) and once more with `output_format=mp4`. Per request it records, on the client clock:

  total          submit -> media usable by the client
  after_denoise  last progress response (end of denoise) -> final response received:
                 VAE decode + uint8 conversion on the device, the vae_decode -> txt2vid hop,
                 and the output transport into the client's buffer or region
  materialise    final response -> media usable: numpy from the gRPC bytes, numpy copy of
                 the system region, or (cuda) a torch view of the region plus one reduction
                 on the GPU (no host copy); `cuda_host` adds a host copy for comparison

and, from the server's /metrics deltas, the mean decode and MP4-encode stage times, plus a
standalone timing of the uint8 conversion on the same device. `cuda` needs a GPU host.
"""
from __future__ import annotations

import argparse
import json
import platform
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
from ditserve.client import GenerationRequest  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from ditserve.shm import OutputRegionPool  # noqa: E402

TRANSPORTS = ("grpc", "system", "cuda", "cuda_host")


def metric_sums(url: str) -> dict[str, float]:
    """{'<histogram>_sum|model': seconds} for the per-stage histograms of txt2vid_stream."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(ditserve_\w+_duration_seconds_(?:sum|count))\{[^}]*model="([^"]+)"[^}]*\}\s+(\S+)$', line)
        if m:
            out[f"{m.group(1)}|{m.group(2)}"] = float(m.group(3))
    return out


def one_request(url: str, request: GenerationRequest, transport: str, pool: OutputRegionPool | None) -> dict:
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
    inputs = []
    for name, value, dtype in request.tensors():
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    names = ["video", "progress"] + (["video_mp4"] if request.output_format == "mp4" else [])
    outputs = [grpcclient.InferRequestedOutput(n) for n in names]
    region = None
    if pool is not None:
        region = pool.acquire(request.media_bytes())
        outputs[0].set_shared_memory(region.name, request.media_bytes())
    start = time.perf_counter()
    client.async_stream_infer("txt2vid_stream", inputs, outputs=outputs)
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
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, help="server log (default: beside --out)")
    args = ap.parse_args()
    transports = args.transports.split(",")
    unknown = set(transports) - set(TRANSPORTS)
    if unknown:
        ap.error(f"unknown transports {sorted(unknown)}; choose from {TRANSPORTS}")

    request = GenerationRequest("ocean waves at sunset, aerial shot", seed=1, height=args.height, width=args.width,
                                num_inference_steps=args.steps, guidance_scale=args.guidance, num_frames=args.frames)
    repo = Path(tempfile.mkdtemp(prefix="video-transport-")) / "repo"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", args.deployment,
                    "--out", str(repo)], check=True)
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerOptions(repo, http, grpc, metrics, deployment=args.deployment),
                          log_path=args.log or args.out.with_suffix(".server.log"))
    server.start()
    runs: list[dict] = []
    try:
        server.wait_ready(timeout_s=900, progress=True)
        control = grpcclient.InferenceServerClient(server.grpc_url)
        pools = {t: OutputRegionPool(control, "cuda" if t.startswith("cuda") else "system")
                 for t in transports if t != "grpc"}
        print("[video_transport] warm-up", flush=True)
        warm = one_request(server.grpc_url, request, transports[0], pools.get(transports[0]))
        before = metric_sums(server.metrics_url)
        for rep in range(args.reps):
            for transport in transports:
                run = one_request(server.grpc_url, request, transport, pools.get(transport))
                print(f"[video_transport] rep {rep} {transport}: total {run['total_s']:.3f}s after-denoise "
                      f"{run['after_denoise_s']:.3f}s materialise {run['materialise_s'] * 1e3:.1f}ms", flush=True)
                runs.append(run)
        after = metric_sums(server.metrics_url)
        mp4_request = GenerationRequest(**{**request.__dict__, "output_format": "mp4"})
        mp4_before = metric_sums(server.metrics_url)
        try:
            mp4_run = one_request(server.grpc_url, mp4_request, "grpc", None)
        except RuntimeError as exc:  # e.g. no PyAV on the server: the raw transports still count
            mp4_run = {"error": str(exc)}
        mp4_after = metric_sums(server.metrics_url)
        for pool in pools.values():
            pool.close()
    finally:
        server.stop()

    def mean_delta(b, a, name, model="txt2vid_stream"):
        n = a.get(f"{name}_count|{model}", 0) - b.get(f"{name}_count|{model}", 0)
        return (a.get(f"{name}_sum|{model}", 0) - b.get(f"{name}_sum|{model}", 0)) / n if n else None

    device = "cuda:0" if any(t.startswith("cuda") for t in transports) else "cpu"
    report = {
        "command": " ".join(sys.argv), "machine": platform.node(), "python": platform.python_version(),
        "request": {k: v for k, v in request.__dict__.items() if v is not None},
        "warmup": warm, "runs": runs, "summary": summarise(runs),
        "server_stage_means_s": {
            "decode (BLS to vae_decode: VAE + uint8 + hop back)": mean_delta(before, after,
                                                                           "ditserve_decode_duration_seconds"),
            "denoise": mean_delta(before, after, "ditserve_denoise_duration_seconds"),
            "encode": mean_delta(before, after, "ditserve_encode_duration_seconds"),
            "mp4 encode": mean_delta(mp4_before, mp4_after, "ditserve_mp4_duration_seconds"),
        },
        "mp4_run": mp4_run,
        "uint8_conversion_standalone_s": uint8_conversion_seconds(runs[0]["shape"], device) if runs else None,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=2))
    print(json.dumps(report["server_stage_means_s"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
