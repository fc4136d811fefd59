#!/usr/bin/env python
"""Open-loop load generator for `txt2img_stream`: Poisson or trace arrivals, per-step progress.

What perf_analyzer cannot express: Poisson (or replayed) arrivals of a *mixed* workload
(sizes, step counts), client cancellations, time to first denoise step, SLO attainment
against each shape's solo latency, and an exactly-one-terminal check per request.

    # replay the committed tiny trace against a running server
    python perf/loadgen.py --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \\
        --trace perf/traces/tiny_mixed_v1.jsonl --out /tmp/report.json
    # Poisson arrivals generated on the fly (seeded, so two runs send the same requests)
    python perf/loadgen.py --url ... --rate 2 --num-requests 100 --sizes 512,1024 --steps 20,30
    # write such a trace once, to replay it later
    python perf/loadgen.py --make-trace perf/traces/x.jsonl --rate 8 --num-requests 40 \\
        --sizes 64,96,128 --steps 10,20,30 --cancel-rate 0.05
    # one pipeline of a repository serving several (docs/pipelines.md): flux_txt2img_stream
    python perf/loadgen.py --url ... --pipeline flux --rate 2 --num-requests 50

The server-side figures come from the series of the model sent to and of its pipeline's `dit`
(`flux_dit` for `flux_txt2img_stream`: ditserve.pipelines decides the names).

Every request is its own gRPC stream (tritonclient.grpc.aio `stream_infer`) on one shared
channel, so cancelling one (the stream's `cancel()`) touches no other. Phases: warm-up
(excluded), solo latency of every distinct shape (one request at a time, excluded), then
the measured run. Server metrics (`--metrics-url`) are diffed around the measured run only.

Two optional trace fields serve reliability runs (perf/soak.py): `unary: true` sends the
request to the non-streaming model (`txt2img`), the only path on which a client sees an
error's gRPC status (a stream's error carries its message alone; unary requests are never
cancelled), and `expect_error: REGEX` marks a request that must fail with a matching error
(a bad input, a fault-tagged prompt); `shm: system|cuda` sends it unary with the image written
into a shared-memory region the client registered (ditserve.shm). `unexpected_outcomes` counts the requests whose one
terminal outcome is not what it should be (see outcome_problem).

Report names follow vLLM-Omni's diffusion benchmark
(benchmarks/diffusion/diffusion_benchmark_serving.py: duration, completed_requests,
failed_requests, throughput_qps, latency_mean/median/p50/p99 in SECONDS,
slo_attainment_rate, slo_met_success, slo_scale) and, for millisecond statistics,
vLLM's benchmark_serving (request_throughput, mean/median/std/p95/p99_e2el_ms); time to
first step is named after vLLM's TTFT: mean/median/p95/p99_ttfs_ms. See perf/README.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# perf/resources.py, also when loaded by file path; ditserve where it is not installed (the GPU host)
sys.path[:0] = [str(ROOT / "perf"), str(ROOT / "backends")]
import resources  # noqa: E402
from ditserve.client import cancel_inputs  # noqa: E402
from ditserve.pipelines import PipelineNames, split_model_name  # noqa: E402

MODEL = "txt2img_stream"
TRACE_FIELDS = ("t", "prompt", "height", "width", "num_inference_steps", "guidance_scale", "seed", "cancel_after_s",
                "cancel_by", "unary", "expect_error")
CANCEL_BY = ("stream", "id")   # a trace entry's `cancel_by`: cancel the gRPC call, or the request id (`cancel` model)
DEFAULT_PROMPTS = (
    "a red fox sitting in the snow, watercolor",
    "a lighthouse on a cliff at dusk, oil painting",
    "a bowl of ramen, studio photo",
    "an astronaut riding a horse on the moon",
    "a quiet street in Kyoto after rain",
    "a cat wearing sunglasses on a beach",
    "a futuristic city skyline at night, neon",
    "a field of sunflowers under a blue sky",
)


# ---- workload and traces ----------------------------------------------------------------

def parse_sizes(text: str) -> list[tuple[int, int]]:
    """'64,96,128' (square) or '512x768,1024' (HxW) -> [(h, w), ...]."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        h, _, w = part.partition("x")
        out.append((int(h), int(w or h)))
    if not out:
        raise ValueError(f"no sizes in {text!r}")
    return out


def parse_steps(text: str) -> list[int] | tuple[int, int]:
    """'10,20,30' (choose one) or '10-30' (uniform integer in the range)."""
    text = text.strip()
    if re.fullmatch(r"\d+-\d+", text):
        lo, hi = (int(v) for v in text.split("-"))
        return (min(lo, hi), max(lo, hi))
    return [int(v) for v in text.split(",") if v.strip()]


def parse_range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(":")
    return float(lo), float(hi or lo)


@dataclass
class WorkloadSpec:
    """A mixed workload; make_trace() draws a reproducible Poisson trace from it."""

    rate: float
    num_requests: int
    sizes: list = field(default_factory=lambda: [(64, 64)])
    steps: object = field(default_factory=lambda: [10])
    guidance_scales: list = field(default_factory=lambda: [4.5])
    cancel_rate: float = 0.0
    cancel_delay_s: tuple = (0.05, 0.5)
    seed: int = 0
    prompts: tuple = DEFAULT_PROMPTS


def make_trace(spec: WorkloadSpec) -> list[dict]:
    """Poisson arrivals (first at t=0) with shapes drawn uniformly from the spec; seeded."""
    if spec.rate <= 0 or spec.num_requests < 1:
        raise ValueError("make_trace needs rate > 0 and num_requests >= 1")
    rng = random.Random(spec.seed)
    t, out = 0.0, []
    for i in range(spec.num_requests):
        if i:
            t += rng.expovariate(spec.rate)
        h, w = rng.choice(spec.sizes)
        steps = rng.randint(*spec.steps) if isinstance(spec.steps, tuple) else rng.choice(spec.steps)
        entry = {"t": round(t, 4), "prompt": rng.choice(spec.prompts), "height": h, "width": w,
                 "num_inference_steps": steps, "guidance_scale": rng.choice(spec.guidance_scales),
                 "seed": rng.randrange(2**31)}
        if rng.random() < spec.cancel_rate:
            entry["cancel_after_s"] = round(rng.uniform(*spec.cancel_delay_s), 3)
        out.append(entry)
    return out


