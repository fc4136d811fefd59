#!/usr/bin/env python
"""Matched control: the same trace against one server per engine mode, compared.

For each mode of `--modes` (default request_batch,step) this writes a deployment = the base
deployment with `[engine] mode` replaced (same capacity, or `--capacity`), renders a model
repository for it, starts tritonserver on it, replays the SAME arrivals with
perf/loadgen.py, stops the server, and finally writes
`perf/results/<date>-<machine>-matched-control.{md,json}`: hypothesis and success
threshold first, then the exact command, the machine, a comparison table, a verdict and
the raw loadgen report of every mode.

    # CPU, tiny pipeline, committed trace (a few minutes on 2 cores)
    python perf/matched_control.py --trace perf/traces/tiny_mixed_v1.jsonl --replays 3
    # GPU host, full-size deployment, Poisson trace drawn on the fly (seeded)
    python perf/matched_control.py --deployment configs/pixart-sigma-1024.toml \\
        --rate 1.5 --num-requests 200 --sizes 1024 --steps 20 --cancel-rate 0.05 --cancel-delay 0.5:3

Modes run one after the other, in the order given; every server is stopped (SIGINT, then
SIGKILL of its process group) on every exit path.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))

from ditserve.deployment import (ENGINE_MODES, SCHEDULERS, Defaults, load_deployment,  # noqa: E402
                                 parse_accel_overrides, write_variant)
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from machine import fence, machine_info, machine_label, server_version  # noqa: E402


def _load_loadgen():
    spec = importlib.util.spec_from_file_location("ditserve_perf_loadgen", ROOT / "perf" / "loadgen.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


loadgen = _load_loadgen()
DEFAULT_TRACE = "perf/traces/tiny_mixed_v1.jsonl"


# ---- deployments -------------------------------------------------------------------------

def write_mode_deployment(base: Path, mode: str, capacity: int | None, out: Path,
                          accel: dict | None = None, in_flight: int = 0) -> tuple[Path, int]:
    """The base deployment with [engine] mode (and capacity, in_flight, and [accel] keys) replaced;
    returns (path, capacity). `mode` may name a step scheduler too: `step:cost` = mode "step", scheduler "cost";
    `+KEY=VALUE` parts set other [engine] keys (`step:cost+late_queue_ms=3`); a `#N` suffix
    (`step:cost#2`) names another server of the same mode (server-to-server spread)."""
    mode, *keys = mode.partition("#")[0].split("+")
    mode, _, scheduler = mode.partition(":")
    if mode not in ENGINE_MODES or (scheduler and scheduler not in SCHEDULERS):
        raise SystemExit(f"unknown mode {mode!r}; choose from {ENGINE_MODES}, or step:<scheduler> with a "
                         f"scheduler of {SCHEDULERS}")
    if bad := [key for key in keys if "=" not in key]:
        raise SystemExit(f"mode part(s) {bad} are not [engine] KEY=VALUE (e.g. step:cost+late_queue_ms=3)")
    cap = capacity if capacity is not None else load_deployment(base).engine.capacity
    engine = {"mode": mode, "capacity": 1 if mode == "serial" else cap, "in_flight": in_flight,
              **({"scheduler": scheduler} if scheduler else {}),
              **{name: _engine_value(value) for name, _, value in (key.partition("=") for key in keys)}}
    variant = write_variant(base, out, engine, "perf/matched_control.py", accel=accel)
    return out, variant.engine.capacity


def _engine_value(text: str) -> bool | int | float | str:
    """A `+KEY=VALUE` part's value as TOML would type it: a bool, an int, a float, else a string."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def trace_sizes(entries: list[dict], defaults: Defaults, video: bool = False) -> list[str]:
    """The distinct sizes the requests of `entries` run at, as [accel] warm_sizes entries: "HxW", or
    "FxHxW" on a video deployment (traces name no frame count: its default). An entry without a
    size runs at the deployment's default; one expecting an error (a bad request) is left out."""
    sizes = {(e.get("height", defaults.height), e.get("width", defaults.width)) for e in entries
             if not e.get("expect_error")}
    return [f"{defaults.num_frames}x" * video + f"{h}x{w}" for h, w in sorted(sizes)]


