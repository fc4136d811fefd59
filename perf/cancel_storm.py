#!/usr/bin/env python
"""A storm of client cancels on `txt2img_stream`, then an unload of it: does the unload finish?

Each client thread opens one gRPC stream per request (tritonclient, as users do) and cancels
it (`stop_stream(cancel_requests=True)`) after `cancel_at` progress responses plus 0-3 ms:

- `--cancel-at early` (default): after 0 to steps/2 progress responses. The cancels land while
  the request is queued, being encoded or mid-denoise, never near the end: what our models
  must clean up. tests/test_clean_shutdown.py runs this and bounds the unload.
- `--cancel-at final`: after steps-1 responses, so many cancels reach Triton while the final
  response (the image) is being sent. With Triton 2.51 this leaves `txt2img_stream` in
  UNLOADING for good (docs/reliability.md, "Unload after cancel storms").

    .venv/bin/python perf/cancel_storm.py --cancel-at early --seconds 15
    .venv/bin/python perf/cancel_storm.py --cancel-at final --seconds 15 --log /tmp/storm.log --log-verbose 1
    .venv/bin/python perf/cancel_storm.py --cancel-at final --seconds 400 --survival

`--survival` skips the unload and asks only whether tritonserver itself lives through the storm:
Triton 2.51's gRPC front end segfaults now and then when a cancel crosses the final response
(docs/reliability.md, "Known crash of Triton 2.51 under client cancels"). `--cancel-by id`
cancels through the `cancel` model by request id instead of cancelling the gRPC call (the
stream is then read to its end: a CANCELLED error, or the image when the cancel came too late):

    .venv/bin/python perf/cancel_storm.py --cancel-at final --cancel-by id --seconds 400 --survival

The server runs with `--model-control-mode=explicit` (the repository API needs it). Prints the
requests cancelled, the server's outcome counters and the unload time (or that it had not
finished after --unload-wait s); exit status 0 when the unload finished.
"""
from __future__ import annotations

import argparse
import queue
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))

from ditserve.client import GenerationRequest, cancel_inputs  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402

MODEL = "txt2img_stream"


