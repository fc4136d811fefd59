"""Prometheus metrics on Triton's `/metrics` endpoint (port 8002), via pb_utils.MetricFamily.

Names start with `ditserve_`; every series carries the `model` label. Families are
created once per stub process and shared by name across instances.
"""
from __future__ import annotations

import triton_python_backend_utils as pb_utils

SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
BATCH_BUCKETS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
_families: dict[str, object] = {}


def _family(name: str, help_text: str, kind):
    if name not in _families:
        _families[name] = pb_utils.MetricFamily(name=name, description=help_text, kind=kind)
    return _families[name]


def release_all() -> None:
    """Drop our metric families while the stub is still up (call from finalize, after the
    stage dropped its metrics). Destroyed later, at stub teardown, a MetricFamily segfaults
    the stub (triton-inference-server/server#8662)."""
    _families.clear()


def counter(name: str, help_text: str, model: str):
    return _family(name, help_text, pb_utils.MetricFamily.COUNTER).Metric(labels={"model": model})


class RunningTotal:
    """A counter fed from a total kept elsewhere (a runner's call counts, the adapter's cache
    hits): each `update` adds what the total gained since the last one. `seen`: what it held
    before serving (the load's own calls), which is not counted."""

    def __init__(self, metric, seen: int = 0):
        self.metric, self.seen = metric, seen

    def update(self, total: int) -> None:
        if total > self.seen:
            self.metric.increment(total - self.seen)
            self.seen = total


class Gauge:
    """A gauge that is sent to Triton only when its value changes: every metric call is an IPC
    round trip to the server process (~0.07 ms on the 2-core host), and dit sets its gauges at
    every step (one stub process per instance, so no other writer can make the cache stale)."""

    def __init__(self, metric):
        self.metric, self.value = metric, None

    def set(self, value: float) -> None:
        if value != self.value:
            self.metric.set(value)
            self.value = value


def gauge(name: str, help_text: str, model: str) -> Gauge:
    return Gauge(_family(name, help_text, pb_utils.MetricFamily.GAUGE).Metric(labels={"model": model}))


def histogram(name: str, help_text: str, model: str, buckets: list[float]):
    return _family(name, help_text, pb_utils.MetricFamily.HISTOGRAM).Metric(labels={"model": model}, buckets=buckets)


class DitMetrics:
    """What the step engine exposes: table size, active generations, step batch sizes."""

    def __init__(self, model: str, uncounted: dict[str, int] | None = None):
        """`uncounted`: forwards by path that ran before serving (the request-path warm-up)."""
        self.state_table = gauge("ditserve_state_table_size", "Generations holding state in the dit engine", model)
        self.active = gauge("ditserve_active_generations", "Generations stepped in the last dit execute", model)
        self.step_batch = histogram("ditserve_step_batch_size", "Requests per transformer forward", model,
                                    BATCH_BUCKETS)
        self.step_seconds = histogram("ditserve_step_duration_seconds", "Wall time of one dit step (all groups), "
                                      "in step mode with the holds before it", model, SECONDS_BUCKETS)
        self.admission_seconds = histogram("ditserve_admission_duration_seconds",
                                           "Wall time to admit one generation: its conditioning taken and moved "
                                           "to the device, its noise and scheduler made", model, SECONDS_BUCKETS)
        self.admission_wait_seconds = histogram("ditserve_admission_wait_seconds",
                                                "Wall time from a public model handing a generation's conditioning "
                                                "over to dit starting to admit it: the BLS hop, Triton's queue and "
                                                "the wait for the running step", model, SECONDS_BUCKETS)
        self.garbage = counter("ditserve_state_garbage_collected_total",
                               "States released because their request never came back", model)
        self.isolation_retries = counter("ditserve_step_isolation_retries_total",
                                         "Batched forwards that failed and were retried one request at a time", model)
        self.step_failures = counter("ditserve_step_failures_total",
                                     "Generations ended by a failed or non-finite denoise step", model)
        self.scheduler_waits = counter("ditserve_scheduler_waits_total",
                                       "Ready generations the step scheduler rescheduled without a step "
                                       "(one per generation per execute; always 0 with scheduler \"all\")", model)
        self.arrival_holds = counter("ditserve_step_holds_total",
                                     "Steps dit held back while the GPU ran the one before, because a generation "
                                     "was being encoded and could join them (step mode)", model)
        self.overtakes = counter("ditserve_overtakes_total",
                                 "First steps that ran at once beside the step the GPU was running, on a stream "
                                 "of the highest priority, instead of after it ([engine] overtake)", model)
        self.overtake_forward_seconds = histogram(
            "ditserve_overtake_forward_seconds",
            "Device time of a forward of first steps that overtook the running step: its own time plus what "
            "sharing the GPU with that step cost (compare the cost curve's forward of as many requests)", model,
            SECONDS_BUCKETS)
        self.late_queue = {
            "holds": counter("ditserve_late_queue_holds_total",
                             "Steps dit held back until shortly before the running step's predicted end "
                             "([engine] late_queue_ms), watching for newcomers", model),
            "joins": counter("ditserve_late_queue_joins_total",
                             "Late-queue holds that ended with a newcomer handed over, which then joined the "
                             "held step", model),
            "overran": counter("ditserve_late_queue_overran_total",
                               "Late-queue holds that went on past the deadline for a generation on its way "
                               "and ended with the device idle, without it", model),
            "starved": counter("ditserve_late_queue_starved_total",
                               "Held steps that found the device idle: queued after the step before had "
                               "ended (each widens the hold's margin by 1 ms)", model),
        }
        uncounted = uncounted or {}
        self.forwards = {
            "compiled": RunningTotal(counter("ditserve_compiled_forwards_total",
                                             "Transformer forwards run compiled / graph-captured (warm shapes)",
                                             model), uncounted.get("compiled", 0)),
            "eager": RunningTotal(counter("ditserve_eager_forwards_total",
                                          "Transformer forwards run eager ([accel] off, a shape not warmed, or a "
                                          "batch with a lossy quality tier)", model), uncounted.get("eager", 0))}
        self.cache_hits = RunningTotal(counter("ditserve_cache_hits_total",
                                               "Denoise steps a request's cache tier reused instead of running the "
                                               "blocks after the first (input quality; 0 for lossless)", model))

    def count_forwards(self, calls: dict[str, int]) -> None:
        """Add what the transformer runner counted since the last call."""
        for path, total in self.forwards.items():
            total.update(calls[path])

    def count_late_queue(self, event: str) -> None:
        """One late-queue event (late_queue.LateQueue.count): "holds", "joins", "overran" or "starved"."""
        self.late_queue[event].increment(1)

    def count_cache_hits(self, total: int) -> None:
        """Add the adapter's cache hits since the last call."""
        self.cache_hits.update(total)