def variant_accel(overrides: dict, sizes: list[str]) -> dict:
    """The [accel] keys every mode's variant replaces: `--accel`'s, plus warm_sizes = `sizes` (the
    trace's) unless `--accel` names it. The cost scheduler profiles its curve at load for the warm
    sizes only: an H200 run at 512 px profiled only the base's 1024x1024."""
    return overrides if "warm_sizes" in overrides else {**overrides, "warm_sizes": sizes}


def render_repository(deployment: Path, out: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", str(deployment),
                    "--out", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)



# ---- one mode ----------------------------------------------------------------------------

def run_mode(mode: str, args, traces: dict[str, list[dict]], source: str, work: Path, reports: dict[str, dict],
             accel: dict, saturation: dict | None = None) -> None:
    """One server for `mode` (the base deployment's [accel] keys replaced by `accel`); every trace
    of `traces` (name -> entries) replayed on it in order, each loadgen report put in `reports`
    (name -> report) as soon as it is done, so that an interrupt while the server stops keeps them
    (an H200 run lost a finished mode that way).

    With `saturation` (a dict to fill, `--load-fractions`), the closed-loop saturation is measured
    on this server first and `traces` is filled from it (the first mode only; later modes replay
    the same traces)."""
    label = re.sub(r"[:#+=.]", "-", mode)   # step:cost#2 -> step-cost-2 in file names
    deployment, capacity = write_mode_deployment(Path(args.deployment).resolve(), mode, args.capacity,
                                                 work / f"deployment-{label}.toml", accel, args.in_flight)
    repo = work / f"repository-{label}"
    render_repository(deployment, repo)
    http, grpc_port, metrics = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc_port,
                                        metrics_port=metrics, deployment=str(deployment)),
                          log_path=work / f"server-{label}.log")
    print(f"[matched_control] {mode}: starting tritonserver (capacity {capacity}, log {server.log_path})",
          file=sys.stderr, flush=True)
    t = time.monotonic()
    complete = False
    server.start()
    try:
        server.wait_ready(timeout_s=args.server_timeout)
        ready_s = time.monotonic() - t
        version = server_version(server.grpc_url)
        if saturation is not None and not saturation:
            saturation.update(measure_saturation(server.grpc_url, args, capacity))
            traces.update(ladder_traces(args, saturation["rps"]))
        solo_ms: dict[str, float] = {}   # a ladder measures each shape's solo latency once per server
        for k, (name, entries) in enumerate(traces.items()):
            cfg = loadgen.LoadgenConfig(
                url=server.grpc_url, entries=entries, source=source, metrics_url=server.metrics_url,
                max_concurrency=args.max_concurrency, warmup=args.warmup if k == 0 else 0,
                slo_scale=args.slo_scale, solo_repeats=args.solo_repeats, measure_solo=args.slo_scale > 0,
                known_solo_ms=dict(solo_ms), server_pid=server.process.pid, timeout_s=args.request_timeout,
                speedup=args.speedup, replays=args.replays)
            report = asyncio.run(loadgen.run(cfg))
            solo_ms.update(report.get("solo_latency_ms") or {})
            tag = f"{mode} {name}" if name else mode
            print(f"[matched_control] {tag}:\n{loadgen.format_summary(report)}", file=sys.stderr, flush=True)
            report.update(mode=mode, capacity=capacity, server_ready_s=round(ready_s, 1), server_version=version,
                          deployment_toml=deployment.read_text())
            reports[name] = report
            if report.get("lost") or report.get("failed_requests"):
                break
        complete = len(reports) == len(traces) and not any(
            r.get("lost") or r.get("failed_requests") for r in reports.values())
    finally:
        if not complete:
            # Interrupted or incomplete: leave every stub's Python stacks in the server log.
            print(f"[matched_control] {mode}: incomplete run, stacks of {len(server.dump_stacks())} stubs -> "
                  f"{server.log_path}", file=sys.stderr, flush=True)
            time.sleep(2)
        t_stop = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - t_stop
    log = Path(server.log_path).read_text(errors="replace").splitlines() if server.log_path else []
    harmless = re.compile(r"CudaDriverHelper|NVML|DCGM|pinned memory|Exit timeout expired")
    problems = [ln for ln in log if (re.match(r"^E\d{4} ", ln) or "Traceback" in ln) and not harmless.search(ln)]
    curves = [ln.split("scheduler cost curves", 1)[1].strip(" :\"") for ln in log if "scheduler cost curves" in ln]
    at_load = [ln.split("cost curve measured at load", 1)[1].strip(" :\"") for ln in log
               if "cost curve measured at load" in ln]
    for report in reports.values():   # the cost curves dit measured at load and learned (logged as it unloads; `cost` only)
        report.update(server_stop_s=round(stop_s, 1), server_log_errors=problems[:20],
                      scheduler_cost_curves=curves[-1] if curves else None,
                      scheduler_cost_curves_at_load=at_load[-1] if at_load else None)
    if curves:
        print(f"[matched_control] {mode}: learned {curves[-1]}", file=sys.stderr, flush=True)