def _cancel_one(url: str, request: GenerationRequest, after: int, jitter_s: float, by_id: bool = False) -> None:
    """Stream `request`, read `after` progress responses (fewer if it ends first), wait `jitter_s`,
    cancel: the gRPC call, or `by_id` through the `cancel` model and then read the stream to its end."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    request_id = uuid.uuid4().hex
    client.async_stream_infer(MODEL, request.infer_inputs(grpcclient), request_id=request_id)
    done, ended = 0, False
    while done < after and not ended:
        done, ended = _read(responses, done)
    time.sleep(jitter_s)
    if by_id:
        client.infer("cancel", cancel_inputs(grpcclient, request_id))
        while not ended:
            done, ended = _read(responses, done)
    client.stop_stream(cancel_requests=not by_id)
    client.close()


def _read(responses: queue.Queue, done: int) -> tuple[int, bool]:
    """The next response: (steps done, whether it was the last: an error or the image)."""
    result, error = responses.get(timeout=60)
    if error is not None or result.as_numpy("image") is not None:
        return done, True
    return int(result.as_numpy("progress").reshape(-1)[0]), False


def storm(url: str, seconds: float, clients: int = 4, steps: int = 20, cancel_at: str = "early",
          seed: int = 0, alive: Callable[[], bool] = lambda: True, report_every: int = 0, by_id: bool = False) -> int:
    """Cancel streamed 64x64 generations of `steps` steps from `clients` threads for `seconds`
    (or until a request fails and `alive()` says the server is gone: asked only then, as it may
    read the server log); returns how many were cancelled. `cancel_at`:
    "early" (0 to steps/2 progress responses) or "final" (steps-1: the cancel crosses the final
    response). `report_every` > 0 prints a progress line every that many cancels. `by_id`:
    cancel through the `cancel` model instead of the gRPC call."""
    if cancel_at not in ("early", "final"):
        raise ValueError(f"cancel_at={cancel_at!r}; allowed: 'early', 'final'")
    counts = [0] * clients
    gone = threading.Event()

    def client_loop(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        end = time.monotonic() + seconds
        while time.monotonic() < end and not gone.is_set():
            after = rng.randint(0, steps // 2) if cancel_at == "early" else steps - 1
            request = GenerationRequest(f"storm {k}-{counts[k]}", seed=counts[k], num_inference_steps=steps)
            try:
                _cancel_one(url, request, after, rng.uniform(0.0, 0.003), by_id)
            except (queue.Empty, InferenceServerException):
                if alive():
                    raise
                gone.set()   # the server died under the storm: main() reports it
                return
            counts[k] += 1
            if report_every and sum(counts) % report_every == 0:
                print(f"  {sum(counts)} cancels, {seconds - (end - time.monotonic()):.0f} s", flush=True)

    threads = [threading.Thread(target=client_loop, args=(k,), name=f"storm-{k}") for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def unload_seconds(url: str, model: str, wait_s: float) -> float | None:
    """Unload `model` through the repository API and poll its state until it is unloaded:
    the seconds that took, or None when it was still unloading after `wait_s`."""
    with grpcclient.InferenceServerClient(url) as client:
        start = time.monotonic()
        client.unload_model(model)
        while time.monotonic() - start < wait_s:
            states = {m["name"]: m.get("state") for m in client.get_model_repository_index(as_json=True)["models"]}
            if states.get(model) in (None, "UNAVAILABLE"):
                return time.monotonic() - start
            time.sleep(0.25)
    return None


def explicit_server_options(**options) -> ServerOptions:
    """Server options on free ports with the repository API on (explicit model control, all loaded)."""
    http, grpc, metrics = free_ports(3)
    return ServerOptions(http_port=http, grpc_port=grpc, metrics_port=metrics,
                         extra_args=["--model-control-mode=explicit", "--load-model=*"], **options)


def crash_lines(log: Path) -> list[str]:
    """The server log's `Signal (N) received.` lines (tritonserver's crash handler prints them)."""
    return [line for line in log.read_text(errors="replace").splitlines() if line.startswith("Signal (")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cancel-at", choices=("early", "final"), default="early")
    ap.add_argument("--cancel-by", choices=("stream", "id"), default="stream",
                    help="cancel the gRPC call (stream, default) or the request id through the `cancel` model")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of the storm (default 15)")
    ap.add_argument("--clients", type=int, default=6, help="client threads (default 6)")
    ap.add_argument("--steps", type=int, default=20, help="denoise steps per request (default 20)")
    ap.add_argument("--unload-wait", type=float, default=60.0, help="give up on the unload after this, s (default 60)")
    ap.add_argument("--survival", action="store_true",
                    help="no unload: report whether tritonserver itself survived the storm (exit 1 if not)")
    ap.add_argument("--log", type=Path, default=Path("/tmp/cancel_storm.log"), help="server log")
    ap.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose (1 logs the gRPC states)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "perf"))
    from loadgen import scrape

    server = TritonServer(explicit_server_options(log_verbose=args.log_verbose), log_path=args.log)
    server.start()
    ok = False
    try:
        server.wait_ready(300, progress=True)
        print(f"\nstorm: {args.clients} clients, {args.seconds:g} s, cancel {args.cancel_at} by {args.cancel_by}",
              flush=True)
        start = time.monotonic()
        # After a crash Triton's signal handler can hang (a `double free` abort did): dead all the same.
        alive = lambda: server.process.poll() is None and not crash_lines(args.log)   # noqa: E731
        cancelled = storm(server.grpc_url, args.seconds, args.clients, args.steps, args.cancel_at, alive=alive,
                          report_every=1000 if args.survival else 0, by_id=args.cancel_by == "id")
        if not alive():
            print(f"tritonserver crashed (exit code {server.process.poll()}) after {cancelled} cancels in "
                  f"{time.monotonic() - start:.0f} s: {crash_lines(args.log) or 'no Signal line in its log'}",
                  flush=True)
            server.process.kill()
            return 1
        time.sleep(2)
        counts = {name: int(value) for (name, model), value in scrape(server.metrics_url).items()
                  if model == MODEL and name.startswith("ditserve_requests_")}
        print(f"cancelled by the clients: {cancelled} in {time.monotonic() - start:.0f} s; server counters of "
              f"{MODEL}: {counts}", flush=True)
        if args.survival:
            print("tritonserver survived the storm", flush=True)
            ok = True
        else:
            seconds = unload_seconds(server.grpc_url, MODEL, args.unload_wait)
            print(f"unload of {MODEL}: " + (f"{seconds:.1f} s" if seconds is not None
                                             else f"still UNLOADING after {args.unload_wait:g} s"), flush=True)
            ok = seconds is not None
    finally:
        start = time.monotonic()
        server.stop()
        print(f"server stopped in {time.monotonic() - start:.1f} s (log {args.log})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
