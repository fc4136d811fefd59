#!/usr/bin/env python
"""Per-step overhead of `dit` outside the denoise step itself, and what the size of a
request's inputs adds to it.

    python perf/step_overhead.py --out perf/results/<date>-<machine>-step-overhead.json

Question: `dit` is an iterative-sequence model, so Triton hands the same request back to
`execute` at every step. Does the Python backend copy that request's inputs (the prompt
embeddings: ~9.8 MB for PixArt-Sigma's [2, 300, 4096] fp32, ~16 MB for Wan's UMT5) into the
stub again each time? If it does, every step of every generation pays for that copy on top
of the transformer forward.

Method: one server (the default tiny deployment), one generation at a time streamed straight
to `dit` (no public model, no text encoder, no decode), `--steps` steps. Per run, the client
measures the interval between consecutive progress responses, and the server's
`ditserve_step_duration_seconds` histogram gives the time inside the step. The difference is
the per-step overhead: Triton rescheduling, the Python backend's IPC, the progress response.
The embeddings are padded along the sequence axis (the tiny transformer attends to any
length, the mask marks the padding) to the byte size of the real models' embeddings, and the
same runs are made with the real tiny size. Each size runs twice: `inline` (the embeddings in
the request, as a direct client of `dit` sends them) and `handoff` (written to the server's
conditioning store first, as the public models do: ditserve/handoff.py). The four runs
alternate, so drift hits all alike.
"""
from __future__ import annotations

import argparse
import json
import platform
import queue
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT / "perf"))
from ditserve.deployment import load_deployment  # noqa: E402
from ditserve.handoff import ConditioningStore, HostTensor, default_root  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from loadgen import histogram_mean, scrape  # noqa: E402
from machine import machine_info, server_version  # noqa: E402


def tensor(name: str, value: np.ndarray, dtype: str):
    t = grpcclient.InferInput(name, list(value.shape), dtype)
    t.set_data_from_numpy(value)
    return t


def one_generation(url: str, seq_len: int, width: int, steps: int, handoff: ConditioningStore | None) -> list[float]:
    """Seconds between consecutive progress responses of one generation of `steps` steps;
    the embeddings travel in the request, or (`handoff`) out of band as the public models send them."""
    params = {"prompt": "overhead", "negative_prompt": "", "height": 64, "width": 64, "num_inference_steps": steps,
              "guidance_scale": 4.5, "seed": 1, "seed_was_drawn": False}
    embeds, mask = np.zeros((1, 2, seq_len, width), np.float32), np.zeros((1, 2, seq_len), np.int64)
    mask[..., :8] = 1
    inputs = [tensor("params", np.array([[json.dumps(params).encode()]], np.object_), "BYTES")]
    request_id = uuid.uuid4().hex
    if handoff is None:
        inputs += [tensor("embeds", embeds, "FP32"), tensor("mask", mask, "INT64")]
    else:
        handoff.put(request_id, {"embeds": HostTensor.from_numpy(embeds[0]), "mask": HostTensor.from_numpy(mask[0])})
    arrivals: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: arrivals.put((time.perf_counter(), result, error)))
        client.async_stream_infer("dit", inputs, request_id=request_id,
                                  outputs=[grpcclient.InferRequestedOutput("progress"),
                                           grpcclient.InferRequestedOutput("latents")])
        times = []
        while len(times) < steps:
            at, result, error = arrivals.get(timeout=120)
            if error is not None:
                raise RuntimeError(error.message())
            times.append(at)
        client.stop_stream()
    return [b - a for a, b in zip(times, times[1:])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", default="configs/tiny-pixart-sigma.toml")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target-mb", type=float, default=9.8,
                    help="embedding bytes to emulate (default: PixArt-Sigma's [2, 300, 4096] fp32)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    deployment = load_deployment(args.deployment)
    base_len = deployment.model.max_sequence_length
    from diffusers import PixArtTransformer2DModel
    width = PixArtTransformer2DModel.load_config(deployment.model_location(), subfolder="transformer")[
        "caption_channels"]
    big_len = int(args.target_mb * 1e6 / (2 * width * 4))
    sizes = {"tiny": base_len, "padded": big_len}
    ways = ("inline", "handoff")
    print(f"[step_overhead] embeds [2, L, {width}] fp32: tiny L={base_len} "
          f"({2 * base_len * width * 4 / 1e6:.3f} MB), padded L={big_len} ({2 * big_len * width * 4 / 1e6:.1f} MB)")
    http, grpc, metrics = free_ports(3)
    log = Path(tempfile.gettempdir()) / "step_overhead.server.log"
    server = TritonServer(ServerOptions(model_repository=ROOT / "model_repository", http_port=http, grpc_port=grpc,
                                        metrics_port=metrics, deployment=args.deployment), log_path=log)
    runs = [(size, way) for size in sizes for way in ways]
    rows = {f"{size}/{way}": {"intervals_ms": [], "step_ms": []} for size, way in runs}
    with server:
        server.wait_ready(timeout_s=180)
        version = server_version(server.grpc_url)
        handoff = ConditioningStore(default_root(server.process.pid))
        for size, way in runs:  # warm-up, excluded
            one_generation(server.grpc_url, sizes[size], width, 3, handoff if way == "handoff" else None)
        for rep in range(args.reps):
            for size, way in runs:
                before = scrape(server.metrics_url)
                intervals = one_generation(server.grpc_url, sizes[size], width, args.steps,
                                           handoff if way == "handoff" else None)
                after = scrape(server.metrics_url)
                row = rows[f"{size}/{way}"]
                row["intervals_ms"] += [1000 * v for v in intervals]
                row["step_ms"].append(1000 * histogram_mean(before, after, "ditserve_step_duration_seconds", "dit"))
                print(f"[step_overhead] rep {rep + 1}/{args.reps} {size}/{way}: median interval "
                      f"{statistics.median(intervals) * 1000:.2f} ms", flush=True)
    summary = {}
    for (size, way), (name, row) in zip(runs, rows.items()):
        interval, step = statistics.median(row["intervals_ms"]), statistics.median(row["step_ms"])
        summary[name] = {"seq_len": sizes[size], "embeds_mb": round(2 * sizes[size] * width * 4 / 1e6, 3),
                         "median_interval_ms": round(interval, 3), "median_step_ms": round(step, 3),
                         "overhead_ms": round(interval - step, 3)}
    report = {"command": " ".join(sys.argv), "machine": machine_info(version), "platform": platform.platform(),
              "summary": summary, "raw": rows}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