# ---- load ladder (--load-fractions) --------------------------------------------------------

def measure_saturation(url: str, args, capacity: int) -> dict:
    """Requests/s of a closed loop (`--saturation-concurrency`, default 2 x capacity, clients each
    sending its next request when its last one ends) over the workload's shapes, or `--saturation-rps`."""
    if args.saturation_rps:
        return {"rps": args.saturation_rps, "source": "given (--saturation-rps)"}
    concurrency = args.saturation_concurrency or 2 * capacity
    entries, _ = loadgen.entries_from_args(_workload_args(args, rate=1.0, num_requests=max(64, 8 * concurrency)))
    print(f"[matched_control] saturation: closed loop of {concurrency} clients for {args.saturation_seconds:g} s",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    records = asyncio.run(loadgen.closed_loop(url, entries, concurrency, args.saturation_seconds,
                                              args.request_timeout))
    estimate = closed_loop_throughput(records, concurrency, time.perf_counter() - t0, args.saturation_seconds)
    if not estimate["completed"]:
        raise RuntimeError("saturation: the closed loop completed no request; see the server log")
    print(f"[matched_control] saturation: {estimate['rps']:.3f} req/s ({estimate['source']})", file=sys.stderr,
          flush=True)
    return {**estimate, "source": f"measured on the first mode's server: closed loop, {concurrency} clients for "
                                  f"{args.saturation_seconds:g} s; {estimate['source']}"}


def closed_loop_throughput(records: list, concurrency: int, wall_s: float, window_s: float | None = None) -> dict:
    """Completed requests/s of a closed loop of `concurrency` clients with no think time, by Little's
    law: N x completed / the time the clients spent in requests (= N / mean response time when all
    complete; a cancelled or failed request holds its client too). Not completed / `wall_s`, which is
    kept beside it: the wall includes draining the requests in flight when the window ends (an H200
    at 1024 px, 15-25 s a request in a 30 s window, measured 0.65 req/s that way where an earlier run
    of the same setup had 0.96). With fewer completed requests than clients, too few to average:
    completed / `wall_s`. A `window_s` (the loop's length) under 3 mean response times is flagged:
    the first wave, all clients at once, then dominates (H200 1024px, 30 s window, ~27 s a request:
    1.197 req/s by Little's law where request batching never served more than 0.925)."""
    done = sum(1 for r in records if r.outcome == "completed")
    spans = [r.e2el_s for r in records if r.e2el_s is not None]
    over_wall = done / wall_s
    wall = f"{done} completed in {wall_s:.1f} s = {over_wall:.3f} req/s, drain included"
    out = {"completed": done, "rps_completed_over_wall": round(over_wall, 4)}
    if done < concurrency:
        return {**out, "rps": round(over_wall, 4), "rps_little": None,
                "source": f"completed / wall, as fewer completed than clients ({done} < {concurrency}): {wall}"}
    little = concurrency * done / sum(spans)
    mean_span = sum(spans) / len(spans)
    short = window_s is not None and window_s < 3 * mean_span
    warning = (f"; WARNING: the {window_s:g} s window is under 3 mean response times ({mean_span:.1f} s), so the "
               f"first wave biases this; lengthen --saturation-seconds or pass --saturation-rps") if short else ""
    return {**out, "rps": round(little, 4), "rps_little": round(little, 4), "window_too_short": short,
            "source": f"Little's law: {concurrency} clients / mean {mean_span:.2f} s a request "
                      f"({len(spans)} ended) x {done / len(spans):.2f} completed = {little:.3f} req/s; {wall}{warning}"}


def ladder_traces(args, saturation_rps: float) -> dict[str, list[dict]]:
    """One seeded Poisson trace per `--load-fractions` entry, at that fraction of saturation."""
    traces = {}
    for fraction in _fractions(args):
        entries, _ = loadgen.entries_from_args(_workload_args(args, rate=fraction * saturation_rps,
                                                              num_requests=args.num_requests))
        traces[_load_name(fraction)] = entries
    return traces


def _load_name(fraction: float) -> str:
    """load0p8 for 0.8: a name without dots, for file names."""
    return f"load{fraction:g}".replace(".", "p")


def _fractions(args) -> list[float]:
    return [float(f) for f in args.load_fractions.split(",") if f.strip()]


def _workload_args(args, rate: float | None, num_requests: int | None) -> argparse.Namespace:
    return argparse.Namespace(trace=args.trace if rate is None else None, rate=rate, num_requests=num_requests,
                              sizes=args.sizes, steps=args.steps, guidance=args.guidance, prompts_file=None,
                              seed=args.seed, cancel_rate=args.cancel_rate, cancel_delay=args.cancel_delay,
                              cancel_by=args.cancel_by)


# ---- comparison --------------------------------------------------------------------------

ROWS = (  # (key, label, digits)
    ("offered_request_rate", "offered req/s", 2),
    ("request_throughput", "achieved req/s (request_throughput)", 2),
    ("completed_requests", "completed", 0),
    ("cancelled_requests", "cancelled (client)", 0),
    ("failed_requests", "failed", 0),
    ("lost", "lost (no terminal)", 0),
    ("duplicated", "duplicated (>1 terminal)", 0),
    ("mean_e2el_ms", "e2el mean ms", 1),
    ("p50_e2el_ms", "e2el p50 ms", 1),
    ("p95_e2el_ms", "e2el p95 ms", 1),
    ("p99_e2el_ms", "e2el p99 ms", 1),
    ("mean_ttfs_ms", "TTFS mean ms (client)", 1),
    ("p50_ttfs_ms", "TTFS p50 ms (client)", 1),
    ("p99_ttfs_ms", "TTFS p99 ms (client)", 1),
    ("server_mean_ttfs_ms", "TTFS mean ms (server, from model arrival)", 1),
    ("slo_attainment_rate", "SLO attainment", 3),
    ("mean_step_batch_size", "mean step batch size (dit)", 2),
    ("step_batches", "dit forwards", 0),
    ("stage_mean_ms.encode", "encode mean ms", 1),
    ("stage_mean_ms.denoise", "denoise mean ms", 1),
    ("stage_mean_ms.decode", "decode mean ms", 1),
    ("server_rss_mb_peak", "server RSS peak MB (all processes)", 0),
    ("gpu_memory_used_mb_peak_total", "GPU memory used peak MB", 0),
)


def _get(report: dict, key: str):
    value = report
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _fmt(v, digits: int) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) or digits:
        return f"{v:.{digits}f}"
    return str(v)


