"""Does a Triton 2.51 Python stub die under decoupled BLS streams whose clients cancel?

No diffusion code: `streamer` (decoupled, 4 instances) reads a decoupled BLS stream from
`producer` and forwards progress; client threads open one gRPC stream per request and cancel
CANCEL of them 5-50 ms in. Prints the client's tally, the models short of stub processes before
stopping and the crashes in the server log. `--cancel-end` picks how `streamer` ends a cancelled
request: a final response with a CANCELLED error (`error`) or the final flag alone (`flag`).

    .venv/bin/python perf/repro_bls_cancel/run.py --kind bytes --seconds 60
    .venv/bin/python perf/repro_bls_cancel/run.py --kind bytes --seconds 60 --cancel-end flag
    .venv/bin/python perf/repro_bls_cancel/run.py --seconds 20 --cancel-end flag --unload

`--unload` starts the server with explicit model control and, after the storm, unloads
`streamer` through the repository API and reports how long it took (or that it had not
finished after --unload-wait s): the unload hang after cancel storms (docs/reliability.md).

`--rss-every S` samples tritonserver's RSS every S seconds while the clients run and prints its
growth per quarter of the run, the slope over the last half (MB/min) and kB per request: does
tritonserver grow per request with no diffusion code at all (issue 19's ~1 kB/request on the H200)?

    .venv/bin/python perf/repro_bls_cancel/run.py --cancel 0 --seconds 600 --rss-every 5
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "backends"), str(HERE.parents[1] / "scripts"), str(HERE.parents[1] / "perf")]
from cancel_storm import unload_seconds  # noqa: E402
from check_stubs import short_models  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from resources import rss_kb, slope_per_min  # noqa: E402  (perf/resources.py)



def inputs(kind: int) -> list:
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([20], np.int32))
    k = grpcclient.InferInput("KIND", [1], "INT32")
    k.set_data_from_numpy(np.array([kind], np.int32))
    return [n, k]


def client(url: str, kind: int, seconds: float, cancel: float, seed: int, tally: dict, lock: threading.Lock,
           delay_s: tuple[float, float] = (0.005, 0.05), cancel_at: int = 0) -> None:
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        responses: queue.Queue = queue.Queue()
        c = grpcclient.InferenceServerClient(url)
        c.start_stream(callback=lambda result, error: responses.put(error))
        c.async_stream_infer("streamer", inputs(kind))
        if rng.random() < cancel:
            for _ in range(cancel_at):  # cancel right after the cancel_at-th response
                responses.get(timeout=30)
            time.sleep(rng.uniform(*delay_s))
            c.stop_stream(cancel_requests=True)
            outcome = "cancelled"
        else:
            try:
                errors = [responses.get(timeout=30) for _ in range(20)]
                outcome = "completed" if not any(errors) else f"error: {next(e for e in errors if e)}"[:120]
            except queue.Empty:  # the instance's stub died: Triton 2.51 never answers it
                outcome = "no response in 30 s"
            c.stop_stream(cancel_requests=outcome != "completed")
        c.close()
        with lock:
            tally[outcome] = tally.get(outcome, 0) + 1


def sample_rss(pid: int, every_s: float, stop: threading.Event, tally: dict, samples: list) -> None:
    """(time, tritonserver RSS in MB, requests ended so far) every `every_s` until `stop`."""
    while not stop.wait(every_s):
        samples.append({"t": time.monotonic(), "rss_mb": rss_kb(pid) / 1024, "requests": sum(tally.values())})


def rss_report(samples: list[dict]) -> str:
    """Growth per quarter of the run, the slope over its last half and kB per request over it."""
    if len(samples) < 8:
        return f"tritonserver RSS: {len(samples)} samples, too few (run longer or sample more often)"
    quarters = [samples[round(i * (len(samples) - 1) / 4)] for i in range(5)]
    steps = ", ".join(f"{b['rss_mb'] - a['rss_mb']:+.1f}" for a, b in zip(quarters, quarters[1:]))
    half = samples[len(samples) // 2:]
    slope = slope_per_min(half, "rss_mb")
    requests = half[-1]["requests"] - half[0]["requests"]
    grown_kb = (half[-1]["rss_mb"] - half[0]["rss_mb"]) * 1024
    return (f"tritonserver RSS: {samples[0]['rss_mb']:.1f} -> {samples[-1]['rss_mb']:.1f} MB over "
            f"{samples[-1]['t'] - samples[0]['t']:.0f} s and {samples[-1]['requests']} requests; per quarter {steps} MB; "
            f"last half {slope:+.2f} MB/min, {grown_kb / max(requests, 1):+.2f} kB per request over {requests} requests")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("bytes", "uint8"), default="bytes")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--cancel", type=float, default=0.5, help="share of requests cancelled (default 0.5)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--cancel-end", choices=("error", "flag"), default="error",
                    help="how streamer ends a cancelled request (default: a CANCELLED error response)")
    ap.add_argument("--cancel-delay", default="5:50", help="A:B ms after sending, uniform (default 5:50; a request "
                    "takes ~60 ms, so 40:90 makes many cancels cross its final response)")
    ap.add_argument("--cancel-at", type=int, default=0, help="cancel only after this many responses (of 20), then "
                    "the delay; 19 with --cancel-delay 0:2 cancels as the final response is sent")
    ap.add_argument("--final", choices=("with-response", "separate"), default="with-response",
                    help="how streamer ends an uncancelled request: its last response carries the final flag "
                         "(default), or the last response, then the final flag alone")
    ap.add_argument("--final-bytes", type=int, default=0,
                    help="the last response also carries this many bytes (our 256x256 image: 196608)")
    ap.add_argument("--unload", action="store_true", help="after the storm, unload streamer and time it")
    ap.add_argument("--unload-wait", type=float, default=60, help="give up waiting for the unload after this, s")
    ap.add_argument("--rss-every", type=float, default=0, help="sample tritonserver's RSS every this many s (0: off)")
    ap.add_argument("--log", type=Path, default=Path("/tmp/repro_bls_cancel.log"))
    args = ap.parse_args()
    kind = 0 if args.kind == "bytes" else 1
    os.environ["REPRO_CANCEL_END"] = args.cancel_end  # the server and its stubs inherit it
    os.environ["REPRO_FINAL"] = args.final
    os.environ["REPRO_FINAL_BYTES"] = str(args.final_bytes)
    delay_s = tuple(float(v) / 1000 for v in args.cancel_delay.split(":"))
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=HERE / "repository", http_port=http, grpc_port=grpc,
                                        metrics_port=metrics,
                                        extra_args=["--model-control-mode=explicit", "--load-model=*"] if args.unload
                                        else []), log_path=args.log)
    server.start()
    server.wait_ready(120)
    tally: dict = {}
    lock = threading.Lock()
    threads = [threading.Thread(target=client, args=(server.grpc_url, kind, args.seconds, args.cancel, i, tally, lock,
                                                     delay_s, args.cancel_at)) for i in range(args.clients)]
    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=sample_rss, args=(server.process.pid, args.rss_every, stop, tally, samples))
    for thread in threads:
        thread.start()
    if args.rss_every:
        sampler.start()
    for thread in threads:
        thread.join()
    stop.set()
    if args.rss_every:
        sampler.join()
    short = short_models(server.http_url, server.process.pid)
    unloaded = unload_seconds(server.grpc_url, "streamer", args.unload_wait) if args.unload else None
    server.stop(timeout_s=20)  # a dead stub's model never unloads: do not wait out the exit timeout
    crashes = args.log.read_text(errors="replace").count("Fatal Python error")
    print(f"{args.kind}, cancel end {args.cancel_end}, final {args.final} (+{args.final_bytes} bytes), cancel delay {args.cancel_delay} ms after {args.cancel_at} responses: {tally}; models short of stub processes before stop "
          f"(live, expected): {short or 'none'}; crashes in {args.log}: {crashes}")
    if args.rss_every:
        print(rss_report(samples))
    if args.unload:
        print(f"unload of streamer: {f'{unloaded:.1f} s' if unloaded is not None else f'not finished after {args.unload_wait:g} s'}")
    return 0 if not short and not crashes and (not args.unload or unloaded is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
