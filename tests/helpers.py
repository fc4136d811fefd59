"""Test helpers: the parity check, streaming calls with timestamps, Prometheus scraping."""
from __future__ import annotations

import queue
import re
import time
import urllib.request
import uuid
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from ditserve.client import MEDIA_OUTPUT, DitClient, GenerationRequest

# Served media against plain diffusers (or solo against batched) at the same seed: both run the same
# kernels, but a batch's row order and padding may move the last float bit before the uint8 cast.
TOLERANCE = 1   # max |served - expected| in uint8 levels


def assert_matches(served: np.ndarray, expected: np.ndarray, tolerance: int = TOLERANCE) -> None:
    """uint8 media of one shape, equal within `tolerance` levels everywhere."""
    assert served.dtype == np.uint8 and served.shape == expected.shape, \
        f"served {served.dtype} {served.shape}, expected {expected.dtype} {expected.shape}"
    diff = np.abs(served.astype(int) - expected.astype(int))
    assert diff.max() <= tolerance, f"max diff {diff.max()}, mean {diff.mean():.5f}"


def grpc_inputs(request: GenerationRequest) -> list:
    return request.infer_inputs(grpcclient)


@dataclass
class StreamCall:
    """One `<task>_stream` request on its own gRPC stream, so it can be cancelled alone."""

    url: str
    request: GenerationRequest
    responses: queue.Queue = field(default_factory=queue.Queue)
    progress: list = field(default_factory=list)
    progress_at: list = field(default_factory=list)   # when each of `progress` arrived (monotonic s)
    finished_at: float | None = None                  # when `finish` got the media (monotonic s)
    timeout_us: int | None = None   # Triton's request-level `timeout` parameter
    task: str = "txt2img"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def media(self) -> str:
        return MEDIA_OUTPUT[self.task]

    def start(self) -> "StreamCall":
        self.client = grpcclient.InferenceServerClient(self.url)
        self.client.start_stream(callback=lambda result, error: self.responses.put((time.monotonic(), result, error)))
        self.client.async_stream_infer(f"{self.task}_stream", grpc_inputs(self.request), timeout=self.timeout_us,
                                       request_id=self.request_id)
        return self

    def next(self, timeout: float = 120):
        return self.responses.get(timeout=timeout)

    def wait_progress(self, steps_done: int, timeout: float = 120) -> None:
        while not self.progress or self.progress[-1][0] < steps_done:
            at, result, error = self.next(timeout)
            assert error is None, error
            self.progress.append(tuple(int(v) for v in result.as_numpy("progress")))
            self.progress_at.append(at)

    def finish(self, timeout: float = 120):
        """Collect responses until the media or an error; returns (all progress seen, media)."""
        while True:
            at, result, error = self.next(timeout)
            if error is not None:
                raise error
            media = result.as_numpy(self.media)
            if media is not None:
                self.finished_at = at
                self.close()
                return self.progress, media
            self.progress.append(tuple(int(v) for v in result.as_numpy("progress")))
            self.progress_at.append(at)

    def outcome(self, timeout: float = 120, quiet_s: float = 0.3) -> tuple[str, object]:
        """The one terminal outcome: (media name, array) or ("error", message); progress is consumed.

        Waits `quiet_s` more and fails if anything else arrives (a second terminal response)."""
        while True:
            at, result, error = self.next(timeout)
            if error is not None:
                kind, value = "error", error.message()
                break
            media = result.as_numpy(self.media)
            if media is not None:
                kind, value = self.media, media
                break
            self.progress.append(tuple(int(v) for v in result.as_numpy("progress")))
            self.progress_at.append(at)
        time.sleep(quiet_s)
        assert self.responses.empty(), f"a response after the terminal {kind}: {self.responses.get()}"
        self.close()
        return kind, value

    def cancel(self) -> None:
        """Cancel the gRPC call (Triton's cancel)."""
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def cancel_by_id(self) -> str:
        """Cancel the generation by its request id through the `cancel` model; the stream stays
        open for its CANCELLED error. Returns the model's `state`."""
        with DitClient(self.url, "grpc", task=self.task) as client:
            return client.cancel(self.request_id)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def scrape(metrics_url: str) -> dict[tuple[str, str], float]:
    """{(metric name, model label): value} for every sample on /metrics."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.match(r'^(\w+)\{([^}]*)\}\s+(\S+)$', line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            key = (match.group(1), labels.get("model", ""))
            if "le" not in labels:
                samples[key] = float(match.group(3))
    return samples


def stage_calls(server, model: str) -> tuple[float, float]:
    """(compiled or graphed, eager) calls of `model`'s [accel] forward that requests made."""
    metrics = scrape(server.metrics_url)
    return (metrics.get(("ditserve_stage_compiled_calls_total", model), 0.0),
            metrics.get(("ditserve_stage_eager_calls_total", model), 0.0))