def comparison_table(reports: dict[str, dict], ref: str | None, alt: str | None) -> str:
    modes = list(reports)
    head = "| metric | " + " | ".join(modes) + (f" | {alt} / {ref} |" if ref and alt else " |")
    lines = [head, "|---" * (len(modes) + 1 + (1 if ref and alt else 0)) + "|"]
    for key, label, digits in ROWS:
        vals = [_get(reports[m], key) for m in modes]
        if all(v is None for v in vals):
            continue
        row = f"| {label} | " + " | ".join(_fmt(v, digits) for v in vals)
        if ref and alt:
            a, b = _get(reports[alt], key), _get(reports[ref], key)
            row += " | " + (f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "")
        lines.append(row + " |")
    return "\n".join(lines)


def verdict(reports: dict[str, dict], args) -> dict:
    ref, alt = "request_batch", args.compare
    out: dict = {"checks": {}, "success": None}
    if ref not in reports or alt not in reports:
        out["text"] = "No verdict: the hypothesis compares request_batch with step; run both modes."
        return out
    r, s = reports[ref], reports[alt]

    def ratio(key):
        a, b = s.get(key), r.get(key)
        return a / b if a is not None and b else None

    p99, p50, ttfs = ratio("p99_e2el_ms"), ratio("p50_e2el_ms"), ratio("p50_ttfs_ms")
    thr = ratio("request_throughput")
    checks = {
        f"step p99 <= {args.p99_ratio} x request p99": (p99, p99 is not None and p99 <= args.p99_ratio),
        "step p50 < request p50": (p50, p50 is not None and p50 < 1.0),
        f"step TTFS p50 <= {args.ttfs_ratio} x request's": (ttfs, ttfs is not None and ttfs <= args.ttfs_ratio),
        f"throughput within {args.throughput_tolerance:.0%}": (thr, thr is not None and abs(thr - 1) <= args.throughput_tolerance),
        "lost == duplicated == 0 in both": (None, all(x.get("lost") == 0 and x.get("duplicated") == 0 for x in (r, s))),
    }
    out["checks"] = {k: {"ratio": None if v is None else round(v, 3), "pass": ok} for k, (v, ok) in checks.items()}
    out["success"] = all(ok for _, ok in checks.values())
    failed = [k for k, (_, ok) in checks.items() if not ok]
    slo_r, slo_s = r.get("slo_attainment_rate"), s.get("slo_attainment_rate")
    slo = (f" SLO attainment ({args.slo_scale:g}x solo): step {_fmt(slo_s, 3)} vs request_batch {_fmt(slo_r, 3)}."
           if slo_r is not None and slo_s is not None else "")
    if out["success"]:
        text = (f"Hypothesis supported on this workload: step mode cut p99 latency to {p99:.2f}x and p50 TTFS to "
                f"{ttfs:.2f}x of request mode at equal throughput ({thr:.2f}x).{slo} Recommend `mode = \"step\"` for "
                "streaming/interactive traffic with Poisson-like arrivals near saturation; keep request_batch as the "
                "control.")
    else:
        text = (f"Hypothesis NOT supported on this workload (failed: {'; '.join(failed)}). Ratios step/request: "
                f"p99 {_fmt(p99, 2)}, p50 {_fmt(p50, 2)}, TTFS p50 {_fmt(ttfs, 2)}, throughput {_fmt(thr, 2)}.{slo} ")
        if thr is not None and abs(thr - 1) > args.throughput_tolerance:
            text += "Throughputs differ, so the latencies are not compared at equal load. "
        if ttfs is not None and ttfs <= args.ttfs_ratio:
            text += ("Step mode still starts generations sooner (TTFS), which is what progress-streaming clients "
                     "see first; recommend it only for workloads where that matters and tails are acceptable. ")
        text += ("Per DESIGN.md, keep request_batch as the default for this workload until a matched run shows step "
                 "mode winning.")
    out["text"] = text
    return out