def load_trace(path: str | os.PathLike) -> list[dict]:
    entries = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        entry = json.loads(line)
        unknown = set(entry) - set(TRACE_FIELDS)
        if unknown or "t" not in entry or "prompt" not in entry:
            raise ValueError(f"{path}:{n}: needs 't' and 'prompt', allowed fields {TRACE_FIELDS}; got {sorted(entry)}")
        if entry.get("cancel_by", "stream") not in CANCEL_BY:
            raise ValueError(f"{path}:{n}: cancel_by {entry['cancel_by']!r}; allowed {CANCEL_BY}")
        entries.append(entry)
    entries.sort(key=lambda e: e["t"])
    return entries


def write_trace(entries: list[dict], path: str | os.PathLike) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(e, sort_keys=False) + "\n" for e in entries))


def add_cancellations(entries: list[dict], rate: float, delay_s: tuple[float, float], seed: int) -> list[dict]:
    """Mark a seeded `rate` fraction of the entries without cancel_after_s for a client cancel."""
    rng = random.Random(f"cancel-{seed}")
    out = []
    for e in entries:
        e = dict(e)
        if "cancel_after_s" not in e and rng.random() < rate:
            e["cancel_after_s"] = round(rng.uniform(*delay_s), 3)
        out.append(e)
    return out


def shape_key(entry: dict) -> str:
    """What a solo latency depends on: size, steps and CFG on/off (guidance > 1, diffusers' rule)."""
    cfg = "cfg" if float(entry.get("guidance_scale", 4.5) or 0) > 1 else "nocfg"
    return f"{entry.get('height', 'd')}x{entry.get('width', 'd')}-{entry.get('num_inference_steps', 'd')}steps-{cfg}"


# ---- one request ---------------------------------------------------------------------------

@dataclass
class Record:
    index: int
    shape: str
    arrival_s: float                  # scheduled offset from the start of the run
    cancel_after_s: float | None
    send_s: float | None = None       # offsets from the start of the run (perf_counter)
    first_step_s: float | None = None
    end_s: float | None = None
    outcome: str = "pending"          # completed | failed | cancelled | lost
    terminals: int = 0                # terminal outcomes seen: image, error, or our own cancel
    after_terminal: int = 0           # responses that arrived after a terminal one
    progress: int = 0
    last_progress: tuple | None = None
    cancel_sent: bool = False
    cancel_too_late: bool = False     # the cancel timer fired after the request had ended
    error: str | None = None
    expect_error: str | None = None   # regex the terminal error must match (a bad or fault-tagged request)
    image_shape: tuple | None = None

    @property
    def e2el_s(self) -> float | None:
        return None if self.send_s is None or self.end_s is None else self.end_s - self.send_s

    @property
    def ttfs_s(self) -> float | None:
        return None if self.send_s is None or self.first_step_s is None else self.first_step_s - self.send_s


def _inputs(grpcclient, entry: dict) -> list:
    spec = (("prompt", "BYTES", np.object_), ("negative_prompt", "BYTES", np.object_), ("height", "INT32", np.int32),
            ("width", "INT32", np.int32), ("num_inference_steps", "INT32", np.int32),
            ("guidance_scale", "FP32", np.float32), ("seed", "INT64", np.int64))
    out = []
    for name, dtype, np_type in spec:
        value = entry.get(name)
        if value is None:
            continue
        if np_type is np.object_:
            value = str(value).encode("utf-8")
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(np.array([value], dtype=np_type))
        out.append(tensor)
    return out


async def one_request(client, entry: dict, rec: Record, t0: float, timeout_s: float, model: str = MODEL,
                      pool=None) -> Record:
    """Send one generation on its own stream and read it to the end; fills `rec`. An entry with
    `shm` goes unary with its image written into a region of `pool` (ditserve.shm)."""
    import grpc
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    now = lambda: time.perf_counter() - t0  # noqa: E731
    inputs = _inputs(grpcclient, entry)
    request_id = uuid.uuid4().hex
    if entry.get("shm"):
        return await _shm_request(client, pool, entry, inputs, request_id, rec, now, timeout_s,
                                  model.removesuffix("_stream"))
    if entry.get("unary"):
        return await _unary_request(client, inputs, request_id, rec, now, timeout_s, model.removesuffix("_stream"))

    async def requests():
        yield {"model_name": model, "inputs": inputs, "request_id": request_id}

    rec.send_s = now()
    stream = client.stream_infer(requests(), stream_timeout=timeout_s)
    canceller = None
    by_id = entry.get("cancel_by", "stream") == "id"
    if rec.cancel_after_s is not None:
        async def cancel_later():
            await asyncio.sleep(max(0.0, rec.cancel_after_s))
            if rec.terminals:
                return
            rec.cancel_sent = True
            if by_id:   # the stream is read on to its CANCELLED error (docs/reliability.md)
                await _cancel_by_id(client, model, request_id)
            else:
                stream.cancel()
        canceller = asyncio.create_task(cancel_later())

    def terminal(outcome: str, error: str | None = None) -> None:
        if rec.terminals == 0:
            rec.outcome, rec.end_s, rec.error = outcome, now(), error
        rec.terminals += 1

    def our_cancel_ended_it() -> None:
        # Our cancel can cross the server's one terminal response in flight (gRPC still hands
        # us what it had received): then that response is the outcome, and the cancel is no
        # second terminal. Two server terminals would still count twice.
        if rec.terminals == 0:
            terminal("cancelled")

    try:
        async for result, error in stream:
            if rec.terminals:
                rec.after_terminal += 1
            if error is not None:
                if by_id and rec.cancel_sent and error.message() == "request cancelled":
                    terminal("cancelled")
                else:
                    terminal("failed", str(error))
                continue
            image = result.as_numpy("image")
            progress = result.as_numpy("progress")
            if progress is not None:
                rec.progress += 1
                rec.last_progress = tuple(int(v) for v in progress.reshape(-1))
                if rec.first_step_s is None:
                    rec.first_step_s = now()
            if image is not None:
                rec.image_shape = tuple(int(v) for v in image.shape)
                terminal("completed")
            elif progress is None:
                params = result.get_response().parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    terminal("failed", "final response without an image")
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not rec.cancel_sent or (task is not None and getattr(task, "cancelling", lambda: 0)()):
            raise  # we are being cancelled ourselves (Ctrl-C, shutdown), not our stream
        our_cancel_ended_it()
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED and rec.cancel_sent:
            our_cancel_ended_it()
        elif exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and rec.terminals == 0:
            rec.outcome, rec.end_s, rec.error = "lost", now(), f"no terminal response within {timeout_s}s"
        else:
            terminal("failed", f"{exc.code().name}: {exc.details()}")
    except InferenceServerException as exc:
        terminal("failed", str(exc))
    finally:
        if canceller is not None:
            if not (by_id and rec.cancel_sent):   # a cancel call in flight by id is left to finish
                canceller.cancel()
            rec.cancel_too_late = not rec.cancel_sent  # the request ended before its cancel was due
    if rec.terminals == 0 and rec.outcome == "pending":
        rec.outcome, rec.end_s, rec.error = "lost", now(), "stream ended without a terminal response"
    return rec


