#!/usr/bin/env python
"""What the cancel-by-id check costs a generation: streamed requests with and without a request id.

A request sent with a request id is registered with the `cancel` model's records
(cancellation.ClientCancels: a few small file operations per generation) and its public model
looks for a client cancel flag at every dit step (one sha256 and one stat()). A request
without an id skips all of it. This script serves one deployment and alternates the two kinds
of solo request (random order within each pair, same prompt, seed and steps), then reports
each kind's latency and the ratio of the medians with a bootstrap interval, plus the cost of
one flag check timed in this process.

    .venv/bin/python perf/cancel_flag_cost.py --pairs 60 --out /tmp/flag_cost.json
    python perf/cancel_flag_cost.py --deployment configs/pixart-sigma-1024-random.toml --size 512 --pairs 40

Exit status 0 once both kinds ran; the numbers are evidence, not a pass/fail check.
"""
from __future__ import annotations

import argparse
import json
import queue
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))

from ditserve.cancellation import ClientCancels  # noqa: E402
from ditserve.client import GenerationRequest  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402

MODEL = "txt2img_stream"


def stream_seconds(url: str, request: GenerationRequest, request_id: str | None) -> float:
    """Seconds from sending one streamed request to its image."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        start = time.perf_counter()
        client.async_stream_infer(MODEL, request.infer_inputs(grpcclient), request_id=request_id or "")
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                raise error
            if result.as_numpy("image") is not None:
                return time.perf_counter() - start
    finally:
        client.stop_stream()
        client.close()


def flag_check_us(calls: int = 20000) -> float:
    """Microseconds per `ClientCancels.cancelled` of an id that was not cancelled (the hot path)."""
    cancels = ClientCancels(pipeline=f"flag-cost-{uuid.uuid4().hex[:8]}")
    ids = [uuid.uuid4().hex for _ in range(64)]
    start = time.perf_counter()
    for i in range(calls):
        cancels.cancelled(ids[i % len(ids)])
    seconds = time.perf_counter() - start
    cancels.remove_all()
    return seconds / calls * 1e6


def median_ratio_interval(with_id: list[float], without: list[float], draws: int = 2000) -> list[float]:
    """95 % bootstrap interval of median(with_id) / median(without)."""
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(with_id, k=len(with_id)))
                    / statistics.median(rng.choices(without, k=len(without))) for _ in range(draws))
    return [ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", help="deployment TOML (default: the embedded tiny pipeline)")
    ap.add_argument("--size", type=int, default=64, help="height = width in pixels (default 64)")
    ap.add_argument("--steps", type=int, default=20, help="denoise steps (default 20)")
    ap.add_argument("--pairs", type=int, default=60, help="requests of each kind (default 60)")
    ap.add_argument("--warmup", type=int, default=3, help="requests before timing (default 3)")
    ap.add_argument("--out", type=Path, help="write the raw numbers here (JSON)")
    ap.add_argument("--log", type=Path, default=Path("/tmp/cancel_flag_cost.log"), help="server log")
    args = ap.parse_args()

    http, grpc, metrics = free_ports(3)
    options = ServerOptions(http_port=http, grpc_port=grpc, metrics_port=metrics, deployment=args.deployment)
    request = GenerationRequest("a red fox sitting in the snow, watercolor", seed=1, height=args.size,
                                width=args.size, num_inference_steps=args.steps)
    times: dict[str, list[float]] = {"with_id": [], "without_id": []}
    with TritonServer(options, log_path=args.log) as server:
        server.wait_ready(600, progress=True)
        for _ in range(args.warmup):
            stream_seconds(server.grpc_url, request, uuid.uuid4().hex)
            stream_seconds(server.grpc_url, request, None)
        order = random.Random(1)
        for i in range(args.pairs):
            kinds = ["with_id", "without_id"]
            order.shuffle(kinds)
            for kind in kinds:
                times[kind].append(stream_seconds(server.grpc_url, request,
                                                  uuid.uuid4().hex if kind == "with_id" else None))
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{args.pairs} pairs", flush=True)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    ratio = medians["with_id"] / medians["without_id"]
    result = {
        "command": " ".join(sys.argv), "deployment": args.deployment or "model_repository (embedded tiny)",
        "size": args.size, "steps": args.steps, "pairs": args.pairs,
        "median_s": medians, "ratio_with_over_without": ratio,
        "ratio_95_interval": median_ratio_interval(times["with_id"], times["without_id"]),
        "per_step_difference_ms": (medians["with_id"] - medians["without_id"]) / args.steps * 1e3,
        "flag_check_us": flag_check_us(), "seconds": times,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