def delta_of(before: dict, after: dict, default_model: str):
    """delta(name, model=default_model): how much a metric moved between two scrapes (0 where absent)."""
    def delta(name: str, model: str = default_model) -> float:
        return after.get((name, model), 0) - before.get((name, model), 0)
    return delta


def histogram_above(metrics_url: str, name: str, model: str, bound: str) -> float:
    """How many observations of histogram `name` exceeded `bound` (count minus the le=bound bucket)."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    count = bucket = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or f'model="{model}"' not in line:
            continue
        if line.startswith(f"{name}_count"):
            count = float(line.split()[-1])
        elif line.startswith(f"{name}_bucket") and f'le="{bound}"' in line:
            bucket = float(line.split()[-1])
    return count - bucket


def wait_for_metric(metrics_url: str, name: str, model: str, expected: float, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while True:
        value = scrape(metrics_url).get((name, model), 0.0)
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def cancel_mid_denoise(server, request: GenerationRequest, task: str, after_steps: int = 3,
                       by_id: bool = False) -> None:
    """Stream `request`, cancel it after `after_steps` progress responses (its gRPC call, or
    `by_id` through the `cancel` model, when the stream must end with one CANCELLED error),
    and check the contract: one cancelled count on `<task>_stream`, the state table back to 0,
    no decode."""
    before = settled_scrape(server.metrics_url)
    call = StreamCall(server.grpc_url, request, task=task).start()
    call.wait_progress(after_steps)
    if by_id:
        assert call.cancel_by_id() == "cancelling"
        assert call.outcome() == ("error", "request cancelled")
    else:
        call.cancel()
    assert_cancelled_on_server(server, before, task)


def settled_scrape(metrics_url: str, quiet_s: float = 0.5, timeout: float = 30) -> dict[tuple[str, str], float]:
    """A scrape once the inference counts stop moving: Triton counts a request when the model
    releases it, which can come after its client already has the response (seen on a loaded host)."""
    deadline = time.monotonic() + timeout
    last = scrape(metrics_url)
    while True:
        time.sleep(quiet_s)
        now = scrape(metrics_url)
        counts = [{k: v for k, v in sample.items() if k[0] == "nv_inference_count"} for sample in (last, now)]
        if counts[0] == counts[1] or time.monotonic() > deadline:
            return now
        last = now


def assert_cancelled_on_server(server, before: dict, task: str) -> None:
    """Since the `before` scrape, one `<task>_stream` request was cancelled: counted once,
    the state table back to 0, no decode."""
    name, model = "ditserve_requests_cancelled_total", f"{task}_stream"
    expected = before.get((name, model), 0) + 1
    assert wait_for_metric(server.metrics_url, name, model, expected) == expected
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    time.sleep(0.5)  # a late, wrong decode would show up by now
    decodes = ("nv_inference_count", "vae_decode")
    assert scrape(server.metrics_url).get(decodes, 0) == before.get(decodes, 0), "no decode after an abort"


def run_staggered(url: str, requests: list[GenerationRequest], task: str = "txt2img",
                  wait_steps: int = 1) -> list[tuple[list, object]]:
    """Stream `requests`, each starting once the one before has done `wait_steps` steps (so
    every later one joins earlier ones mid-denoise); (progress seen, media) per request."""
    calls = []
    for i, request in enumerate(requests):
        calls.append(StreamCall(url, request, task=task).start())
        if i < len(requests) - 1:
            calls[-1].wait_progress(wait_steps)
    return [call.finish() for call in calls]


def run_staggered_batched(server, requests: list[GenerationRequest], task: str,
                          wait_steps: int = 1) -> list[tuple[list, object]]:
    """`run_staggered`, and check that at least one dit forward held more than one request."""
    shared_before = histogram_above(server.metrics_url, "ditserve_step_batch_size", "dit", "1")
    results = run_staggered(server.grpc_url, requests, task=task, wait_steps=wait_steps)
    assert histogram_above(server.metrics_url, "ditserve_step_batch_size", "dit", "1") > shared_before
    return results


def assert_stops_cleanly(server) -> float:
    """Stop `server` and fail if a stub crashed or shutdown waited out Triton's exit timeout
    (a model that never finished unloading); returns the seconds the stop took."""
    start = time.monotonic()
    server.stop()
    stop_s = time.monotonic() - start
    log = server.log_path.read_text(errors="replace")
    assert "Fatal Python error" not in log, f"a stub crashed:\n{server.log_tail(60)}"
    assert "Exit timeout expired" not in log, f"shutdown waited out the exit timeout ({stop_s:.0f} s)"
    return stop_s