async def _cancel_by_id(client, model: str, request_id: str) -> None:
    """Cancel generation `request_id` through the `cancel` model of `model`'s pipeline."""
    import tritonclient.grpc as grpcclient

    await client.infer(PipelineNames(split_model_name(model)[0]).model("cancel"), cancel_inputs(grpcclient, request_id))


async def _unary_request(client, inputs: list, request_id: str, rec: Record, now, timeout_s: float,
                         model: str) -> Record:
    """One call of the non-streaming model: the only way a client sees the error's gRPC status
    (a stream's error carries its message alone). Never cancelled."""
    from tritonclient.utils import InferenceServerException

    rec.send_s = now()
    try:
        result = await client.infer(model, inputs, request_id=request_id, client_timeout=timeout_s)
    except InferenceServerException as exc:   # str() is "[StatusCode.X] message"
        lost = "DEADLINE_EXCEEDED" in str(exc.status())
        rec.outcome, rec.error = ("lost", f"no response within {timeout_s}s") if lost else ("failed", str(exc))
        rec.terminals, rec.end_s = int(not lost), now()
        return rec
    image = result.as_numpy("image")
    rec.outcome, rec.terminals, rec.end_s = ("completed" if image is not None else "failed"), 1, now()
    if image is None:
        rec.error = "response without an image"
    else:
        rec.image_shape = tuple(int(v) for v in image.shape)
    return rec