# ---- write-up ----------------------------------------------------------------------------

def write_results(args, command: str, info: dict, reports: dict[str, dict], entries: list[dict], source: str,
                  wall_s: float, interrupted: str | None = None, load: dict | None = None) -> tuple[Path, Path]:
    """The .md/.json pair of one trace; `load` ({"name", "fraction", "saturation"}) for a ladder step."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    label = args.machine or machine_label(info)
    stem = out_dir / f"{dt.date.today().isoformat()}-{label}-matched-control{'-' + load['name'] if load else ''}"
    v = verdict(reports, args)
    hypothesis = (f"H: step mode lowers p50 and p99 latency and time to first step (TTFS) vs request mode at equal "
                  f"throughput, under the same Poisson arrivals near saturation. Success: step p99 <= "
                  f"{args.p99_ratio} x request p99, step p50 < request p50, step TTFS p50 <= {args.ttfs_ratio} x "
                  f"request's, achieved throughput within {args.throughput_tolerance:.0%}, and lost == duplicated == 0 "
                  f"in both modes.")
    payload = {"hypothesis": hypothesis, "command": command, "machine": info, "source": source,
               "deployment_base": str(args.deployment), "modes": list(reports), "replays": args.replays,
               "wall_s": round(wall_s, 1), "interrupted": interrupted, "load": load, "verdict": v, "reports": reports,
               "trace": entries}
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(payload, indent=2) + "\n")

    shapes = sorted({loadgen.shape_key(e) for e in entries})
    t_span = max(e["t"] for e in entries) - min(e["t"] for e in entries)
    cancels = sum(1 for e in entries if "cancel_after_s" in e)
    checks = "\n".join(f"| {k} | {_fmt(c['ratio'], 3)} | {'pass' if c['pass'] else 'FAIL'} |" for k, c in v["checks"].items())
    first = next(iter(reports.values()))
    ladder_note = "" if not load else (
        f"\nLoad ladder step `{load['name']}`: Poisson at {load['fraction']:g} x saturation {load['saturation']['rps']} "
        f"req/s ({load['saturation']['source']}); the modes' servers each replayed every step of the ladder in "
        f"order (warm-up before the first only; each shape's solo latency measured at the first step that has it).")
    solo_rows = "\n".join(
        f"| {shape} | " + " | ".join(_fmt(reports[m].get("solo_latency_ms", {}).get(shape), 1) for m in reports) + " |"
        for shape in shapes)
    modes_hdr = " | ".join(reports)
    replay_note = ""
    if args.replays > 1:
        rows = []
        for m, rep in reports.items():
            for i, pr in enumerate(rep.get("per_replay", []), 1):
                rows.append(f"| {m} | {i} | {_fmt(pr['request_throughput'], 2)} | {_fmt(pr['p50_e2el_ms'], 1)} | "
                            f"{_fmt(pr['p99_e2el_ms'], 1)} | {_fmt(pr['p50_ttfs_ms'], 1)} | {_fmt(pr['slo_attainment_rate'], 3)} |")
        replay_note = ("\nPer replay (the table above pools them; the spread here is the run-to-run noise):\n\n"
                       "| mode | replay | req/s | p50 ms | p99 ms | TTFS p50 ms | SLO |\n|---|---|---|---|---|---|---|\n"
                       + "\n".join(rows) + "\n")
    md = f"""# Matched control: request_batch vs step — {dt.date.today().isoformat()} ({label})

