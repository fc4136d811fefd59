#!/usr/bin/env python
"""Soak: Poisson load below, near and above saturation, with cancels, bad requests and
injected faults; checks that every request ends exactly once and that nothing leaks.

    # CPU dry run, tiny deployment (perf/results/2026-12-01-cpu-soak-dry-run.md)
    python perf/soak.py --deployment configs/tiny-pixart-sigma.toml --sizes 32,64,96,64x32 --steps 2-8 \\
        --guidance 1.0,4.5 --target-requests 500 --budget-seconds 240 --out outputs/soak-cpu
    # GPU host, full-size random-weight PixArt-Sigma with the real config's acceleration, 10,000
    # requests in one device call: `bash perf/gpu_recipe.sh soak` (its `soak` stage)

One run:
 1. writes OUT/deployment.toml: the deployment plus a [faults] section (FAULTS below) whose
    rules fire only on prompts carrying their marker, renders a model repository for it
    (scripts/render_repository.py) and starts tritonserver on it (ditserve.launcher);
 2. warm-up: two rounds of `capacity` concurrent requests, streamed, unary and into shared
    memory in turn (what the phases' clients use); the second round's median
    latency L sets the default cancel delay (uniform in 0.1 L .. 0.9 L after sending);
 3. saturation: --saturation-rps R, or measured by a closed loop of --saturation-concurrency
    (default 2 x capacity, so the engine never waits for work) streamed requests, each client
    sending its next request when the last one ended, for --saturation-seconds:
    R = completed / (last end - first send);
 4. one phase per fraction F of --phases: Poisson arrivals at F x R for --phase-seconds (W times
    that for an item written FxW, e.g. 0.8x2: a longer steady last phase for the slope fit)
    (perf/loadgen.py, one gRPC stream per request), then a drain until the server has
    counted every request and its state table is empty. Of each phase's requests
    --cancel-rate are cancelled by the client mid-generation, --bad-rate are bad inputs (half
    unary, which must fail with INVALID_ARGUMENT, half streamed, whose error carries no
    status code and must name the input) and --fault-rate carry a fault marker (one error
    naming the stage, or an image for the stall fault), at least one bad and one fault per
    phase; --unary-share of the others go to the non-streaming model and --shm-share to it with
    the image into a shared-memory region (CUDA where the server has a GPU, system otherwise).
    With --target-requests the phases are sized to send that many at the measured saturation,
    within --budget-seconds;
 5. a sampler thread reads, every --sample-interval s, the RSS of tritonserver and its stubs,
    GPU memory (nvidia-smi; null without one), open fds, /dev/shm bytes the server maps
    (perf/resources.py), the dit state table, and readiness.

The ledger: every request must end with exactly one terminal outcome on the client, of the
kind it should have (image, the expected error, or our cancel; a cancel that crosses the
final response in flight may leave the image: `loadgen.outcome_problem`), and the server's
outcome counters must agree (one server terminal per request at most, failures only where
the client saw them). Slopes per minute of every resource figure are reported per phase and
overall, after dropping the first --warmup-share of each span, and at idle after each drain.

Pass criteria (`criteria` in soak.json, each true/false): every request exactly one outcome of
the right kind; the server's counters agree with the client's; no stub died; the state table
0 after every phase; the slope of tritonserver's and each stub's RSS, GPU memory, open fds and
/dev/shm at most --max-slope per minute over the last --slope-phases phases (the fit and its
samples are in the JSON, the plot in soak.png); a clean shutdown (no exit-timeout wait, no fatal
line); with --target-requests, at least that many requests.

Writes OUT/soak.json, OUT/soak.md, OUT/soak.png, OUT/deployment.toml and OUT/server.log. Exit
status 0 when every criterion held; 1 otherwise; 130 when interrupted (SIGINT/SIGTERM: the
partial report is still written).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "perf"))

import resources  # noqa: E402
from machine import fence, machine_info, machine_label, server_version  # noqa: E402
from matched_control import loadgen, render_repository  # noqa: E402

from ditserve.deployment import Deployment, load_deployment  # noqa: E402  (matched_control put backends/ on the path)
from ditserve.launcher import ServerOptions, TritonServer, free_ports, malloc_choice, malloc_library  # noqa: E402

STATE_TABLE = ("ditserve_state_table_size", "dit")
COUNTERS = {"completed": "ditserve_requests_completed_total", "failed": "ditserve_requests_failed_total",
            "cancelled": "ditserve_requests_cancelled_total"}
# name -> (rule of the [faults] section, regex the one error must match; None = must complete).
# Prompt markers keep every rule off for untagged requests; a raise in a batched call is
# retried one request at a time by the stages, so only the tagged request may fail.
FAULTS: dict[str, tuple[dict, str | None]] = {
    "encode-raise": ({"point": "encode", "action": "raise"}, r"^text_encoder: .*InjectedFault"),
    "denoise-raise": ({"point": "denoise", "action": "raise"}, r"^dit: denoise step \d+/\d+ failed in the transformer"),
    "scheduler-nan": ({"point": "scheduler_step", "action": "nan", "step": 1}, r"^dit: .*non-finite latents"),
    "output-raise": ({"point": "output", "action": "raise"}, r"^output: could not build the final response"),
    "encode-stall": ({"point": "encode", "action": "sleep", "seconds": 0.3}, None),
}


def marker(fault: str) -> str:
    return f"#soak-{fault}"


# ---- deployment and server -----------------------------------------------------------------

def _toml_inline(table: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"


def section(text: str, name: str) -> str:
    """The `[name]` table of a deployment file (header to the next table), or ""."""
    match = re.search(rf"^\[{name}\][^\n]*\n(?:(?!^\[).*\n?)*", text, flags=re.M)
    return match.group(0) if match else ""


def with_accel(text: str, accel_from: Path, warm_sizes: str | None) -> str:
    """`text` with its [accel] table replaced by the one of `accel_from` (e.g. the real checkpoint's
    config: the acceleration a GPU deployment runs), its warm_sizes set to `warm_sizes` ("512x512,...")."""
    accel = section(accel_from.read_text(), "accel")
    if not accel:
        raise SystemExit(f"{accel_from} has no [accel] section")
    if warm_sizes:
        sizes = ", ".join(json.dumps(v.strip()) for v in warm_sizes.split(",") if v.strip())
        accel = re.sub(r"^warm_sizes\s*=.*$", f"warm_sizes = [{sizes}]", accel, flags=re.M)
    accel = f"# [accel] from {accel_from.name} (perf/soak.py --accel-from)\n{accel.rstrip()}\n"
    own = section(text, "accel")
    return text.replace(own, "") + "\n" + accel if own else text.rstrip() + "\n\n" + accel


def write_fault_deployment(base: Path, out: Path, accel_from: Path | None = None,
                           warm_sizes: str | None = None) -> Deployment:
    """The base deployment with a [faults] section of FAULTS appended (and, with `accel_from`,
    another deployment's [accel]), checked by the server's loader."""
    text = base.read_text()
    if accel_from is not None:
        text = with_accel(text, accel_from, warm_sizes)
    if re.search(r"^\[faults", text, flags=re.M):
        raise SystemExit(f"{base} already has a [faults] section; soak adds its own")
    rules = ",\n".join(f"  {_toml_inline({**rule, 'marker': marker(name)})}" for name, (rule, _) in FAULTS.items())
    out.write_text(f"# {base.name} + fault rules for tagged prompts only (written by perf/soak.py)\n{text.rstrip()}\n\n"
                   f"[faults]\nrules = [\n{rules},\n]\n")
    return load_deployment(out)


def bad_variants(dep: Deployment) -> list[tuple[dict, str]]:
    """(fields that make a request invalid under this deployment's limits, the input the error names)."""
    lim = dep.limits
    return [({"height": dep.defaults.height + lim.size_multiple // 2}, "height"),   # not a multiple
            ({"width": lim.max_size + lim.size_multiple}, "width"),                   # too large
            ({"num_inference_steps": 0}, "num_inference_steps"),
            ({"guidance_scale": -1.0}, "guidance_scale"),
            ({"prompt": "   "}, "prompt")]


def server_ready(server: TritonServer) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def server_counts(before: dict, after: dict, task: str) -> dict[str, int]:
    """Terminal outcomes the public models (unary and streaming) counted between two scrapes."""
    return {k: int(sum(after.get((name, m), 0.0) - before.get((name, m), 0.0) for m in (task, f"{task}_stream")))
            for k, name in COUNTERS.items()}


def settle(metrics_url: str, before: dict, n: int, task: str, timeout_s: float) -> dict:
    """Scrape until the server counted all `n` requests and holds no state, or nothing moved for 3 s
    with the table empty (a request cancelled while queued in Triton is never counted), or timeout."""
    deadline = time.monotonic() + timeout_s
    last, still_since = None, time.monotonic()
    while True:
        after = loadgen.scrape(metrics_url)
        counts, table = server_counts(before, after, task), after.get(STATE_TABLE, 0.0)
        if (sum(counts.values()) >= n and table == 0) or time.monotonic() > deadline:
            return after
        if (counts, table) != last:
            last, still_since = (counts, table), time.monotonic()
        elif table == 0 and time.monotonic() - still_since > 3.0:
            return after
        time.sleep(0.25)


class Monitor(threading.Thread):
    """Samples the server's resources and readiness every `interval_s`, labelled with the current phase."""

    def __init__(self, server: TritonServer, interval_s: float, gpu: bool):
        super().__init__(daemon=True)
        self.server, self.interval_s, self.gpu = server, interval_s, gpu
        self.phase = "start"
        self.samples: list[dict] = []
        self._stop_event = threading.Event()

    def take(self) -> dict:
        s = resources.sample(self.server.process.pid, lambda: loadgen.scrape(self.server.metrics_url).get(STATE_TABLE, 0.0),
                             gpu=self.gpu)
        s.update(phase=self.phase, ready=server_ready(self.server))
        self.samples.append(s)
        return s

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.take()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()


# ---- load --------------------------------------------------------------------------------

class Workload:
    """Draws the soak's requests: shapes from the options, kinds (ok, cancel, bad, fault) by share."""

    def __init__(self, args, dep: Deployment):
        self.args = args
        self.sizes = loadgen.parse_sizes(args.sizes)
        self.steps = loadgen.parse_steps(args.steps)
        self.guidance = [float(g) for g in args.guidance.split(",")]
        self.bad = bad_variants(dep)
        self.cancel_delay: tuple[float, float] = (0.05, 0.5)   # replaced after the warm-up
        self.shm_kind = "system"   # "cuda" where the server has a GPU (set by Soak)
        self.drawn = Counter()   # bad and fault requests so far: each phase goes on where the last one stopped

    def plain(self, n: int, rate: float, seed: int) -> list[dict]:
        spec = loadgen.WorkloadSpec(rate=rate, num_requests=n, sizes=self.sizes, steps=self.steps,
                                    guidance_scales=self.guidance, seed=seed)
        return [{**e, "kind": "ok"} for e in loadgen.make_trace(spec)]

    def every_client(self, entries: list[dict]) -> list[dict]:
        """`entries` sent by each kind of client in turn (stream, unary, unary into shared memory,
        as far as the shares use them), so that a warm-up also warms the server's unary and
        shared-memory paths: on the H200, tritonserver grew ~100 MB in the first seconds those
        paths ran, inside the first load phase (perf/results/2026-12-02-h200-soak-run7-8.md)."""
        clients = ["stream"] + ["unary"] * (self.args.unary_share > 0) + ["shm"] * (self.args.shm_share > 0)
        for i, e in enumerate(entries):
            client = clients[i % len(clients)]
            e.update(client=client, **({"unary": True} if client != "stream" else {}),
                     **({"shm": self.shm_kind} if client == "shm" else {}))
        return entries

    def phase(self, rate: float, seconds: float, seed: int) -> list[dict]:
        """Poisson arrivals at `rate` for about `seconds`, each request marked with its kind.

        Shares are exact, not drawn per request, and at least one bad and one fault-tagged
        request is in every phase (when their rates are > 0), so that a short or slow phase
        still covers them; bad variants and fault rules are taken in turn across phases."""
        a = self.args
        entries = self.plain(max(2, round(rate * seconds)), rate, seed)
        rng = random.Random(f"soak-kinds-{seed}")
        n = len(entries)
        share = lambda rate: max(1, round(n * rate)) if rate > 0 else 0  # noqa: E731
        n_bad, n_fault, n_cancel = share(a.bad_rate), share(a.fault_rate), round(n * a.cancel_rate)
        for j, i in enumerate(rng.sample(range(n), n)):
            e = entries[i]
            if j < n_bad:
                k = self.drawn["bad"]
                fields, name = self.bad[k % len(self.bad)]
                e.update(fields, kind="bad", unary=k % 2 == 0)
                status = r"\[StatusCode\.INVALID_ARGUMENT\] " if e["unary"] else ""   # a stream's error has none
                e["expect_error"] = rf"^{status}input '{name}'"
                self.drawn["bad"] += 1
            elif j < n_bad + n_fault:
                fault = list(FAULTS)[self.drawn["fault"] % len(FAULTS)]
                e.update(prompt=f"{e['prompt']} {marker(fault)}", kind=f"fault:{fault}")
                if FAULTS[fault][1]:
                    e["expect_error"] = FAULTS[fault][1]
                self.drawn["fault"] += 1
            elif j < n_bad + n_fault + n_cancel:
                e.update(kind="cancel", cancel_after_s=round(rng.uniform(*self.cancel_delay), 3), cancel_by=a.cancel_by)
            else:
                draw = rng.random()
                if draw < a.shm_share:
                    e.update(unary=True, shm=self.shm_kind)
                elif draw < a.shm_share + a.unary_share:
                    e["unary"] = True
        for e in entries:
            e["client"] = "shm" if e.get("shm") else "unary" if e.get("unary") else "stream"
        return entries


# ---- one soak ----------------------------------------------------------------------------

class Soak:
    """A server, its monitor, and the record of every phase run against it."""

    def __init__(self, args, dep: Deployment, server: TritonServer, monitor: Monitor):
        self.args, self.dep, self.server, self.monitor = args, dep, server, monitor
        self.task = dep.task
        self.model = f"{self.task}_stream"
        self.workload = Workload(args, dep)
        self.workload.shm_kind = "cuda" if monitor.gpu else "system"
        self.phases: list[dict] = []
        self.idle: list[dict] = []          # a sample after each drain: the server at rest
        self.saturation: dict = {}

    def _log(self, msg: str) -> None:
        print(f"[soak +{time.monotonic() - self.monitor.samples[0]['t']:.0f}s] {msg}", file=sys.stderr, flush=True)

    def run_phase(self, name: str, entries: list[dict], send) -> dict:
        """Send `entries` with `send(entries) -> records`, drain, and check every request's ending."""
        self.monitor.phase = name
        before = loadgen.scrape(self.server.metrics_url)
        t_start = time.monotonic()
        records = send(entries)
        t_sent = time.monotonic()
        entries = [entries[r.index % len(entries)] for r in records]   # a closed loop cycles through them
        after = settle(self.server.metrics_url, before, len(records), self.task, self.args.settle_timeout)
        t_end = time.monotonic()
        idle = self.monitor.take()
        self.idle.append({**idle, "after": name})
        phase = self._check(name, entries, records, before, after)
        phase.update(t_start=t_start, t_end=t_end, settle_s=round(t_end - t_sent, 1), wall_s=round(t_end - t_start, 1),
                     time_split=loadgen.where_time_goes(before, after))
        self.phases.append(phase)
        self._log(f"{name}: {phase['requests']} requests, {phase['outcomes_by_kind']}; problems {len(phase['problems'])}")
        return phase

    def _check(self, name: str, entries: list[dict], records: list, before: dict, after: dict) -> dict:
        problems = []
        by_kind: dict[str, Counter] = {}
        for e, r in zip(entries, records):
            kind = e["kind"].split(":")[0]
            by_kind.setdefault(e["kind"], Counter())[r.outcome] += 1
            problem = loadgen.outcome_problem(r)
            if problem:
                problems.append(f"{name} request {r.index} ({e['kind']}, {r.shape}{', unary' if e.get('unary') else ''}): "
                                f"{problem}")
            if kind != "bad" and r.outcome == "completed" and r.image_shape != (e["height"], e["width"], 3):
                problems.append(f"{name} request {r.index}: image shape {r.image_shape}")
        ends = [r.end_s for r in records if r.end_s is not None]
        sends = [r.send_s for r in records if r.send_s is not None]
        duration = max(ends) - min(sends) if ends and sends else 0.0
        summary = loadgen.summarize(entries, records, duration, {}, 0.0)
        # Server side: at most one terminal per request; every completion the client saw was
        # counted; a cancel may still complete there (it crossed the final response) or be
        # dropped unseen in Triton's queue; failures only where the client saw one.
        srv = server_counts(before, after, self.task)
        cancels = sum(1 for r in records if r.cancel_sent)
        client = Counter(r.outcome for r in records)
        checks = {
            "server terminals <= requests": sum(srv.values()) <= len(records),
            "client completed <= server completed <= client completed + cancels sent":
                client["completed"] <= srv["completed"] <= client["completed"] + cancels,
            "server failed == client failed": srv["failed"] == client["failed"],
            "server cancelled <= cancels sent": srv["cancelled"] <= cancels,
        }
        problems += [f"{name}: server counts {srv} vs client {dict(client)}: not {check}"
                     for check, ok in checks.items() if not ok]
        table = after.get(STATE_TABLE, 0.0)
        if table != 0:
            problems.append(f"{name}: the state table still holds {table:.0f} states after the drain "
                            f"(waited up to {self.args.settle_timeout:g} s)")
        keys = ("offered_request_rate", "request_throughput", "completed_requests", "cancelled_requests",
                "failed_requests", "lost", "duplicated", "unexpected_outcomes", "expected_failures",
                "cancels_requested", "cancels_too_late", "p50_e2el_ms", "p99_e2el_ms", "p50_ttfs_ms", "p99_ttfs_ms",
                "duration")
        return {"name": name, "requests": len(records), "kinds": dict(Counter(e["kind"] for e in entries)),
                "clients": dict(Counter(e.get("client", "stream") for e in entries)),
                "outcomes_by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
                **{k: summary[k] for k in keys}, "server_counts": srv, "server_checks": checks,
                "cancels_sent": cancels, "cancels_crossing_the_image": cancels - client["cancelled"],
                "state_table_after_drain": table, "problems": problems}

    # -- the steps of a run

    def warm_up(self) -> None:
        """Two rounds of `capacity` concurrent requests, each kind of client in turn; the second
        sets the default cancel delay."""
        cap = self.dep.engine.capacity
        for k in (1, 2):
            entries = self.workload.every_client(self.workload.plain(cap, 1.0, seed=-k))
            phase = self.run_phase(f"warm-up {k}", [{**e, "t": 0.0} for e in entries], self._open_loop)
        if self.args.cancel_delay == "auto":
            latency_s = (phase["p50_e2el_ms"] or 1000.0) / 1000.0
            self.workload.cancel_delay = (round(0.1 * latency_s, 3), round(0.9 * latency_s, 3))
        else:
            self.workload.cancel_delay = loadgen.parse_range(self.args.cancel_delay)
        self._log(f"cancel delay {self.workload.cancel_delay} s after sending")

    def measure_saturation(self) -> float:
        a = self.args
        if a.saturation_rps:
            self.saturation = {"rps": a.saturation_rps, "source": "given (--saturation-rps)"}
            return a.saturation_rps
        conc = a.saturation_concurrency or 2 * self.dep.engine.capacity
        entries = [{**e, "t": 0.0} for e in self.workload.plain(max(64, conc * 8), 1.0, seed=-3)]

        def send(entries: list[dict]) -> list:
            return asyncio.run(loadgen.closed_loop(self.server.grpc_url, entries, conc, a.saturation_seconds,
                                                   a.request_timeout, self.model))

        phase = self.run_phase("saturation", entries, send)
        rps = phase["request_throughput"]
        if not rps:
            raise RuntimeError(f"saturation burst completed nothing: {phase['problems'][:3]}")
        self.saturation = {"rps": rps, "source": f"measured: closed loop, {conc} concurrent streams for "
                                                 f"{a.saturation_seconds:g} s, {phase['completed_requests']} completed"}
        return rps

    def _open_loop(self, entries: list[dict]) -> list:
        records, _ = asyncio.run(loadgen.run_entries(self.server.grpc_url, entries, None, self.args.request_timeout,
                                                     model=self.model))
        return records

    def phase_seconds(self, rps: float) -> float:
        """--phase-seconds, or with --target-requests the length that sends that many requests over
        the fraction phases at the measured saturation, capped so that the phases, their drains
        and the shutdown fit in what is left of --budget-seconds."""
        a = self.args
        if not a.target_requests:
            return a.phase_seconds
        seconds = a.target_requests / (rps * self.load_units())
        if a.budget_seconds:
            left = a.budget_seconds - (time.monotonic() - a.t_wall) - a.reserve_seconds
            seconds = min(seconds, left / sum(a.weights))
        return max(5.0, seconds)

    def load_units(self) -> float:
        """Requests the fraction phases send per second of --phase-seconds per req/s of saturation:
        the sum over the phases of fraction x length weight."""
        return sum(f * w for f, w in zip(self.args.fractions, self.args.weights))

    def run(self) -> None:
        self.warm_up()
        rps = self.measure_saturation()
        self._log(f"saturation {rps:.3f} req/s ({self.saturation['source']})")
        seconds = self.phase_seconds(rps)
        self.saturation["phase_seconds"] = round(seconds, 1)
        self._log(f"phases of {seconds:.0f} s (x their weight): about {rps * seconds * self.load_units():.0f} requests")
        for k, (fraction, weight) in enumerate(zip(self.args.fractions, self.args.weights)):
            rate = fraction * rps
            entries = self.workload.phase(rate, seconds * weight, seed=self.args.seed * 1000 + k)
            self._log(f"phase {k + 1}: {fraction:g} x saturation, {len(entries)} requests at {rate:.3f} req/s")
            phase = self.run_phase(f"phase {k + 1} ({fraction:g}x)", entries, self._open_loop)
            phase.update(fraction=fraction, target_rps=round(rate, 4))
            if phase["lost"]:
                self._log(f"lost requests: stacks of {len(self.server.dump_stacks())} stubs -> server.log")
                time.sleep(2)


# ---- analysis and write-up -----------------------------------------------------------------

def after_warmup(samples: list[dict], t0: float, t1: float, share: float) -> list[dict]:
    """The samples in [t0, t1] after the first `share` of that span."""
    cut = t0 + share * (t1 - t0)
    return [s for s in samples if cut <= s["t"] <= t1]


def analyse(soak: Soak, problems: list[str]) -> dict:
    """Resource trends per phase, overall (the fraction phases) and at idle; adds problems it finds."""
    samples, share = soak.monitor.samples, soak.args.warmup_share
    per_phase = {p["name"]: resources.trend(after_warmup(samples, p["t_start"], p["t_end"], share))
                 for p in soak.phases}
    measured = [p for p in soak.phases if "fraction" in p]
    overall = (resources.trend(after_warmup(samples, measured[0]["t_start"], measured[-1]["t_end"], share))
               if measured else None)
    # soak.idle[i] was taken after soak.phases[i]; start from the drain just before the first fraction phase.
    idle = resources.trend(soak.idle[soak.phases.index(measured[0]) - 1:]) if measured else None
    start = samples[0]["t"]
    not_ready = [round(s["t"] - start, 1) for s in samples if not s["ready"]]
    if not_ready:
        problems.append(f"server not ready in {len(not_ready)} samples (at {not_ready[:10]} s)")
    counts = sorted({s["stubs"] for s in samples})
    if len(counts) > 1:
        gone = sorted(set(samples[0]["by_process"]) - set(samples[-1]["by_process"]))
        problems.append(f"stub count changed during the run: {counts}; gone at the end: {gone} "
                        "(a stub that died stays dead: Triton neither restarts it nor reports it unready)")
    if samples[-1]["state_table"] not in (0, 0.0):
        problems.append(f"state table {samples[-1]['state_table']} at the end of the run")
    growth = {}
    if overall and measured:
        span = after_warmup(samples, measured[0]["t_start"], measured[-1]["t_end"], share)
        first, last = span[0]["by_process"], span[-1]["by_process"]
        growth = dict(sorted(((n, round(last.get(n, 0.0) - mb, 1)) for n, mb in first.items()), key=lambda kv: -kv[1]))
    last = measured[-soak.args.slope_phases:] if measured else []
    fit = after_warmup(samples, last[0]["t_start"], last[-1]["t_end"], share) if last else []
    slopes = last_phase_slopes(fit)
    server = {}   # where tritonserver's own RSS grows: warm-up, a backlog's high-water mark, or steadily
    for p in soak.phases:
        span = [x["by_process"]["tritonserver"] for x in samples
                if p["t_start"] <= x["t"] <= p["t_end"] and "tritonserver" in x["by_process"]]
        if span:
            server[p["name"]] = {"first": span[0], "last": span[-1], "delta": round(span[-1] - span[0], 1)}
    return {"per_phase": per_phase, "overall": overall, "idle": idle, "rss_growth_by_process_mb": growth,
            "tritonserver_rss_by_phase_mb": server,
            "not_ready_samples": len(not_ready), "stub_counts": counts,
            "last_phases": {"phases": [p["name"] for p in last], "samples": len(fit), "slopes_per_min": slopes}}


def last_phase_slopes(samples: list[dict]) -> dict[str, float | None]:
    """Slope per minute of each figure the pass criterion bounds: RSS of tritonserver and of
    each stub (MB), GPU memory (MiB), open fds, /dev/shm (MB)."""
    names = sorted({n for s in samples for n in s["by_process"]})
    per_process = [{"t": s["t"], **{f"rss_mb:{n}": s["by_process"].get(n) for n in names}} for s in samples]
    out = {key: resources.slope_per_min(per_process, key) for key in (f"rss_mb:{n}" for n in names)}
    out.update({key: resources.slope_per_min(samples, key) for key in ("gpu_mb", "fds", "shm_mb")})
    return {k: None if v is None else round(v, 3) for k, v in out.items()}


def criteria(soak: Soak | None, analysis: dict | None, problems: list[str], shutdown: dict | None) -> dict:
    """The pass criteria of issue 19, each True/False (None: not measurable in this run)."""
    phases = [p for p in (soak.phases if soak else []) if "fraction" in p]
    total = sum(p["requests"] for p in phases)
    slopes = (analysis or {}).get("last_phases", {}).get("slopes_per_min", {})
    bound = soak.args.max_slope if soak else 1.0
    out = {
        "every request exactly one outcome of the right kind": soak is not None and bool(phases) and not any(
            p["lost"] or p["duplicated"] or p["unexpected_outcomes"] for p in soak.phases),
        "server counters agree with the client's": soak is not None and all(
            all(p["server_checks"].values()) for p in soak.phases),
        "no stub died (stub count constant)": bool(analysis) and len(analysis["stub_counts"]) == 1,
        "state table 0 after every phase": soak is not None and all(
            p["state_table_after_drain"] == 0 for p in soak.phases),
        f"every slope <= {bound:g}/min over the last phases": (
            all(v is not None and v <= bound for k, v in slopes.items() if not (k == "gpu_mb" and v is None))
            if slopes else None),
        "clean shutdown": None if shutdown is None else not (shutdown["exit_timeout_expired"] or shutdown["fatal_lines"]),
        "no problem reported": not problems,
    }
    if soak and soak.args.target_requests:
        out[f"at least {soak.args.target_requests} requests in the fraction phases"] = total >= soak.args.target_requests
    return out


def plot(soak: Soak, path: Path) -> Path | None:
    """Resources over time (RSS per process, GPU memory, fds, /dev/shm), phases shaded; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"[soak] no plot: {exc}", file=sys.stderr)
        return None
    samples = soak.monitor.samples
    t0 = samples[0]["t"]
    minutes = [(s["t"] - t0) / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    names = sorted({n for s in samples for n in s["by_process"]}, key=lambda n: (n != "tritonserver", n))
    for name in names:
        axes[0].plot(minutes, [s["by_process"].get(name) for s in samples], label=name, lw=1)
    axes[0].set_ylabel("RSS MB")
    axes[0].legend(fontsize=6, ncol=4)
    for ax, key, label in ((axes[1], "gpu_mb", "GPU memory MiB"), (axes[2], "fds", "open fds"),
                           (axes[3], "shm_mb", "/dev/shm MB")):
        ax.plot(minutes, [s.get(key) for s in samples], lw=1)
        ax.set_ylabel(label)
    for k, phase in enumerate(soak.phases):
        for ax in axes:
            ax.axvspan((phase["t_start"] - t0) / 60, (phase["t_end"] - t0) / 60, alpha=0.08 if k % 2 else 0.16)
        axes[0].text((phase["t_start"] - t0) / 60, axes[0].get_ylim()[1], phase["name"], fontsize=6, va="top")
    axes[-1].set_xlabel("minutes since the server was ready")
    fig.suptitle(f"soak: {Path(soak.args.deployment).name}, {sum(p['requests'] for p in soak.phases)} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def server_log_errors(path: Path) -> list[str]:
    """Error lines of the server log, without the ones the injected faults and bad requests cause."""
    if not path.exists():
        return []
    expected = re.compile(r"InjectedFault|injected fault|#soak-|non-finite|input '|CudaDriverHelper|NVML|DCGM|pinned memory")
    lines = path.read_text(errors="replace").splitlines()
    return [ln for ln in lines if (re.match(r"^E\d{4} ", ln) or "Traceback" in ln) and not expected.search(ln)]


def _f(v, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def write_report(soak: Soak | None, args, command: str, info: dict, deployment_text: str, problems: list[str],
                 analysis: dict | None, interrupted: str | None, wall_s: float, out: Path) -> tuple[Path, Path]:
    phases = soak.phases if soak else []
    ok = not problems and not interrupted and bool(phases)
    t0 = soak.monitor.samples[0]["t"] if soak and soak.monitor.samples else 0.0
    rel = lambda s: {**{k: v for k, v in s.items() if k != "t"}, "t_s": round(s["t"] - t0, 2)}  # noqa: E731
    payload = {
        "ok": ok, "problems": problems, "interrupted": interrupted, "command": command, "machine": info,
        "wall_s": round(wall_s, 1), "deployment": args.deployment, "deployment_with_faults": deployment_text,
        "faults": {name: {"rule": rule, "marker": marker(name), "expect_error": exp} for name, (rule, exp) in FAULTS.items()},
        "workload": {"sizes": args.sizes, "steps": args.steps, "guidance": args.guidance, "phases": args.phases,
                     "phase_seconds": args.phase_seconds, "cancel_rate": args.cancel_rate, "bad_rate": args.bad_rate,
                     "fault_rate": args.fault_rate, "unary_share": args.unary_share, "seed": args.seed,
                     "cancel_delay_s": soak.workload.cancel_delay if soak else None,
                     "request_timeout_s": args.request_timeout, "sample_interval_s": args.sample_interval,
                     "warmup_share": args.warmup_share, "malloc": args.malloc,
                     "server_env": args.server_env},
        "saturation": soak.saturation if soak else {},
        "phases": [{**{k: v for k, v in p.items() if k not in ("t_start", "t_end")},
                    "t_start_s": round(p["t_start"] - t0, 1), "t_end_s": round(p["t_end"] - t0, 1)} for p in phases],
        "resources": analysis,
        "idle_samples": [rel(s) for s in soak.idle] if soak else [],
        "samples": [rel(s) for s in soak.monitor.samples] if soak else [],
        "server_log_errors": server_log_errors(out / "server.log")[:50],
    }
    json_path = out / "soak.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")

    rows = []
    for p in phases:
        rows.append(f"| {p['name']} | {_f(p.get('target_rps'), 3)} | {_f(p['offered_request_rate'], 3)} | "
                    f"{_f(p['request_throughput'], 3)} | {p['requests']} | {p['completed_requests']} / "
                    f"{p['cancelled_requests']} / {p['failed_requests']} | {p['lost']} / {p['duplicated']} / "
                    f"{p['unexpected_outcomes']} | {_f(p['p50_e2el_ms'], 0)} / {_f(p['p99_e2el_ms'], 0)} | "
                    f"{p['server_counts']['completed']} / {p['server_counts']['cancelled']} / "
                    f"{p['server_counts']['failed']} | {_f(p['state_table_after_drain'], 0)} | {p['wall_s']} |")
    kinds = Counter()
    for p in phases:
        if "fraction" in p:
            kinds.update(p["kinds"])
    trend_rows = []
    figures = (("rss_mb", "RSS MB"), ("gpu_mb", "GPU MiB"), ("fds", "fds"), ("shm_mb", "/dev/shm MB"),
               ("state_table", "state table"))
    if analysis:
        spans = [(name, t) for name, t in analysis["per_phase"].items()]
        spans += [("**overall** (fraction phases)", analysis["overall"]), ("**idle** (after each drain)", analysis["idle"])]
        for name, t in spans:
            if not t or not t["rss_mb"] or t["rss_mb"]["slope_per_min"] is None:
                continue   # a span too short for a slope (the warm-ups)
            cells = []
            for key, _ in figures:
                fig = (t or {}).get(key)
                cells.append("n/a" if not fig else f"{_f(fig['slope_per_min'], 2)} ({_f(fig['first'])} → {_f(fig['last'])})")
            trend_rows.append(f"| {name} | " + " | ".join(cells) + " |")
    by_kind = "\n".join(f"| {p['name']} | " + "; ".join(f"{k}: {v}" for k, v in p["outcomes_by_kind"].items()) + " |"
                        for p in phases)
    fault_lines = "\n".join(f"- `{marker(n)}`: `{_toml_inline(r)}` → "
                            f"{f'one error matching `{e}`' if e else 'must still complete'}" for n, (r, e) in FAULTS.items())
    log_errors = payload["server_log_errors"]
    total = lambda key: sum(p[key] for p in phases)  # noqa: E731
    verdict = (f"**{'PASS' if ok else 'FAIL'}**{f' ({interrupted})' if interrupted else ''}: {total('requests')} "
               f"requests in {len(phases)} phases; lost {total('lost')}, duplicated {total('duplicated')}, wrong "
               f"outcome {total('unexpected_outcomes')}; server not ready in "
               f"{analysis['not_ready_samples'] if analysis else 'n/a'} samples; state table after the last drain "
               f"{_f(phases[-1]['state_table_after_drain'], 0) if phases else 'n/a'}.")
    phase_s = (soak.saturation if soak else {}).get("phase_seconds", args.phase_seconds)
    workload = (f"Deployment `{args.deployment}` + the fault rules below; sizes `{args.sizes}`, steps `{args.steps}`, "
                f"guidance `{args.guidance}`; phases {args.phases} x saturation, {phase_s:g} s of Poisson "
                f"arrivals each (times W for a phase written FxW), then a drain. Requests of the fraction phases by kind: {dict(sorted(kinds.items()))}. "
                f"Shares: cancel {args.cancel_rate}, bad {args.bad_rate} (half unary: must be `INVALID_ARGUMENT` naming "
                f"the input; half streamed: must name the input), fault {args.fault_rate}; of "
                f"the other requests {args.unary_share:.0%} unary (`{soak.task if soak else 'txt2img'}`), "
                f"{args.shm_share:.0%} unary into {soak.workload.shm_kind if soak else 'n/a'} shared memory, the rest "
                f"streamed. Cancel delay "
                f"{soak.workload.cancel_delay if soak else 'n/a'} s after sending (uniform). Server allocator: "
                f"{args.malloc}"
                f"{'; server environment ' + ' '.join(args.server_env) if args.server_env else ''}.")
    split_models = sorted({key[:-len("_execs")] for ph in phases for key in ph.get("time_split", {})
                           if key.endswith("_execs")})
    split_rows = "\n".join(
        f"| {ph['name']} | " + " | ".join(
            f"{_f(ph['time_split'].get(m + '_queue_ms_per_request'))} / {_f(ph['time_split'].get(m + '_compute_ms_per_exec'))}"
            for m in split_models) + f" | {_f(ph['time_split'].get('dit_step_ms'))} |"
        for ph in phases if ph.get("time_split"))
    md = f"""# Soak: {Path(args.deployment).name} — {dt.date.today().isoformat()} ({machine_label(info)})

## Ledger (before the shutdown; the pass criteria are at the end)
{verdict}
{chr(10).join(f'- {p}' for p in problems[:30])}

## Reproduce
{fence(command, 'bash')}
Wall time {wall_s:.0f} s. Saturation: {_f((soak.saturation if soak else {}).get('rps'), 3)} req/s
({(soak.saturation if soak else {}).get('source', 'n/a')}).

## Machine
- uname: {info['uname']}
- nproc: {info['nproc']}; CPU: {info['cpu']}; GPU: {info['gpu']}
- Python {info['python']}; torch {info['torch']}; diffusers {info['diffusers']}; transformers {info['transformers']};
  tritonclient {info['tritonclient']}; server {info['tritonserver']}
- git {info['git']}; load average at write-up: {info['load_average']}

## Workload
{workload}

Fault rules (fire only on prompts carrying the marker):
{fault_lines}

## Phases
| phase | target req/s | offered req/s | achieved req/s | requests | completed / cancelled / failed (client) | lost / duplicated / wrong outcome | e2el p50 / p99 ms | server completed / cancelled / failed | state table after drain | wall s (arrivals + drain) |
|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Outcomes by kind:

| phase | kind: outcomes |
|---|---|
{by_kind}

Where the time goes (Triton's counters per model: mean queue ms per request / compute ms per execution,
summed over the execution's requests as Triton counts it;
dit's mean engine step):

| phase | {' | '.join(split_models)} | dit step ms |
|---|{'---|' * len(split_models)}---|
{split_rows}

## Resources: slope per minute (first → last), after the first {args.warmup_share:.0%} of each span
RSS = tritonserver + all stubs (shared pages once per process); GPU = nvidia-smi `memory.used`, whole
device; fds = open file descriptors of those processes; /dev/shm = bytes of the files they map;
state table = `ditserve_state_table_size` of dit. Idle = one sample after each drain, from the end of the
saturation burst (warm-up when saturation was given) on: the leak indicator least affected by load.

| span | {' | '.join(label for _, label in figures)} |
|---|{'---|' * len(figures)}
{chr(10).join(trend_rows)}

RSS growth per process over the fraction phases after warm-up (MB):
{json.dumps(analysis['rss_growth_by_process_mb']) if analysis else 'n/a'}

tritonserver's RSS per phase (MB, first and last sample of the phase, its drain included):
{json.dumps(analysis['tritonserver_rss_by_phase_mb']) if analysis else 'n/a'}

Slopes per minute over the last phases ({', '.join((analysis or {}).get('last_phases', {}).get('phases', [])) or 'n/a'},
after their first {args.warmup_share:.0%}), the pass criterion's fit (bound {args.max_slope:g}/min; plot: soak.png):
{json.dumps((analysis or {}).get('last_phases', {}).get('slopes_per_min'))}

## Server log
{len(log_errors)} error lines other than those of the injected faults and bad requests{':' if log_errors else '.'}
{fence(chr(10).join(log_errors[:20])) if log_errors else ''}

Raw numbers (every sample, every phase): the JSON file of the same name beside this one.
"""
    md_path = out / "soak.md"
    md_path.write_text(md)
    return md_path, json_path


def read_shutdown(out: Path, stop_s: float) -> dict:
    """How the server stopped, from its log: the exit-timeout wait, fatal lines, and the models
    that never finished unloading (a Triton 2.51 gRPC stream whose cancel crossed its final
    response keeps `<task>_stream` loaded: docs/reliability.md)."""
    log = (out / "server.log").read_text(errors="replace")
    tail = log[log.rfind("Signal (2) received."):] if "Signal (2) received." in log else ""
    loaded = set(re.findall(r"successfully loaded '([^']+)'", log))
    unloaded = set(re.findall(r"successfully unloaded '([^']+)'", tail))
    fatal = [ln for ln in tail.splitlines() if "Fatal" in ln or "Segmentation fault" in ln]
    return {"stop_s": round(stop_s, 1), "stub_segfaults": tail.count("Fatal Python error: Segmentation fault"),
            "fatal_lines": fatal[:10], "exit_timeout_expired": "Exit timeout expired" in tail,
            "models_not_unloaded": sorted(loaded - unloaded)}


def record_shutdown(out: Path, shutdown: dict, verdict: dict) -> None:
    """Add the shutdown and the final criteria to the report (written before the stop: it can take the exit timeout)."""
    payload = json.loads((out / "soak.json").read_text())
    ok = all(v is not False for v in verdict.values())
    (out / "soak.json").write_text(json.dumps({**payload, "ok": ok, "criteria": verdict, "shutdown": shutdown},
                                              indent=2) + "\n")
    rows = "\n".join(f"| {name} | {'n/a' if v is None else 'pass' if v else '**FAIL**'} |" for name, v in verdict.items())
    with (out / "soak.md").open("a") as md:
        md.write(f"\n## Shutdown\nStopped {shutdown['stop_s']:.0f} s after SIGINT; exit timeout expired: "
                 f"{shutdown['exit_timeout_expired']}; models that never finished unloading: "
                 f"{shutdown['models_not_unloaded'] or 'none'}; fatal lines: {len(shutdown['fatal_lines'])}.\n\n"
                 f"## Pass criteria: {'PASS' if ok else 'FAIL'}\n| criterion | result |\n|---|---|\n{rows}\n")


# ---- command line ------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="perf/soak.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", default="configs/tiny-pixart-sigma.toml", help="deployment TOML (an image family); "
                   "must have no [faults] section (default configs/tiny-pixart-sigma.toml)")
    p.add_argument("--out", required=True, help="folder for soak.json, soak.md, soak.png, deployment.toml, server.log")
    p.add_argument("--accel-from", default=None, help="serve with the [accel] section of this deployment file (e.g. "
                   "configs/pixart-sigma-1024.toml: the acceleration the GPU deployment turns on)")
    p.add_argument("--warm-sizes", default=None, help="with --accel-from: its warm_sizes replaced by these "
                   "('512x512,256x256'); other sizes run eager")
    load = p.add_argument_group("load")
    load.add_argument("--saturation-rps", type=float, default=None, help="saturation in req/s; measured when unset")
    load.add_argument("--saturation-seconds", type=float, default=30.0, help="length of the closed-loop burst (default 30)")
    load.add_argument("--saturation-concurrency", type=int, default=None,
                      help="clients of the burst (default 2 x the deployment's [engine] capacity)")
    load.add_argument("--phases", default="0.5,0.9,1.3", help="fractions of saturation, one Poisson phase each "
                                                             "(default 0.5,0.9,1.3); FxW makes that phase W times "
                                                             "--phase-seconds long (0.6,1.3,0.8x2)")
    load.add_argument("--phase-seconds", type=float, default=120.0, help="arrivals per phase, s (default 120)")
    load.add_argument("--sizes", default=None, help="'64,96' square or 'HxW,...' (default: the deployment's [defaults])")
    load.add_argument("--steps", default=None, help="'10,20' or '2-12' (default: the deployment's [defaults])")
    load.add_argument("--guidance", default=None, help="comma-separated guidance scales (default: the deployment's)")
    load.add_argument("--cancel-rate", type=float, default=0.05, help="share cancelled by the client (default 0.05)")
    load.add_argument("--cancel-by", choices=("stream", "id"), default="stream",
                      help="cancel the gRPC call (default; what the recorded runs did) or the request id through the "
                           "`cancel` model, which never meets Triton 2.51's crash and unload hang under cancels")
    load.add_argument("--cancel-delay", default="auto", help="A:B seconds after sending; auto = 0.1-0.9 x the warm-up's "
                                                              "median latency (default auto)")
    load.add_argument("--bad-rate", type=float, default=0.02, help="share of invalid requests (default 0.02)")
    load.add_argument("--fault-rate", type=float, default=0.01, help="share of fault-tagged requests (default 0.01)")
    load.add_argument("--unary-share", type=float, default=0.2,
                      help="share of the good requests sent to the non-streaming model (default 0.2)")
    load.add_argument("--shm-share", type=float, default=0.1,
                      help="share of the good requests sent unary with the image into a shared-memory region: CUDA "
                           "where the server has a GPU, system memory otherwise (default 0.1)")
    load.add_argument("--target-requests", type=int, default=0,
                      help="size the phases (instead of --phase-seconds) to send this many requests over the fraction "
                           "phases at the measured saturation; a criterion of the verdict (default 0: off)")
    load.add_argument("--budget-seconds", type=float, default=0.0,
                      help="with --target-requests: shorten the phases so the whole run fits in this (default 0: none)")
    load.add_argument("--reserve-seconds", type=float, default=75.0,
                      help="kept out of --budget-seconds for the drains, the report and the shutdown (default 75)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--request-timeout", type=float, default=300.0,
                      help="a request without a terminal response by then is lost, s (default 300)")
    meas = p.add_argument_group("measurement")
    meas.add_argument("--sample-interval", type=float, default=2.0, help="resource sampling period, s (default 2)")
    meas.add_argument("--warmup-share", type=float, default=0.25,
                      help="share of each span left out of the slopes (default 0.25)")
    meas.add_argument("--slope-phases", type=int, default=2,
                      help="the pass criterion fits the slopes over this many last fraction phases (default 2)")
    meas.add_argument("--max-slope", type=float, default=1.0,
                      help="bound of each slope (MB, MiB or fds per minute) over those phases (default 1.0)")
    meas.add_argument("--settle-timeout", type=float, default=60.0,
                      help="after a phase, wait this long at most for the server to count every request and empty "
                           "its state table, s (default 60)")
    meas.add_argument("--server-timeout", type=float, default=600.0, help="readiness wait, s (default 600)")
    meas.add_argument("--exit-timeout", type=int, default=30,
                      help="tritonserver --exit-timeout-secs: how long the stop may wait for models to unload; an "
                           "expired wait fails the clean-shutdown criterion (default 30)")
    srv = p.add_argument_group("server")
    srv.add_argument("--malloc", default=None,
                     help="allocator of tritonserver and its stubs: glibc, jemalloc, tcmalloc or a path to a malloc "
                          ".so, preloaded (default: DITSERVE_MALLOC, else glibc; ditserve.launcher.malloc_library)")
    srv.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                     help="set in the server's environment only, e.g. MALLOC_ARENA_MAX=2 (repeatable)")
    return p


def parse_phases(text: str) -> tuple[list[float], list[float]]:
    """`0.6,1.3,0.8x2` -> fractions [0.6, 1.3, 0.8] and length weights [1, 1, 2]."""
    fractions, weights = [], []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        fraction, _, weight = item.partition("x")
        try:
            fractions.append(float(fraction))
            weights.append(float(weight) if weight else 1.0)
        except ValueError:
            raise SystemExit(f"--phases item {item!r}: expected a fraction of saturation, optionally xWEIGHT "
                             "(e.g. 0.8 or 0.8x2)") from None
        if fractions[-1] <= 0 or weights[-1] <= 0:
            raise SystemExit(f"--phases item {item!r}: fraction and weight must be > 0")
    if not fractions:
        raise SystemExit(f"--phases {text!r}: name at least one fraction")
    return fractions, weights


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = " ".join(shlex.quote(a) for a in ["python", "perf/soak.py", *argv])
    base = Path(args.deployment)
    base = base if base.is_absolute() or base.exists() else ROOT / base
    args.fractions, args.weights = parse_phases(args.phases)
    if args.bad_rate + args.fault_rate + args.cancel_rate >= 1:
        raise SystemExit("--bad-rate + --fault-rate + --cancel-rate must stay below 1")
    if args.shm_share + args.unary_share > 1:
        raise SystemExit("--shm-share + --unary-share must stay at most 1")
    server_env = dict(kv.split("=", 1) for kv in args.server_env if "=" in kv)
    if len(server_env) != len(args.server_env):
        raise SystemExit("--server-env takes KEY=VALUE")
    try:
        args.malloc = malloc_choice(args.malloc)   # resolved once: the report names the allocator it ran on
        malloc_library(args.malloc)
    except RuntimeError as exc:
        raise SystemExit(f"--malloc: {exc}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    accel_from = Path(args.accel_from) if args.accel_from else None
    if accel_from is not None and not accel_from.is_absolute() and not accel_from.exists():
        accel_from = ROOT / accel_from
    dep = write_fault_deployment(base, out / "deployment.toml", accel_from, args.warm_sizes)
    if dep.is_video:
        raise SystemExit(f"{base}: soak drives image deployments (loadgen reads the `image` output)")
    args.sizes = args.sizes or f"{dep.defaults.height}x{dep.defaults.width}"
    args.steps = args.steps or str(dep.defaults.num_inference_steps)
    args.guidance = args.guidance or str(dep.defaults.guidance_scale)

    def _interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    t_wall = args.t_wall = time.monotonic()
    soak, problems, interrupted, analysis, version, verdict = None, [], None, None, None, {}
    try:
        resources.gpu_memory_mb()
        gpu = True
    except RuntimeError:
        gpu = False
    with tempfile.TemporaryDirectory(prefix="soak.") as work:
        repo = Path(work) / "repository"
        render_repository(out / "deployment.toml", repo)
        http, grpc_port, metrics = free_ports(3)
        server = TritonServer(ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc_port,
                                            metrics_port=metrics, deployment=str(out / "deployment.toml"),
                                            extra_args=[f"--exit-timeout-secs={args.exit_timeout}"],
                                            malloc=args.malloc, env=server_env),
                              log_path=out / "server.log")
        print(f"[soak] starting tritonserver on {repo} (log {server.log_path})", file=sys.stderr, flush=True)
        server.start()
        monitor = None
        try:
            server.wait_ready(timeout_s=args.server_timeout)
            version = server_version(server.grpc_url)
            monitor = Monitor(server, args.sample_interval, gpu)
            monitor.take()
            monitor.start()
            soak = Soak(args, dep, server, monitor)
            soak.run()
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, a caller's `timeout`: keep what finished
            interrupted = f"interrupted ({exc or 'SIGINT'})"
            print(f"[soak] {interrupted}: stacks of {len(server.dump_stacks())} stubs -> server.log", file=sys.stderr)
            time.sleep(2)
        except Exception as exc:  # noqa: BLE001 - a failing run still writes its report
            traceback.print_exc()
            problems.append(f"the soak stopped: {type(exc).__name__}: {exc}")
        finally:
            if monitor is not None:
                monitor.stop()
            if soak is not None:
                problems[:0] = [p for phase in soak.phases for p in phase["problems"]]
                analysis = analyse(soak, problems)
            # The report before the server stops: stopping can take its exit timeout (60 s, longer
            # than a caller's `timeout --kill-after` may allow) when a stub has died.
            md, js = write_report(soak, args, command, machine_info(version), (out / "deployment.toml").read_text(),
                                  problems, analysis, interrupted, time.monotonic() - t_wall, out)
            print(f"[soak] {'PASS' if not problems and not interrupted else 'FAIL'}: wrote {md} and {js.name}; "
                  "stopping the server", file=sys.stderr, flush=True)
            t_stop = time.monotonic()
            server.stop()
            shutdown = read_shutdown(out, time.monotonic() - t_stop)
            verdict = criteria(soak, analysis, problems, shutdown)
            record_shutdown(out, shutdown, verdict)
            if soak is not None:
                plot(soak, out / "soak.png")
            print(f"[soak] shutdown: {shutdown}", file=sys.stderr)
    for problem in problems[:20]:
        print(f"[soak]   {problem}", file=sys.stderr)
    for name, value in verdict.items():
        print(f"[soak] {'n/a ' if value is None else 'pass' if value else 'FAIL'} {name}", file=sys.stderr)
    failed = soak is None or any(v is False for v in verdict.values())
    return 130 if interrupted else (1 if failed else 0)

if __name__ == "__main__":
    sys.exit(main())