async def _shm_request(client, pool, entry: dict, inputs: list, request_id: str, rec: Record, now, timeout_s: float,
                       model: str) -> Record:
    """A unary call whose image lands in a shared-memory region of `pool` (system or CUDA), read
    back to check it; a region whose request failed is dropped, never reused."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    shape = [int(entry["height"]), int(entry["width"]), 3]
    region = pool.acquire(shape[0] * shape[1] * 3)
    output = grpcclient.InferRequestedOutput("image")
    output.set_shared_memory(region.name, region.byte_size)
    rec.send_s = now()
    try:
        result = await client.infer(model, inputs, outputs=[output], request_id=request_id, client_timeout=timeout_s)
    except InferenceServerException as exc:
        pool.release(region, broken=True)
        lost = "DEADLINE_EXCEEDED" in str(exc.status())
        rec.outcome, rec.error = ("lost", f"no response within {timeout_s}s") if lost else ("failed", str(exc))
        rec.terminals, rec.end_s = int(not lost), now()
        return rec
    rec.outcome, rec.terminals, rec.end_s = "completed", 1, now()
    written = result.get_output("image")
    if written is None:
        rec.outcome, rec.error = "failed", "response without the image output"
    else:
        rec.image_shape = tuple(int(v) for v in pool.read(region, list(written.shape)).shape)
    pool.release(region)
    return rec


async def run_entries(url: str, entries: list[dict], max_concurrency: int | None, timeout_s: float,
                      speedup: float = 1.0, model: str = MODEL, progress_label: str = "") -> tuple[list[Record], float]:
    """Send `entries` at their arrival offsets (open loop); returns records and the run's t0."""
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)
    pool = _region_pool(url, entries)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    records = [Record(i, shape_key(e), float(e.get("t", 0.0)) / speedup, None if e.get("unary") else e.get("cancel_after_s"),
                      expect_error=e.get("expect_error")) for i, e in enumerate(entries)]
    t0 = time.perf_counter()
    done = 0

    async def launch(entry: dict, rec: Record):
        nonlocal done
        delay = rec.arrival_s - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        if sem is None:
            await one_request(client, entry, rec, t0, timeout_s, model, pool)
        else:
            async with sem:
                await one_request(client, entry, rec, t0, timeout_s, model, pool)
        done += 1
        if progress_label and (done % max(1, len(entries) // 10) == 0 or done == len(entries)):
            print(f"[loadgen] {progress_label}: {done}/{len(entries)} done", file=sys.stderr, flush=True)

    try:
        await asyncio.gather(*(launch(e, r) for e, r in zip(entries, records)))
    finally:
        await client.close()
        if pool is not None:
            pool.close()
            pool.client.close()
    return records, t0


async def closed_loop(url: str, entries: list[dict], concurrency: int, seconds: float, timeout_s: float,
                      model: str = MODEL) -> list[Record]:
    """`concurrency` clients, each sending its next request (the next of `entries`, cycling) as
    soon as its last one ended, for `seconds`: a saturation measurement."""
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)
    records: list[Record] = []
    t0 = time.perf_counter()

    async def one_client() -> None:
        while time.perf_counter() - t0 < seconds:
            entry = entries[len(records) % len(entries)]
            rec = Record(len(records), shape_key(entry), time.perf_counter() - t0, None)
            records.append(rec)
            await one_request(client, entry, rec, t0, timeout_s, model)

    try:
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    finally:
        await client.close()
    return records


def _region_pool(url: str, entries: list[dict]):
    """An output-region pool of the kind the entries ask for (`shm`: system | cuda), or None.
    Regions are registered through a synchronous client: the pool's calls block, briefly, once
    per new region."""
    kinds = {e["shm"] for e in entries if e.get("shm")}
    if not kinds:
        return None
    if len(kinds) > 1:
        raise ValueError(f"one shared-memory kind per run, got {sorted(kinds)}")
    import tritonclient.grpc as grpcclient
    from ditserve.shm import OutputRegionPool

    return OutputRegionPool(grpcclient.InferenceServerClient(url), kinds.pop())


# ---- server-side observations ------------------------------------------------------------

def scrape(metrics_url: str) -> dict[tuple[str, str], float]:
    """{(sample name, model label): value} for every sample on /metrics; a histogram bucket's
    name carries its bound, e.g. `ditserve_step_batch_size_bucket{le=2}`."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    samples: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{([^}]*)\}\s+(\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        name = f"{m.group(1)}{{le={labels['le']}}}" if "le" in labels else m.group(1)
        key = (name, labels.get("model", ""))
        samples[key] = samples.get(key, 0.0) + float(m.group(3))
    return samples


def metric_delta(before: dict, after: dict, name: str, model: str) -> float:
    return after.get((name, model), 0.0) - before.get((name, model), 0.0)


def histogram_mean(before: dict, after: dict, name: str, model: str) -> float | None:
    count = metric_delta(before, after, f"{name}_count", model)
    return metric_delta(before, after, f"{name}_sum", model) / count if count > 0 else None


def bucket_counts(before: dict, after: dict, name: str, model: str) -> dict[str, int]:
    """Observations per histogram bucket between two scrapes, {"<= bound": count} (not cumulative)."""
    prefix = f"{name}_bucket{{le="
    bounds = sorted((key[0][len(prefix):-1] for key in after if key[1] == model and key[0].startswith(prefix)),
                    key=float)
    counts, below = {}, 0
    for bound in bounds:
        cumulative = int(metric_delta(before, after, f"{prefix}{bound}}}", model))
        counts[f"<= {bound}"] = cumulative - below
        below = cumulative
    return counts


# Steps dit held back (docs/scheduler.md): for an announced arrival, and queued late (`late_queue_ms`).
HOLD_COUNTERS = {"arrival": "ditserve_step_holds_total", "late": "ditserve_late_queue_holds_total",
                 "late_joins": "ditserve_late_queue_joins_total", "late_overran": "ditserve_late_queue_overran_total",
                 "late_starved": "ditserve_late_queue_starved_total", "overtakes": "ditserve_overtakes_total"}
OUTCOME_COUNTERS = {"completed": "ditserve_requests_completed_total", "cancelled": "ditserve_requests_cancelled_total",
                    "failed": "ditserve_requests_failed_total"}


def where_time_goes(before: dict, after: dict) -> dict:
    """Between two scrapes, per model that executed: its mean compute ms per execution and mean
    queue ms per request (Triton's counters), and dit's mean engine step
    (ditserve_step_duration_seconds) and generations per step (ditserve_step_batch_size): to split a
    request's latency, to find the stage that queues, and to see how full dit ran."""
    out = {}
    for (name, model), value in after.items():
        if name != "nv_inference_exec_count":
            continue
        execs = value - before.get((name, model), 0.0)
        if execs <= 0:
            continue
        busy = metric_delta(before, after, "nv_inference_compute_infer_duration_us", model)
        out[f"{model}_compute_ms_per_exec"] = round(busy / execs / 1000, 2)
        out[f"{model}_execs"] = int(execs)
        requests = metric_delta(before, after, "nv_inference_count", model)
        if requests > 0:
            queued = metric_delta(before, after, "nv_inference_queue_duration_us", model)
            out[f"{model}_queue_ms_per_request"] = round(queued / requests / 1000, 2)
    step = histogram_mean(before, after, "ditserve_step_duration_seconds", "dit")
    out["dit_step_ms"] = None if step is None else round(step * 1000, 2)
    batch = histogram_mean(before, after, "ditserve_step_batch_size", "dit")   # how full dit ran
    out["dit_requests_per_step"] = None if batch is None else round(batch, 2)
    return out


def stage_label(model: str, stage: str) -> str:
    """The `model` label of `stage` (e.g. `dit`) of the pipeline that serves public model `model`:
    `flux_dit` for `flux_txt2img_stream`, `dit` for the single-deployment `txt2img_stream`."""
    pipeline, base = split_model_name(model)
    if base is None:
        raise ValueError(f"{model!r} is not one of our public models (<task>[_stream], or <pipeline>_<task>[_stream])")
    return PipelineNames(pipeline).model(stage)


def wait_server_settled(metrics_url: str, before: dict, expected_total: int, timeout_s: float = 20.0,
                        model: str = MODEL) -> dict:
    """Scrape until the server counted a terminal outcome for every request, or its counts stop moving.

    A request the client cancelled while it waited in Triton's queue may be dropped by Triton
    before our model sees it, so the total can stay below `expected_total`; then we stop once
    the counts have been still for 2 s.
    """
    deadline = time.monotonic() + timeout_s
    last, still_since = None, time.monotonic()
    while True:
        after = scrape(metrics_url)
        total = sum(metric_delta(before, after, n, model) for n in OUTCOME_COUNTERS.values())
        if total >= expected_total or time.monotonic() > deadline:
            return after
        if total != last:
            last, still_since = total, time.monotonic()
        elif time.monotonic() - still_since > 2.0:
            return after
        time.sleep(0.2)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def server_summary(before: dict, after: dict, model: str = MODEL) -> dict:
    """The server's view of the requests sent to public model `model` between two scrapes."""
    dit = stage_label(model, "dit")
    out = {f"server_{k}": int(metric_delta(before, after, n, model)) for k, n in OUTCOME_COUNTERS.items()}
    out["server_mean_ttfs_ms"] = _ms(histogram_mean(before, after, "ditserve_time_to_first_step_seconds", model))
    out["stage_mean_ms"] = {stage: _ms(histogram_mean(before, after, f"ditserve_{stage}_duration_seconds", model))
                            for stage in ("encode", "denoise", "decode")}
    batch = histogram_mean(before, after, "ditserve_step_batch_size", dit)
    out["mean_step_batch_size"] = None if batch is None else round(batch, 3)
    out["step_batches"] = int(metric_delta(before, after, "ditserve_step_batch_size_count", dit))
    out["step_batch_size_histogram"] = bucket_counts(before, after, "ditserve_step_batch_size", dit)
    out["mean_step_duration_ms"] = _ms(histogram_mean(before, after, "ditserve_step_duration_seconds", dit))
    # the device time of first steps' forwards that overtook a running step ([engine] overtake); None without one
    out["mean_overtake_forward_ms"] = _ms(histogram_mean(before, after, "ditserve_overtake_forward_seconds", dit))
    out["ttfs_split_ms"] = ttfs_split(before, after, model, out["server_mean_ttfs_ms"], out["stage_mean_ms"]["encode"])
    out["dit_holds"] = {name: int(metric_delta(before, after, counter, dit)) for name, counter in HOLD_COUNTERS.items()}
    return out


def ttfs_split(before: dict, after: dict, model: str, ttfs_ms: float | None, encode_ms: float | None) -> dict:
    """The server's mean time to first step in its parts (ms): `encode` (the public model's call to
    text_encoder, of which text_encoder's Triton queue and compute per request), `admission_wait`
    (conditioning handed over -> dit admits it: the BLS hop, dit's queue, the running step),
    `admission`, and `first_step_and_rest` (what remains: the first step and the progress hop)."""
    dit, encoder = stage_label(model, "dit"), stage_label(model, "text_encoder")
    split = {"encode": encode_ms}
    triton = where_time_goes(before, after)   # Triton's own counters, per model
    if f"{encoder}_queue_ms_per_request" in triton:
        split["text_encoder_queue"] = triton[f"{encoder}_queue_ms_per_request"]
        split["text_encoder_compute_per_exec"] = triton[f"{encoder}_compute_ms_per_exec"]
    for part, name in (("admission_wait", "ditserve_admission_wait_seconds"),
                       ("admission", "ditserve_admission_duration_seconds")):
        split[part] = _ms(histogram_mean(before, after, name, dit))
    parts = [split[p] for p in ("encode", "admission_wait", "admission")]
    split["first_step_and_rest"] = None if ttfs_ms is None or None in parts else round(ttfs_ms - sum(parts), 3)
    return split


class Sampler:
    """Background sampling of the server's RSS (pid tree) and of GPU memory (nvidia-smi)."""

    def __init__(self, server_pid: int | None, interval_s: float = 0.25):
        self.server_pid = server_pid
        self.interval_s = interval_s
        self.gpu_enabled = True            # until nvidia-smi is found missing or failing
        self.rss: list[tuple[int, int]] = []
        self.gpu: list[list[float]] = []
        self.gpu_names: list[str] = []
        self.gpu_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        if self.server_pid:
            pids = resources.process_tree(self.server_pid)
            self.rss.append((sum(resources.rss_kb(p) for p in pids), len(pids)))
        if self.gpu_enabled:
            try:
                self.gpu_names, used = resources.gpu_memory_mb()
                self.gpu.append(used)
            except RuntimeError as exc:  # optional measurement, never fatal
                self.gpu_error, self.gpu_enabled = str(exc), False

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "Sampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def summary(self) -> dict:
        out: dict = {}
        if self.server_pid:
            rss = [kb for kb, _ in self.rss if kb > 0]
            out.update(server_pid=self.server_pid,
                       server_processes=max((n for _, n in self.rss), default=0),
                       server_rss_mb_start=round(rss[0] / 1024, 1) if rss else None,
                       server_rss_mb_peak=round(max(rss) / 1024, 1) if rss else None,
                       server_rss_mb_end=round(rss[-1] / 1024, 1) if rss else None)
        if self.gpu:
            out.update(gpu_names=self.gpu_names,
                       gpu_memory_used_mb_start=[round(v) for v in self.gpu[0]],
                       gpu_memory_used_mb_peak=[round(max(s[i] for s in self.gpu)) for i in range(len(self.gpu[0]))],
                       gpu_memory_used_mb_peak_total=round(max(sum(s) for s in self.gpu)))
        else:
            out["gpu_memory_used_mb_peak"] = None
            out["gpu_memory_note"] = self.gpu_error
        return out


# ---- statistics ---------------------------------------------------------------------------

def _stats_ms(values_s: list[float], prefix: str) -> dict:
    """vLLM-style mean/median/std/p50/p95/p99 in ms; None when there are no values."""
    keys = ("mean", "median", "std", "p50", "p95", "p99")
    if not values_s:
        return {f"{k}_{prefix}_ms": None for k in keys}
    a = np.asarray(values_s, dtype=float) * 1000.0
    vals = (a.mean(), np.median(a), a.std(), *np.percentile(a, [50, 95, 99]))
    return {f"{k}_{prefix}_ms": round(float(v), 3) for k, v in zip(keys, vals)}


def _offered(entries: list[dict], speedup: float = 1.0) -> float | None:
    """(n - 1) / (last arrival - first arrival): the trace's mean arrival rate."""
    t = sorted(float(e.get("t", 0.0)) / speedup for e in entries)
    return round((len(t) - 1) / (t[-1] - t[0]), 4) if len(t) > 1 and t[-1] > t[0] else None


def outcome_problem(rec: Record) -> str | None:
    """Why the request's one terminal outcome is not the one it should have had, or None.

    A request with `expect_error` must fail with an error matching it; any other must complete,
    or end cancelled after our own cancel (a cancel that arrives late lets it complete)."""
    if rec.terminals != 1:
        return f"{rec.terminals} terminal responses ({rec.outcome}: {rec.error})"
    if rec.expect_error:
        if rec.outcome != "failed" or not re.search(rec.expect_error, rec.error or ""):
            return f"expected an error matching {rec.expect_error!r}, got {rec.outcome}: {rec.error}"
        return None
    if rec.outcome == "completed" or (rec.outcome == "cancelled" and rec.cancel_sent):
        return None
    return f"got {rec.outcome}: {rec.error}"


def summarize(entries: list[dict], records: list[Record], duration_s: float, solo_ms: dict[str, float],
              slo_scale: float, speedup: float = 1.0) -> dict:
    by = {k: [r for r in records if r.outcome == k] for k in ("completed", "failed", "cancelled", "lost")}
    completed = by["completed"]
    e2el = [r.e2el_s for r in completed]
    ttfs = [r.ttfs_s for r in completed if r.ttfs_s is not None]
    out: dict = {
        "total_requests": len(records),
        "completed_requests": len(completed),
        "failed_requests": len(by["failed"]),
        "cancelled_requests": len(by["cancelled"]),
        "lost": sum(1 for r in records if r.terminals == 0),
        "duplicated": sum(1 for r in records if r.terminals > 1),
        "responses_after_terminal": sum(r.after_terminal for r in records),
        "cancels_requested": sum(1 for r in records if r.cancel_after_s is not None),
        "cancels_too_late": sum(1 for r in records if r.cancel_too_late),
        "expected_failures": sum(1 for r in records if r.expect_error and outcome_problem(r) is None),
        "unexpected_outcomes": sum(1 for r in records if outcome_problem(r) is not None),
        "duration": round(duration_s, 4),
        "offered_request_rate": _offered(entries, speedup),
        "request_throughput": round(len(completed) / duration_s, 4) if duration_s > 0 else None,
    }
    out["throughput_qps"] = out["request_throughput"]  # vLLM-Omni's name for the same number
    if e2el:
        a = np.asarray(e2el)
        out.update(latency_mean=round(float(a.mean()), 5), latency_median=round(float(np.median(a)), 5),
                   latency_p50=round(float(np.percentile(a, 50)), 5), latency_p99=round(float(np.percentile(a, 99)), 5))
    else:
        out.update(latency_mean=None, latency_median=None, latency_p50=None, latency_p99=None)
    out.update(_stats_ms(e2el, "e2el"))
    out.update(_stats_ms(ttfs, "ttfs"))
    steps_done = [r.progress for r in completed]
    out["mean_progress_responses"] = round(float(np.mean(steps_done)), 3) if steps_done else None
    # SLO: a request meets it when it completes within slo_scale x the solo latency of its
    # shape. Requests the client cancelled wanted no result and are left out; failed and
    # lost ones count as misses (as in vLLM-Omni, where the denominator is every request
    # with an SLO).
    if solo_ms and slo_scale > 0:
        eligible = [r for r in records if r.outcome != "cancelled" and not r.expect_error and r.shape in solo_ms]
        met = [r for r in eligible if r.outcome == "completed" and r.e2el_s * 1000.0 <= slo_scale * solo_ms[r.shape]]
        out.update(slo_scale=slo_scale, slo_defined_total=len(eligible), slo_met_success=len(met),
                   slo_attainment_rate=round(len(met) / len(eligible), 4) if eligible else None)
        per_shape = {}
        for shape in sorted({r.shape for r in completed}):
            lat = [r.e2el_s * 1000.0 for r in completed if r.shape == shape]
            per_shape[shape] = {"n": len(lat), "solo_ms": solo_ms.get(shape), "median_e2el_ms": round(float(np.median(lat)), 3),
                                "median_slowdown": round(float(np.median(lat)) / solo_ms[shape], 3) if solo_ms.get(shape) else None}
        out["per_shape"] = per_shape
    else:
        out.update(slo_scale=slo_scale, slo_defined_total=0, slo_met_success=0, slo_attainment_rate=None)
    errors: dict[str, int] = {}
    for r in by["failed"] + by["lost"]:
        errors[r.error or "?"] = errors.get(r.error or "?", 0) + 1
    out["errors"] = errors
    return out


# ---- the whole run -------------------------------------------------------------------------

@dataclass
class LoadgenConfig:
    url: str
    entries: list                       # the trace (already loaded or generated)
    source: str = ""                    # where the entries came from, for the report
    metrics_url: str | None = None
    max_concurrency: int | None = None
    warmup: int = 2
    slo_scale: float = 3.0
    solo_repeats: int = 3
    measure_solo: bool = True
    known_solo_ms: dict | None = None   # shape -> solo latency measured earlier on this server: not measured again
    server_pid: int | None = None
    timeout_s: float = 600.0
    speedup: float = 1.0
    replays: int = 1                    # the measured run is the trace replayed this many times, pooled
    model: str = MODEL
    per_request: bool = False
    verbose: bool = True


def _log(cfg: LoadgenConfig, msg: str) -> None:
    if cfg.verbose:
        print(f"[loadgen] {msg}", file=sys.stderr, flush=True)


async def run(cfg: LoadgenConfig) -> dict:
    """Warm-up, solo latencies per shape, then the measured run; returns the report."""
    entries = [dict(e) for e in cfg.entries]
    if not entries:
        raise ValueError("no requests to send")
    report: dict = {"model": cfg.model, "url": cfg.url, "source": cfg.source, "num_requests": len(entries),
                    "warmup": cfg.warmup, "max_concurrency": cfg.max_concurrency, "speedup": cfg.speedup,
                    "request_timeout_s": cfg.timeout_s}

    # Warm-up and solo runs use plain streamed requests: no cancels, no requests meant to fail.
    plain = [{k: v for k, v in e.items() if k not in ("t", "cancel_after_s", "unary")}
             for e in entries if not e.get("expect_error")] or [{"prompt": DEFAULT_PROMPTS[0]}]
    if cfg.warmup > 0:
        warm = [{**plain[i % len(plain)], "t": 0.0} for i in range(cfg.warmup)]
        _log(cfg, f"warm-up: {len(warm)} requests at once (excluded)")
        recs, _ = await run_entries(cfg.url, warm, cfg.max_concurrency, cfg.timeout_s, model=cfg.model)
        report["warmup_outcomes"] = {k: sum(1 for r in recs if r.outcome == k) for k in ("completed", "failed", "lost")}
        if not report["warmup_outcomes"]["completed"]:
            raise RuntimeError(f"every warm-up request failed; is the server healthy? first error: {recs[0].error}")

    solo: dict[str, float] = {}
    if cfg.measure_solo and cfg.slo_scale > 0:
        # Shapes that only cancelled (or failing) requests have need no solo run: those have no SLO.
        shapes: dict[str, dict] = {}
        for e in entries:
            if e.get("cancel_after_s") is None and not e.get("expect_error"):
                shapes.setdefault(shape_key(e), {k: v for k, v in e.items() if k not in ("t", "unary")})
        known = {k: v for k, v in (cfg.known_solo_ms or {}).items() if k in shapes}
        shapes = {k: v for k, v in shapes.items() if k not in known}
        if known:
            _log(cfg, f"solo latency: {len(known)} shape(s) known from an earlier run on this server (not measured again)")
        if shapes:
            _log(cfg, f"solo latency: {len(shapes)} shape(s) x {cfg.solo_repeats}, one request at a time (excluded)")
        solo_raw: dict[str, list[float]] = {}
        # The server's view of the solo requests (stage and step times): where a lone request's
        # time goes, to compare modes whose solo latencies differ.
        solo_before = scrape(cfg.metrics_url) if cfg.metrics_url and shapes else None
        for _ in range(max(1, cfg.solo_repeats) if shapes else 0):
            for key, entry in shapes.items():
                (rec,), _ = await run_entries(cfg.url, [{**entry, "t": 0.0}], None, cfg.timeout_s, model=cfg.model)
                if rec.outcome == "completed":
                    solo_raw.setdefault(key, []).append(rec.e2el_s * 1000.0)
        solo = {**known, **{k: round(float(np.median(v)), 3) for k, v in solo_raw.items()}}
        report["solo_latency_ms"] = solo
        report["solo_repeats"] = cfg.solo_repeats
        report["solo_known_shapes"] = sorted(known)
        if solo_before is not None:
            report["solo_server"] = server_summary(solo_before, scrape(cfg.metrics_url), cfg.model)

    before = scrape(cfg.metrics_url) if cfg.metrics_url else None
    records: list[Record] = []
    duration = 0.0
    replays = []
    with Sampler(cfg.server_pid) as sampler:
        for k in range(max(1, cfg.replays)):
            label = f"measured run {k + 1}/{cfg.replays}" if cfg.replays > 1 else "measured run"
            _log(cfg, f"{label}: {len(entries)} requests ({cfg.source})")
            recs, _ = await run_entries(cfg.url, entries, cfg.max_concurrency, cfg.timeout_s, cfg.speedup, cfg.model,
                                        progress_label=label if cfg.verbose else "")
            first_send = min(r.send_s for r in recs if r.send_s is not None)
            last_end = max(r.end_s for r in recs if r.end_s is not None)
            one = summarize(entries, recs, last_end - first_send, solo, cfg.slo_scale, cfg.speedup)
            replays.append({key: one[key] for key in ("completed_requests", "cancelled_requests", "failed_requests", "lost",
                                                "duplicated", "duration", "request_throughput", "p50_e2el_ms",
                                                "p99_e2el_ms", "p50_ttfs_ms", "slo_attainment_rate")})
            for r in recs:
                r.index += k * len(entries)
            records += recs
            duration += last_end - first_send
            if k + 1 < cfg.replays and cfg.metrics_url:
                wait_server_settled(cfg.metrics_url, before, len(records), model=cfg.model)  # drain before replaying
    # Pooled over replays: latency percentiles over all their requests, throughput = all
    # completions / the sum of the replays' durations (drain time between them excluded).
    report.update(summarize(entries, records, duration, solo, cfg.slo_scale, cfg.speedup))
    report["replays"] = cfg.replays
    if cfg.replays > 1:
        report["per_replay"] = replays
    if before is not None:
        after = wait_server_settled(cfg.metrics_url, before, len(records), model=cfg.model)
        server = server_summary(before, after, cfg.model)
        report.update(server)
        # The server must have counted every completion the client saw, and never more
        # terminal outcomes than there were requests (a duplicate would show up here).
        srv_total = server["server_completed"] + server["server_cancelled"] + server["server_failed"]
        report["server_counts_consistent"] = bool(server["server_completed"] >= report["completed_requests"]
                                                  and srv_total <= len(records))
    report.update(sampler.summary())
    # Each request's latencies in trace order (replays after one another; None: not completed), so
    # that two modes' runs of one trace compare request by request (perf/scheduler_summary.py).
    ordered = sorted(records, key=lambda r: r.index)
    report["e2el_ms_by_request"] = [round(r.e2el_s * 1000, 3) if r.outcome == "completed" and r.e2el_s is not None
                                    else None for r in ordered]
    report["ttfs_ms_by_request"] = [round(r.ttfs_s * 1000, 3) if r.outcome == "completed" and r.ttfs_s is not None
                                    else None for r in ordered]
    if cfg.per_request:
        report["requests"] = [{**asdict(r), "e2el_ms": None if r.e2el_s is None else round(r.e2el_s * 1000, 3),
                               "ttfs_ms": None if r.ttfs_s is None else round(r.ttfs_s * 1000, 3)} for r in records]
    return report


def format_summary(r: dict) -> str:
    f = lambda v, d=1: "n/a" if v is None else f"{v:.{d}f}"  # noqa: E731
    lines = [
        f"requests {r['total_requests']}: completed {r['completed_requests']}, cancelled {r['cancelled_requests']}, "
        f"failed {r['failed_requests']}; lost {r['lost']}, duplicated {r['duplicated']}",
        f"offered {f(r['offered_request_rate'], 2)} req/s, achieved {f(r['request_throughput'], 2)} req/s over {f(r['duration'], 2)} s",
        f"e2el ms: mean {f(r['mean_e2el_ms'])} p50 {f(r['p50_e2el_ms'])} p95 {f(r['p95_e2el_ms'])} p99 {f(r['p99_e2el_ms'])}",
        f"ttfs ms: mean {f(r['mean_ttfs_ms'])} p50 {f(r['p50_ttfs_ms'])} p99 {f(r['p99_ttfs_ms'])}",
        f"SLO ({r.get('slo_scale')}x solo): {f(r.get('slo_attainment_rate') and 100 * r['slo_attainment_rate'])}% "
        f"({r.get('slo_met_success')}/{r.get('slo_defined_total')})",
    ]
    if "mean_step_batch_size" in r:
        lines.append(f"server: mean step batch {f(r['mean_step_batch_size'], 2)}, stages ms {r['stage_mean_ms']}, "
                     f"ttfs {f(r['server_mean_ttfs_ms'])} ms = {r.get('ttfs_split_ms')}")
    if "solo_server" in r:
        solo = r["solo_server"]
        lines.append(f"server, solo requests: stages ms {solo['stage_mean_ms']}, mean step "
                     f"{f(solo['mean_step_duration_ms'])} ms over {solo['step_batches']} forwards")
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC endpoint (default 127.0.0.1:8001)")
    p.add_argument("--metrics-url", default=None, help="Prometheus endpoint, e.g. http://127.0.0.1:8002/metrics "
                                                        "(server-side stage times and step batch size; skipped if unset)")
    p.add_argument("--model", default=MODEL, help=f"public model to send to (default {MODEL})")
    p.add_argument("--pipeline", help="a named pipeline of the repository (docs/pipelines.md): --model gets its "
                                      "prefix, e.g. --pipeline flux sends to flux_txt2img_stream")
    src = p.add_argument_group("arrivals (one of --trace or --rate)")
    src.add_argument("--trace", help="JSONL trace to replay (perf/traces/<name>.jsonl)")
    src.add_argument("--rate", type=float, help="Poisson arrival rate, requests/s (a trace is drawn from the spec below)")
    src.add_argument("--num-requests", type=int, default=None, help="requests to draw (default 100) or to keep from --trace")
    src.add_argument("--sizes", default="64", help="'64,96,128' square or 'HxW,...' (default 64)")
    src.add_argument("--steps", default="10", help="'10,20,30' (choose one) or '10-30' (uniform) (default 10)")
    src.add_argument("--guidance", default="4.5", help="comma-separated guidance scales (default 4.5)")
    src.add_argument("--prompts-file", help="one prompt per line (default: a built-in list of 8)")
    src.add_argument("--seed", type=int, default=0, help="seed of the drawn trace and of --cancel-rate (default 0)")
    src.add_argument("--cancel-rate", type=float, default=0.0,
                     help="fraction of requests the client cancels after a random delay (drawn into a generated trace; "
                          "added to a replayed trace's entries that have no cancel_after_s)")
    src.add_argument("--cancel-delay", default="0.05:0.5", help="cancel delay range in s, A:B (default 0.05:0.5)")
    src.add_argument("--cancel-by", choices=CANCEL_BY, default=None,
                     help="how the client cancels: its gRPC call (stream) or the request id through the `cancel` model "
                          "(id); set on every cancelled entry (default: a replayed trace's own, else stream)")
    src.add_argument("--speedup", type=float, default=1.0, help="divide every arrival offset by this (default 1)")
    src.add_argument("--make-trace", metavar="OUT", help="write the drawn trace (needs --rate) to OUT and exit")
    run_g = p.add_argument_group("run")
    run_g.add_argument("--max-concurrency", type=int, default=None, help="in-flight cap (default: none, open loop)")
    run_g.add_argument("--replays", type=int, default=1,
                       help="replay the trace this many times back to back and pool the statistics (default 1)")
    run_g.add_argument("--warmup", type=int, default=2, help="warm-up requests before measuring, excluded (default 2)")
    run_g.add_argument("--slo-scale", type=float, default=3.0, help="SLO = this x the shape's solo latency (default 3, "
                                                                     "vLLM-Omni's default); 0 skips solo runs and SLO")
    run_g.add_argument("--solo-repeats", type=int, default=3, help="solo runs per distinct shape, median kept (default 3)")
    run_g.add_argument("--request-timeout", type=float, default=600.0, help="per-request deadline, s (default 600)")
    run_g.add_argument("--server-pid", type=int, default=None, help="tritonserver pid: sample RSS of it and its stubs")
    run_g.add_argument("--per-request", action="store_true", help="include every request's record in the report")
    run_g.add_argument("--out", help="also write the report JSON here")
    run_g.add_argument("--quiet", action="store_true")
    return p


def entries_from_args(args) -> tuple[list[dict], str]:
    entries, source = _drawn_or_replayed(args)
    if args.cancel_by:
        entries = [{**e, "cancel_by": args.cancel_by} if "cancel_after_s" in e else e for e in entries]
        source += f", cancelled by {args.cancel_by}"
    return entries, source


def _drawn_or_replayed(args) -> tuple[list[dict], str]:
    if args.trace:
        entries = load_trace(args.trace)
        if args.num_requests:
            entries = entries[: args.num_requests]
        source = f"trace {args.trace}"
        if args.cancel_rate > 0:
            entries = add_cancellations(entries, args.cancel_rate, parse_range(args.cancel_delay), args.seed)
            source += f" + cancel-rate {args.cancel_rate} (seed {args.seed})"
        return entries, source
    if args.rate is None:
        raise SystemExit("give --trace FILE or --rate R")
    prompts = tuple(l.strip() for l in Path(args.prompts_file).read_text().splitlines() if l.strip()) \
        if args.prompts_file else DEFAULT_PROMPTS
    spec = WorkloadSpec(rate=args.rate, num_requests=args.num_requests or 100, sizes=parse_sizes(args.sizes),
                        steps=parse_steps(args.steps), guidance_scales=[float(g) for g in args.guidance.split(",")],
                        cancel_rate=args.cancel_rate, cancel_delay_s=parse_range(args.cancel_delay), seed=args.seed,
                        prompts=prompts)
    source = (f"poisson rate={args.rate} n={spec.num_requests} sizes={args.sizes} steps={args.steps} "
              f"guidance={args.guidance} cancel-rate={args.cancel_rate} seed={args.seed}")
    return make_trace(spec), source


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.model = PipelineNames(args.pipeline).model(args.model)
        stage_label(args.model, "dit")
    except ValueError as exc:
        parser.error(str(exc))
    entries, source = entries_from_args(args)
    if args.make_trace:
        if args.trace:
            raise SystemExit("--make-trace draws a new trace: use it with --rate, not --trace")
        write_trace(entries, args.make_trace)
        print(f"wrote {len(entries)} requests to {args.make_trace} ({source})", file=sys.stderr)
        return 0
    cfg = LoadgenConfig(url=args.url, entries=entries, source=source, metrics_url=args.metrics_url,
                        max_concurrency=args.max_concurrency, warmup=args.warmup, slo_scale=args.slo_scale,
                        solo_repeats=args.solo_repeats, measure_solo=args.slo_scale > 0, server_pid=args.server_pid,
                        timeout_s=args.request_timeout, speedup=args.speedup, replays=args.replays, model=args.model,
                        per_request=args.per_request, verbose=not args.quiet)
    report = asyncio.run(run(cfg))
    report["command"] = " ".join(["python", "perf/loadgen.py", *(argv if argv is not None else sys.argv[1:])])
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    if not args.quiet:
        print(format_summary(report), file=sys.stderr)
    return 0 if report["lost"] == 0 and report["duplicated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