## Hypothesis and success threshold (stated before the run)
{hypothesis}

## Verdict
{f"**Run {interrupted}: partial results.**" if interrupted else ""}
**{'SUCCESS' if v['success'] else ('FAIL' if v['success'] is False else 'n/a')}.** {v['text']}

| check | step / request | result |
|---|---|---|
{checks}

{"**CPU: absolute times are not meaningful** (tiny random-weight pipeline on a shared host); read the ratios." if info['gpu'] == 'none' else ''}

## Reproduce
{fence(command, 'bash')}
Workload: {source}; {len(entries)} requests over {t_span:.2f} s of arrivals (offered {_fmt(first.get('offered_request_rate'), 2)} req/s),
{len(shapes)} distinct shapes, {cancels} with a client cancel (`cancel_after_s`). Each mode: its own server (deployment =
`{args.deployment}` with `[engine] mode` (and `scheduler`, for step:<scheduler>) replaced, capacity {first.get('capacity')}), warm-up {args.warmup} requests,
solo latency of every shape ({args.solo_repeats} runs each, median), then the trace replayed {args.replays} time(s)
back to back (statistics pooled). SLO = {args.slo_scale:g} x the solo latency of the request's shape measured on the
same server. Total wall time {wall_s:.0f} s.{ladder_note}

## Machine
- uname: {info['uname']}
- nproc: {info['nproc']}; CPU: {info['cpu']}; GPU: {info['gpu']}
- Python {info['python']}; torch {info['torch']}; diffusers {info['diffusers']}; transformers {info['transformers']};
  tritonclient {info['tritonclient']}; server {info['tritonserver']}
- git {info['git']}; load average at write-up: {info['load_average']}

## Comparison
{comparison_table(reports, 'request_batch' if 'request_batch' in reports else None, args.compare if args.compare in reports else None)}
{replay_note}
Solo latency per shape (ms, one request alone on the same server):

| shape | {modes_hdr} |
|---{'|---' * len(reports)}|
{solo_rows}

Definitions: e2el = client send to the final (image) response; TTFS = client send to the first `progress`
response (completed requests only); server TTFS = `ditserve_time_to_first_step_seconds` (from the public model's
`execute`, so it excludes waiting for a free public instance); step batch size and stage means are diffs of the
server's histograms over the measured replays. Names: vLLM-Omni's diffusion benchmark (`throughput_qps`,
`latency_*` in s, `slo_attainment_rate`) and vLLM's benchmark_serving (`request_throughput`, `*_e2el_ms`).