class GenerateMetrics:
    """Per public model: outcomes, queue wait before the first step, per-stage durations."""

    def __init__(self, model: str):
        self.completed = counter("ditserve_requests_completed_total", "Generations that returned media", model)
        self.cancelled = counter("ditserve_requests_cancelled_total", "Generations cancelled by the client", model)
        self.failed = counter("ditserve_requests_failed_total", "Generations rejected or failed", model)
        self.first_step = histogram("ditserve_time_to_first_step_seconds",
                                    "Arrival to first completed denoise step (queue wait + encode)", model,
                                    SECONDS_BUCKETS)
        self.stage = {
            stage: histogram(f"ditserve_{stage}_duration_seconds", f"Wall time of the {stage} stage per request",
                             model, SECONDS_BUCKETS)
            for stage in ("encode", "condition", "denoise", "decode", "mp4")
        }


class VaeEncodeMetrics:
    """The conditioning of one img2vid request in its two parts (the public model's
    `condition` stage histogram times the whole BLS call, hop included)."""

    def __init__(self, model: str):
        self.image_encode = histogram("ditserve_image_encode_duration_seconds",
                                      "Wall time of the image encoder (CLIP image embeddings) per request", model,
                                      SECONDS_BUCKETS)
        self.vae_encode = histogram("ditserve_vae_encode_duration_seconds",
                                    "Wall time of the first-frame VAE condition (resize + VAE encode) per request",
                                    model, SECONDS_BUCKETS)


class AccelMetrics:
    """What warming the accelerated forwards cost at load (accel.py): a restart's price."""

    def __init__(self, model: str, report) -> None:
        self.seconds = gauge("ditserve_accel_warmup_seconds",
                             "Seconds spent at load compiling and capturing the warm shapes", model)
        self.device_bytes = gauge("ditserve_accel_warmup_device_bytes",
                                  "Device memory reserved by the warm-up (compiled kernels, CUDA graph pools)", model)
        self.seconds.set(report.seconds)
        self.device_bytes.set(report.device_bytes)
        self.model, self.runner, self.calls = model, None, {}

    def watch(self, runner) -> None:
        """Count the calls of the stage's [accel] forward (`runner`: the adapter's stage_runner,
        None without one) from now on, past the load's own calls (warm-up, the reused text row, the
        request path's warm-up): whether requests really take the compiled or graphed path."""
        if runner is None:
            return
        self.runner = runner
        self.calls = {
            "compiled": RunningTotal(counter("ditserve_stage_compiled_calls_total",
                                             "Calls of a stage's [accel] forward (text encoder, VAE decode) run "
                                             "compiled or replayed from a CUDA graph", self.model),
                                     runner.calls["compiled"]),
            "eager": RunningTotal(counter("ditserve_stage_eager_calls_total",
                                          "Calls of a stage's [accel] forward run eager (a shape or row count not "
                                          "warmed, a batch past the graphs' token cap)", self.model),
                                  runner.calls["eager"])}

    def count(self) -> None:
        """Add the calls the watched runner made since the last count (after each execute)."""
        for path, total in self.calls.items():
            total.update(self.runner.calls[path])