## Raw loadgen report per mode
"""
    for m, rep in reports.items():
        raw = {k: val for k, val in rep.items() if k != "deployment_toml"}
        md += f"\n### {m}\nDeployment used:\n{fence(rep.get('deployment_toml', ''), 'toml')}\n{fence(json.dumps(raw, indent=2), 'json')}\n"
    md_path = stem.with_suffix(".md")
    md_path.write_text(md)
    return md_path, json_path


# ---- command line ------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", default="configs/tiny-pixart-sigma.toml", help="base deployment TOML")
    p.add_argument("--modes", default="request_batch,step",
                   help="comma-separated engine modes, run in this order; step:cost = step mode with "
                        "[engine] scheduler = \"cost\"; +KEY=VALUE sets another [engine] key (step:cost+late_queue_ms=3); "
                        "a #N suffix runs another server of a mode "
                        "(request_batch,step:cost,request_batch#2,step:cost#2: how much two servers of "
                        "one mode differ)")
    p.add_argument("--compare", default="step", help="the mode the verdict holds against request_batch "
                                                     "(default step; e.g. step:cost)")
    p.add_argument("--capacity", type=int, default=None, help="override [engine] capacity (default: the base's)")
    p.add_argument("--in-flight", type=int, default=0,
                   help="[engine] in_flight for every mode (0 = capacity): generations the public "
                        "models hold at once")
    p.add_argument("--accel", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override [accel] keys for every mode, e.g. text_encoder=compile vae_decode=compile "
                        "(lists: warm_sizes=1024x1024,512x512); default: the base's")
    src = p.add_argument_group("arrivals (default: --trace perf/traces/tiny_mixed_v1.jsonl)")
    src.add_argument("--trace")
    src.add_argument("--rate", type=float, help="draw a Poisson trace at this rate instead (seeded, see loadgen.py)")
    src.add_argument("--num-requests", type=int, default=None)
    src.add_argument("--sizes", default="1024", help="with --rate: sizes to mix (default 1024)")
    src.add_argument("--steps", default="20", help="with --rate: step counts to mix (default 20)")
    src.add_argument("--guidance", default="4.5")
    src.add_argument("--seed", type=int, default=0)
    src.add_argument("--cancel-rate", type=float, default=0.0)
    src.add_argument("--cancel-delay", default="0.05:0.5")
    src.add_argument("--cancel-by", choices=("stream", "id"), default=None,
                     help="cancel the gRPC call (stream) or the request id through the `cancel` model (id)")
    src.add_argument("--speedup", type=float, default=1.0)
    src.add_argument("--load-fractions", default=None,
                     help="load ladder, e.g. 0.5,0.8,0.95: measure saturation on the first mode's server, then "
                          "one Poisson trace (--num-requests, --sizes, --steps, --guidance, --seed) per fraction "
                          "of it, every mode replaying every trace on one server; one result pair per fraction")
    src.add_argument("--saturation-rps", type=float, default=None, help="with --load-fractions: skip measuring")
    src.add_argument("--saturation-seconds", type=float, default=30.0)
    src.add_argument("--saturation-concurrency", type=int, default=None, help="default 2 x capacity")
    lg = p.add_argument_group("load generator")
    lg.add_argument("--replays", type=int, default=1, help="replay the trace this many times per mode, pooled")
    lg.add_argument("--warmup", type=int, default=4)
    lg.add_argument("--slo-scale", type=float, default=3.0)
    lg.add_argument("--solo-repeats", type=int, default=3)
    lg.add_argument("--max-concurrency", type=int, default=None)
    lg.add_argument("--request-timeout", type=float, default=600.0)
    th = p.add_argument_group("success threshold")
    th.add_argument("--p99-ratio", type=float, default=0.9)
    th.add_argument("--ttfs-ratio", type=float, default=0.5)
    th.add_argument("--throughput-tolerance", type=float, default=0.05)
    out = p.add_argument_group("output")
    out.add_argument("--out-dir", default=str(ROOT / "perf" / "results"))
    out.add_argument("--machine", default=None, help="label in the file name (default: cpu or gpu-<name>)")
    out.add_argument("--server-timeout", type=float, default=600.0, help="readiness wait per server, s")
    out.add_argument("--keep-workdir", action="store_true", help="keep rendered repositories and server logs")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = " ".join(shlex.quote(a) for a in ["python", "perf/matched_control.py", *argv])
    if args.rate is None and not args.trace and not args.load_fractions:
        args.trace = DEFAULT_TRACE
    if args.trace and not Path(args.trace).is_absolute():
        args.trace = str(ROOT / args.trace) if not Path(args.trace).exists() else args.trace
    if args.load_fractions and args.trace:
        raise SystemExit("--load-fractions draws Poisson traces from --sizes/--steps/--guidance; drop --trace")
    if args.load_fractions:
        traces, source = {}, (f"poisson at {args.load_fractions} x saturation n={args.num_requests} sizes={args.sizes} "
                              f"steps={args.steps} guidance={args.guidance} seed={args.seed}")
    else:
        entries, source = loadgen.entries_from_args(_workload_args(args, args.rate, args.num_requests))
        traces = {"": entries}
    if args.trace and args.rate is None:
        source = source.replace(str(ROOT) + "/", "")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    base = load_deployment(Path(args.deployment).resolve())
    # The ladder's traces are drawn once saturation is known; their sizes are --sizes already.
    shapes = traces.get("") or [{"height": h, "width": w} for h, w in loadgen.parse_sizes(args.sizes)]
    overrides = parse_accel_overrides(args.accel)
    accel = variant_accel(overrides, trace_sizes(shapes, base.defaults, base.is_video))
    origin = "from --accel" if "warm_sizes" in overrides else "the trace's sizes"
    print(f"[matched_control] variants' [accel] warm_sizes: {', '.join(accel['warm_sizes']) or 'none'} ({origin}; "
          f"the base's: {', '.join(base.accel.warm_sizes) or 'none'})", file=sys.stderr, flush=True)

    # SIGTERM/SIGHUP end the run like Ctrl-C, so the `finally` blocks stop the servers.
    def _interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    work = Path(tempfile.mkdtemp(prefix="matched_control."))
    t0 = time.monotonic()
    by_mode: dict[str, dict[str, dict]] = {}     # mode -> trace name -> report
    saturation: dict | None = {} if args.load_fractions else None
    ok, interrupted = False, None
    try:
        for mode in modes:
            run_mode(mode, args, traces, source, work, by_mode.setdefault(mode, {}), accel, saturation)
        ok = True
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, a caller's deadline: keep what finished
        finished = [f"{mode} ({len(reps)}/{len(traces)} traces)" for mode, reps in by_mode.items() if reps]
        interrupted = f"interrupted ({exc or 'SIGINT'}) with {', '.join(finished) or 'nothing'} done"
        print(f"[matched_control] {interrupted}", file=sys.stderr)
    finally:
        if args.keep_workdir or not ok:
            print(f"[matched_control] scratch kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if not any(by_mode.values()):
        return 130
    info = machine_info(next((r.get("server_version") for reps in by_mode.values() for r in reps.values()
                              if r.get("server_version")), None))
    wall_s = time.monotonic() - t0
    clean = True
    fractions = {_load_name(f): f for f in _fractions(args)} if args.load_fractions else {}
    for name, entries in traces.items():
        reports = {mode: reps[name] for mode, reps in by_mode.items() if name in reps}
        if not reports:
            continue
        load = None if not name else {"name": name, "fraction": fractions[name], "saturation": saturation}
        md, js = write_results(args, command, info, reports, entries, source, wall_s, interrupted, load)
        v = verdict(reports, args)
        print(f"[matched_control] {name + ': ' if name else ''}verdict: {v['text']}", file=sys.stderr)
        print(f"[matched_control] wrote {md.relative_to(ROOT) if md.is_relative_to(ROOT) else md} and {js.name}",
              file=sys.stderr)
        clean = clean and all(r.get("lost") == 0 and r.get("duplicated") == 0 for r in reports.values())
    if saturation:
        print_ladder(by_mode, saturation)
    return 130 if interrupted else (0 if clean else 1)


def print_ladder(by_mode: dict[str, dict[str, dict]], saturation: dict) -> None:
    """One line per (load, mode): the numbers issue 22's summary JSON holds."""
    print(f"[matched_control] ladder at saturation {saturation['rps']} req/s ({saturation['source']}):", file=sys.stderr)
    for mode, reps in by_mode.items():
        for name, r in reps.items():
            print(f"[matched_control]   {name} {mode}: {_fmt(r.get('request_throughput'), 3)} req/s, p50 "
                  f"{_fmt(r.get('p50_e2el_ms'), 1)} ms, p99 {_fmt(r.get('p99_e2el_ms'), 1)} ms, TTFS p50 "
                  f"{_fmt(r.get('p50_ttfs_ms'), 1)} ms", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
