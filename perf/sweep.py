#!/usr/bin/env python
"""Run one named perf_analyzer sweep (perf/sweeps.toml) and write it up with a plot.

    bash perf/run_perf_analyzer.sh --sweep cpu-txt2img-stream     # = python perf/sweep.py --sweep ...
    python perf/sweep.py --list
    python perf/sweep.py --sweep cpu-txt2img-unary --concurrency 1:2 --interval-ms 1000 --out-dir /tmp/r
    python perf/sweep.py --sweep cpu-txt2img-unary --pipeline pixart --url HOST:8001   # pixart_txt2img there

Why one driver for every sweep: each public model (unary or streaming, image or video,
closed or open loop, shared-memory output or not) is measured the same way, with the same
warm-up, one perf_analyzer call per level, the same raw diffusers baseline and the same
write-up, so results compare across models and machines, and sweeps differ only by their
rows in sweeps.toml.

Order: perf_analyzer (perf/install_perf_analyzer.sh); the raw diffusers baseline, before
the server exists so nothing competes with it; tritonserver on the repository rendered for
the sweep's deployment, loading only the measured public model and the stages behind it
(fewer stub processes: a faster start and less noise on small hosts); a warm-up at the
highest concurrency; one perf_analyzer call per level, so a level that does not settle
costs only that level; server statistics; the stop; the write-up
`<out-dir>/<date>-<machine>-<sweep>.md` beside `.csv` (perf_analyzer's, all levels),
`.json` (sweep, machine, baseline, levels) and `.png` (perf/plot.py).

With `--pipeline NAME` the sweep measures that pipeline's model (`NAME_txt2img` for a sweep
of `txt2img`: docs/pipelines.md): on the running server `--url` names (a repository of several
pipelines), or on its own server, whose repository it then renders as that one named pipeline.

Exit status: 0 every level measured; 3 some levels did not settle (the rest is written);
75 perf_analyzer cannot be installed here (no network); 1 anything else.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "scripts"), str(ROOT / "perf")]

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import plot  # noqa: E402
from ditserve.deployment import Deployment, load_deployment  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from ditserve.pipelines import PipelineNames  # noqa: E402
from ditserve.schema import request_inputs  # noqa: E402
from machine import fence, machine_info, machine_label, server_version, sh  # noqa: E402
from render_repository import public_models, render  # noqa: E402

SWEEPS_FILE = ROOT / "perf" / "sweeps.toml"
DEFAULT_SWEEP = "cpu-txt2img-unary"
SHM_MODES = ("none", "system", "cuda")
UNAVAILABLE = 75          # install_perf_analyzer.sh: no network to fetch it
PARTIAL = 3


def log(msg: str) -> None:
    print(f"[sweep] {msg}", file=sys.stderr, flush=True)


# ---- the table ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Sweep:
    """One row of sweeps.toml; the keys are documented at the top of that file."""

    name: str
    what: str
    deployment: str
    model: str
    data: str
    streaming: bool = False
    concurrency: tuple[int, ...] = ()
    request_rate: tuple[float, ...] = ()
    shared_memory: str = "none"
    interval_ms: int = 4000
    stability: int = 50       # wide: the dev machines are shared 2-core hosts
    max_trials: int = 6
    requests_per_level: int = 0
    warmup_requests: int = 0  # 0: twice the highest concurrency, at that concurrency
    baseline_runs: int = 20
    baseline_batch_sizes: tuple[int, ...] | None = None   # None: the baseline's default

    def __post_init__(self) -> None:
        problems = []
        if bool(self.concurrency) == bool(self.request_rate):
            problems.append("set exactly one of concurrency and request_rate")
        if self.shared_memory not in SHM_MODES:
            problems.append(f"shared_memory must be one of {SHM_MODES}")
        if self.model.endswith("_stream") and not self.streaming:
            problems.append(f"{self.model} is decoupled: perf_analyzer can only drive it with streaming = true")
        if self.requests_per_level and self.request_rate:
            problems.append("requests_per_level goes with concurrency only")
        if problems:
            raise ValueError(f"sweep {self.name}: " + "; ".join(problems))

    @property
    def levels(self) -> tuple[float, ...]:
        return self.concurrency or self.request_rate

    @property
    def level_name(self) -> str:
        return "concurrency" if self.concurrency else "request rate"

    @property
    def level_column(self) -> str:
        """The level's column in perf_analyzer's CSV."""
        return "Concurrency" if self.concurrency else "Request Rate"

    def warmup(self, capacity: int) -> tuple[int, int]:
        """(requests, concurrency) of the warm-up. By default twice the highest concurrency (the
        deployment's capacity for rate sweeps), so every public instance the sweep will use runs
        at least once; `warmup_requests` caps it where one request takes tens of seconds."""
        top = max(self.concurrency) if self.concurrency else capacity
        count = self.warmup_requests or 2 * top
        return count, min(top, count)

    def level_args(self, level: float) -> list[str]:
        # Open loop needs --async: with perf_analyzer's default synchronous calls, each of its
        # few threads waits for its response, so a saturated server slows the senders instead
        # of queueing requests (measured: 99 % of requests "delayed" at 40/s).
        flag = ["--concurrency-range"] if self.concurrency else ["--async", "--request-rate-range"]
        if self.requests_per_level:
            how = ["--request-count", str(self.requests_per_level * int(level))]
        else:
            how = ["--measurement-mode", "time_windows", "--measurement-interval", str(self.interval_ms),
                   "--stability-percentage", str(self.stability), "--max-trials", str(self.max_trials)]
        return [*flag, f"{level:g}", *how]


def load_sweeps(path: Path = SWEEPS_FILE) -> dict[str, Sweep]:
    known = {f.name for f in fields(Sweep)} - {"name"}
    sweeps = {}
    for name, row in tomllib.loads(path.read_text()).items():
        unknown = set(row) - known
        if unknown:
            raise ValueError(f"{path}: sweep {name} has unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        sweeps[name] = Sweep(name=name, **{k: tuple(v) if isinstance(v, list) else v for k, v in row.items()})
    return sweeps


def parse_range(text: str, kind: type) -> tuple:
    """perf_analyzer's range syntax, 'A', 'A:B' or 'A:B:STEP', as the list of levels."""
    parts = [kind(p) for p in text.split(":")]
    start, end, step = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else kind(1)
    if step <= 0 or end < start:
        raise ValueError(f"bad range {text!r}: want A, A:B or A:B:STEP with A <= B and STEP > 0")
    count = int(round((end - start) / step)) + 1
    return tuple(kind(start + i * step) for i in range(count))


def with_overrides(sweep: Sweep, args: argparse.Namespace) -> Sweep:
    """The sweep with the command line's overrides (shorter runs, another level range)."""
    changes: dict = {}
    if args.concurrency:
        changes.update(concurrency=parse_range(args.concurrency, int), request_rate=())
    if args.request_rate:
        changes.update(request_rate=parse_range(args.request_rate, float), concurrency=())
    for key in ("interval_ms", "stability", "max_trials", "requests_per_level", "warmup_requests", "baseline_runs"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    if args.baseline_batch_sizes is not None:
        changes["baseline_batch_sizes"] = tuple(int(b) for b in args.baseline_batch_sizes.split(",") if b.strip())
    return replace(sweep, **changes)


# ---- input data --------------------------------------------------------------------------

def data_entries(sweep: Sweep, deployment: Deployment) -> list[dict]:
    """The input-data entries as {input: value}, checked: every entry names every input of the
    task (perf_analyzer's shared-memory mode rejects absent optional inputs, and a fixed
    request is what makes the served and raw numbers comparable)."""
    names = {spec.name for spec in request_inputs(deployment)}
    entries = []
    for i, raw in enumerate(json.loads((ROOT / sweep.data).read_text())["data"]):
        entry = {k: (v["content"] if isinstance(v, dict) else v)[0] for k, v in raw.items()}
        if set(entry) != names:
            raise ValueError(f"{sweep.data} entry {i}: missing {sorted(names - set(entry))}, unknown "
                             f"{sorted(set(entry) - names)}; every entry names every input of {deployment.task}")
        if sweep.shared_memory != "none" and entry.get("output_format", "raw") != "raw":
            raise ValueError(f"{sweep.data} entry {i}: shared-memory sweeps need output_format raw "
                             "(an MP4's size is not known ahead)")
        entries.append(entry)
    return entries


def media_bytes(entries: list[dict]) -> int:
    """Size of the largest media in the data (uint8 [F,] H, W, 3): each output region's size."""
    return max(e.get("num_frames", 1) * e["height"] * e["width"] * 3 for e in entries)


# ---- the steps ---------------------------------------------------------------------------

class Unavailable(RuntimeError):
    """perf_analyzer cannot be installed on this machine (no network to fetch it)."""


def install_perf_analyzer() -> str:
    proc = subprocess.run(["bash", str(ROOT / "perf" / "install_perf_analyzer.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode == UNAVAILABLE:
        raise Unavailable("perf/install_perf_analyzer.sh: no network to fetch perf_analyzer (see above)")
    if proc.returncode or not proc.stdout.strip():
        raise RuntimeError(f"perf/install_perf_analyzer.sh failed (exit {proc.returncode})")
    return proc.stdout.strip().splitlines()[-1]


def run_baseline(sweep: Sweep, request: dict, threads: str, work: Path) -> tuple[dict, list[str]]:
    """The raw diffusers baseline for the first input-data entry (JSON, command).

    It runs with the server stages' CPU threads (OMP_NUM_THREADS), so the served/raw ratio
    isolates serving overhead rather than threading; and torch's default of one thread per
    core collapses on a shared 2-core host (measured here: p50 3.8 s instead of 18 ms while
    other jobs ran)."""
    if sweep.baseline_runs <= 0:
        return {}, []
    cmd = [sys.executable, str(ROOT / "perf" / "raw_diffusers_baseline.py"), "--deployment", sweep.deployment,
           "--runs", str(sweep.baseline_runs), "--prompt", request["prompt"],
           "--negative-prompt", request["negative_prompt"], "--height", str(request["height"]),
           "--width", str(request["width"]), "--steps", str(request["num_inference_steps"]),
           "--guidance-scale", str(request["guidance_scale"]), "--seed", str(request["seed"])]
    if "num_frames" in request:
        cmd += ["--frames", str(request["num_frames"])]
    if "image" in request:
        cmd += ["--image-data", str(ROOT / sweep.data)]
    if sweep.baseline_batch_sizes is not None:
        cmd += ["--batch-sizes", ",".join(map(str, sweep.baseline_batch_sizes))]
    log(f"raw diffusers baseline: {sweep.baseline_runs} serial runs, then batched")
    with open(work / "baseline.stderr", "w") as err:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": threads})
    if proc.returncode:
        raise RuntimeError("baseline failed:\n" + (work / "baseline.stderr").read_text()[-3000:])
    return json.loads(proc.stdout), cmd


@contextlib.contextmanager
def serving(sweep: Sweep, deployment: Deployment, work: Path, url: str | None,
            pipeline: str | None = None) -> Iterator[str]:
    """The gRPC URL to measure: `url` as given, else a server of our own (its repository rendered
    as the named `pipeline`, if any), stopped on exit."""
    if url:
        yield url
        return
    repo = work / "repository"
    render(ROOT / "model_repository", repo, deployment, pipeline=pipeline)
    public = {p.name for p in public_models(repo)}
    if sweep.model not in public:
        raise ValueError(f"deployment {sweep.deployment} serves {sorted(public)}, not {sweep.model}")
    load = sorted(p.parent.name for p in repo.glob("*/config.pbtxt") if p.parent.name not in public - {sweep.model})
    http, grpc, metrics = free_ports(3)
    explicit = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in load)]
    server = TritonServer(ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                                        deployment=str(ROOT / sweep.deployment), extra_args=explicit),
                          log_path=work / "server.log")
    log(f"starting tritonserver with {', '.join(load)} (log: {work / 'server.log'})")
    t0 = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout_s=900)
        log(f"server ready at grpc {server.grpc_url} after {time.monotonic() - t0:.0f}s")
        yield server.grpc_url
    finally:
        t0 = time.monotonic()
        server.stop()
        (work / "server.stop").write_text(f"stopped by this script in {time.monotonic() - t0:.0f}s")


@dataclass
class Level:
    level: float
    command: list[str]
    output: str
    rc: int
    row: dict | None        # the CSV row; None when the level did not settle

    @property
    def delayed(self) -> str:
        """perf_analyzer's share of requests sent later than the schedule (request-rate levels)."""
        found = re.findall(r"([\d.]+)% of the requests were delayed", self.output)
        return f"{found[-1]} %" if found else "0 %"


def run_pa(cmd: list[str], timeout_s: float) -> tuple[str, int]:
    """perf_analyzer's output and exit status; 124 when it was killed after `timeout_s`."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
        return proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout or ""
        partial = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        return partial + f"\n(killed after {timeout_s:g}s without finishing)\n", 124


def run_level(base: list[str], sweep: Sweep, level: float, timeout_s: float, work: Path) -> Level:
    csv_path = work / f"level-{level:g}.csv"
    # --verbose-csv adds the "Avg latency" column; -v prints every window, which is what
    # explains a level that did not settle.
    cmd = [*base, *sweep.level_args(level), "--verbose-csv", "-v", "-f", str(csv_path)]
    log(f"{sweep.level_name} {level:g}")
    output, rc = run_pa(cmd, timeout_s)
    rows = list(csv.DictReader(csv_path.read_text().splitlines())) if csv_path.exists() else []
    # perf_analyzer 2.48 exits 0 even when a level never settles; its output says so.
    settled = rc == 0 and rows and "Failed to obtain stable measurement" not in output
    result = Level(level, cmd, output, rc, rows[0] if settled else None)
    if result.row:
        log(f"  {rate(result.row['Inferences/Second'])} infer/s, p50 {ms(result.row['p50 latency']):.1f} ms, "
            f"p99 {ms(result.row['p99 latency']):.1f} ms")
    else:
        log(f"  no stable measurement (exit {rc}); continuing\n" + output[-1500:])
    return result


def server_statistics(url: str) -> str:
    """Cumulative per-model statistics: for `dit`, inferences / executions is the mean step batch."""
    try:
        import tritonclient.grpc as grpcclient

        stats = grpcclient.InferenceServerClient(url).get_inference_statistics(as_json=True)
    except Exception as exc:  # noqa: BLE001 (a write-up without them beats none)
        return f"(unavailable: {exc})"
    lines = [f"{'model':<24}{'inferences':>11}{'executions':>11}{'avg batch':>10}{'success':>9}{'fail':>6}"
             f"{'queue ms':>10}{'infer ms':>10}"]
    for m in stats.get("model_stats", []):
        s = m.get("inference_stats", {})

        def avg_ms(key: str) -> float:
            n = int(s.get(key, {}).get("count", 0))
            return int(s.get(key, {}).get("ns", 0)) / n / 1e6 if n else 0.0

        inf, ex = int(m.get("inference_count", 0)), int(m.get("execution_count", 0))
        lines.append(f"{m['name']:<24}{inf:>11}{ex:>11}{(inf / ex if ex else 0):>10.2f}"
                     f"{int(s.get('success', {}).get('count', 0)):>9}{int(s.get('fail', {}).get('count', 0)):>6}"
                     f"{avg_ms('queue'):>10.2f}{avg_ms('compute_infer'):>10.2f}")
    return "\n".join(lines)


# ---- write-up ----------------------------------------------------------------------------

def ms(us: str) -> float:
    return float(us) / 1000.0


def rate(per_s: float | str) -> str:
    """A throughput to three significant digits: a 20 s video generation is 0.0476/s, not 0.05."""
    return f"{float(per_s):.3g}"


def result_stem(out_dir: Path, label: str, sweep: Sweep) -> Path:
    """<date>-<machine>-<sweep>; a machine label that is the sweep's first word is not repeated."""
    name = sweep.name if sweep.name.split("-")[0] == label else f"{label}-{sweep.name}"
    return out_dir / f"{dt.date.today().isoformat()}-{name}"


def ratios(sweep: Sweep, rows: list[dict], base: dict) -> list[str]:
    """Served vs raw: latency at the lowest measured level, throughput at the best one."""
    if not base:
        return ["- (baseline skipped)"]
    if not rows:
        return ["- (no level measured)"]
    low = rows[0]
    best = max(rows, key=lambda r: float(r["Inferences/Second"]))
    served_best = float(best["Inferences/Second"])
    raw_serial = 1000.0 / base["p50_ms"]
    lines = [
        f"Latency at the lowest level ({sweep.level_name} {low[sweep.level_column]}), served (perf_analyzer, client "
        "side) vs raw (in-process, serial); on a shared host the p50 ratio is the robust one.",
        "",
        f"- p50: served {ms(low['p50 latency']):.1f} ms vs raw {base['p50_ms']:.1f} ms -> "
        f"**{ms(low['p50 latency']) / base['p50_ms']:.2f}x**",
        f"- mean: served {ms(low['Avg latency']):.1f} ms vs raw {base['mean_ms']:.1f} ms -> "
        f"**{ms(low['Avg latency']) / base['mean_ms']:.2f}x**",
        f"- throughput: best served {rate(served_best)}/s ({sweep.level_name} {best[sweep.level_column]}) vs raw serial "
        f"1/p50 = {rate(raw_serial)}/s -> **{served_best / raw_serial:.2f}x**",
    ]
    if base.get("best_batch"):
        bb = base["best_batch"]
        lines.append(f"- throughput: best served {rate(served_best)}/s vs raw best batch (B={bb['batch_size']}, "
                     f"{bb['mean_ms']:.1f} ms per call) {rate(bb['generations_per_s'])}/s -> "
                     f"**{served_best / bb['generations_per_s']:.2f}x**")
    return lines


def baseline_summary(base: dict) -> str:
    if not base:
        return "Raw baseline skipped."
    batched = ", ".join(f"B={b['batch_size']} {b['mean_ms']:.1f} / {rate(b['generations_per_s'])}" for b in base["batched"])
    return (f"Raw: `{base['pipeline']}` from `{base['model'].replace(f'{ROOT}/', '')}`, the first input-data entry's "
            f"request, output uint8 as the server returns, device {base['device']}, {base['dtype']}, "
            f"torch threads: {base['torch_threads']}. Serial: {base['runs']} runs after {base['warmup']} warm-up, mean "
            f"{base['mean_ms']:.1f} ms, p50 {base['p50_ms']:.1f} ms, p90 {base['p90_ms']:.1f} ms. Batched (ms per call "
            f"/ generations per s): {batched or 'skipped'}.")


def results_table(sweep: Sweep, levels: list[Level]) -> str:
    streaming = any(lv.row and "Response Throughput" in lv.row for lv in levels)
    head = [sweep.level_name, "infer/s"] + (["responses/s"] if streaming else [])
    head += ["concurrency / avg latency (1/s)"] if sweep.concurrency else ["requests delayed"]
    head += ["avg latency", "p50", "p90", "p95", "p99", "server queue", "server compute infer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lv in levels:
        r = lv.row
        if r is None:
            lines.append(f"| {lv.level:g} | did not settle (exit {lv.rc}; windows in the raw output below) |")
            continue
        cells = [f"{lv.level:g}", rate(r['Inferences/Second'])]
        cells += [rate(r['Response Throughput'])] if streaming else []
        cells += [rate(lv.level * 1e6 / float(r['Avg latency']))] if sweep.concurrency else [lv.delayed]
        cells += [f"{ms(r[k]):.1f}" for k in ("Avg latency", "p50 latency", "p90 latency", "p95 latency",
                                               "p99 latency", "Server Queue", "Server Compute Infer")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def server_log_summary(work: Path, tail: bool) -> str:
    """Errors in the server log while it served and while it stopped (counted apart: a stub that
    crashes on its way out did not disturb the measurement), the shutdown, and with `tail` the
    last lines before the stop (a failed run's evidence)."""
    path = work / "server.log"
    if not path.exists():
        return "(server not started by this script)"
    log_lines = path.read_text(errors="replace").splitlines()
    stopping = re.compile(r"Signal \(2\) received|Timeout \d+: Found|unloaded|Exit timeout|failed to stop")
    stop_at = next((i for i, ln in enumerate(log_lines) if stopping.search(ln)), len(log_lines))
    # Error-level lines, tracebacks and crashes, minus what a CPU-only host always prints.
    error = re.compile(r"^E\d{4} |Traceback|rror:|not healthy|unhealthy|Fatal Python error|Killed")
    harmless = re.compile(r"CudaDriverHelper|NVML|DCGM|pinned memory|Exit timeout expired")

    def problems(lines: list[str]) -> str:
        found = [ln for ln in lines if error.search(ln) and not harmless.search(ln)]
        return f"{len(found)}\n" + (fence("\n".join(found[:40])) + "\n" if found else "")

    stop = (work / "server.stop").read_text() if (work / "server.stop").exists() else "not recorded"
    shutdown = [ln for ln in log_lines[stop_at:] if stopping.search(ln)]
    return (f"Errors / tracebacks while serving (excluding CPU-only noise): {problems(log_lines[:stop_at])}"
            f"Errors / tracebacks while stopping: {problems(log_lines[stop_at:])}"
            f"\nServer: {stop}. Shutdown:\n" + fence("\n".join(shutdown[-16:]) or "(nothing logged)")
            + (f"\n\nLast lines of the log before the stop:\n{fence(chr(10).join(log_lines[:stop_at][-60:]))}"
               if tail else ""))


@dataclass
class Run:
    """Everything one sweep run produced, for the write-up."""

    sweep: Sweep
    invocation: str
    pa: str
    host_before: str
    shm_bytes: int
    threads: str
    base: dict
    base_cmd: list[str]
    warmup: list[str]
    warmup_failure: str     # the warm-up's output when it failed, else ""
    levels: list[Level]
    stats: str
    info: dict
    wall_s: float = 0.0


def write_results(stem: Path, run: Run, work: Path) -> list[Path]:
    sweep, info, pa, levels, base = run.sweep, run.info, run.pa, run.levels, run.base
    stem.parent.mkdir(parents=True, exist_ok=True)
    rows = [lv.row for lv in levels if lv.row]
    csv_path = stem.with_suffix(".csv")
    if rows:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    def shown(cmd: list[str]) -> str:
        return shlex.join(cmd).replace(f"{work}/", "$SCRATCH/").replace(f"{ROOT}/", "")

    title = f"{sweep.name}: {sweep.model} ({Path(sweep.deployment).stem}), {machine_label(info)}"
    meta = {"title": title, "sweep": asdict(sweep), "command": run.invocation, "machine": info,
            "perf_analyzer": pa, "levels": [{"level": lv.level, "rc": lv.rc, "row": lv.row} for lv in levels],
            "baseline": base}
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    files = [stem.with_suffix(".md"), stem.with_suffix(".json")]
    plot_note = ""
    if rows:
        files.append(csv_path)
        try:
            files.append(plot.draw(csv_path, base, title, stem.with_suffix(".png")))
            plot_note = f"![throughput vs latency]({stem.name}.png)"
        except ImportError as exc:  # the GPU image has no matplotlib: draw it later where one is
            plot_note = f"(no plot: {exc}; draw it with `python perf/plot.py {csv_path.relative_to(ROOT)}`)"
    streaming_note = ("perf_analyzer prints \"using the first response for measuring latency\" for decoupled "
                      "models, yet its latency runs from the send to the last response, the media (it takes the "
                      "last response's timestamp; here it is never below the server's compute time of the whole "
                      "generation), so it compares with the unary sweeps.\n\n" if sweep.streaming else "")
    columns_note = "`infer/s` is perf_analyzer's throughput (completed generations/s)" + (
        "; `concurrency / avg latency` is the Little's-law throughput its latency implies (they agree when the "
        "client keeps every slot busy)." if sweep.concurrency else
        "; `requests delayed` is the share perf_analyzer sent later than the schedule (its warning), i.e. how far "
        "the offered rate was not met by the client.")
    md = f"""# perf_analyzer sweep `{sweep.name}`: `{sweep.model}` — {dt.date.today().isoformat()}

{sweep.what}.

Deployment `{sweep.deployment}`; input data `{sweep.data}`; {'gRPC streaming' if sweep.streaming else 'gRPC'};
shared memory: {sweep.shared_memory}{f" (output regions of {run.shm_bytes} bytes)" if sweep.shared_memory != 'none' else ''}.
{'**CPU absolute times are not meaningful** (tiny random-weight pipeline, shared 2-core host); read the ratios.' if info['gpu'] == 'none' else ''}

## Reproduce
{fence(run.invocation, 'bash')}
Sweep wall time {run.wall_s:.0f} s. perf_analyzer calls as run (`$SCRATCH` is a temporary dir; the CSV is below
and in `{csv_path.name}`):
{fence(chr(10).join(shown(lv.command) for lv in levels), 'bash')}
Warm-up before them (not recorded):
{fence(shown(run.warmup), 'bash')}
{f"**The warm-up failed, so no level was measured:**{chr(10)}{fence(run.warmup_failure[-3000:])}" if run.warmup_failure else ''}
Raw baseline:
{fence(shown(run.base_cmd) if run.base_cmd else '(skipped)', 'bash')}

## Machine
- `uname -a`: {info['uname']}
- nproc: {info['nproc']}; CPU: {info['cpu']}; GPU: {info['gpu']}
- host activity before the run (other processes compete for the cores on a shared machine):
{fence(run.host_before)}
- load average at write-up: {sh('cat /proc/loadavg')}
- Python {info['python']}; torch {info['torch']}, diffusers {info['diffusers']}, transformers {info['transformers']}, tritonclient {info['tritonclient']}
- server: {info['tritonserver']}; perf_analyzer: {sh(shlex.quote(pa) + ' --version 2>&1 | head -n1')} (`{pa.replace(f'{ROOT}/', '')}`)
- OMP_NUM_THREADS (every server stub and the raw baseline): {run.threads}
- git: {info['git']}

## Results (ms unless noted)
{results_table(sweep, levels)}

{streaming_note}{columns_note}

{plot_note}

Server-side statistics of every loaded model, cumulative over warm-up and all levels (for `dit`,
inferences / executions = mean generations per denoise step; `queue`/`infer` are per-request
averages as Triton counts them, so for the decoupled `dit` they are per step):
{fence(run.stats)}

## Served vs raw diffusers
{baseline_summary(base)}

{chr(10).join(ratios(sweep, rows, base))}

## Server log
{server_log_summary(work, tail=not rows)}

## Raw perf_analyzer output
{fence(chr(10).join(lv.output for lv in levels))}

## CSV (`-f`, one row per settled level)
{fence(csv_path.read_text() if rows else '(none written)', 'csv')}

## Raw baseline JSON
{fence(json.dumps(base, indent=2), 'json')}
"""
    stem.with_suffix(".md").write_text(md)
    return files


# ---- main --------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", default=DEFAULT_SWEEP, help=f"a name from perf/sweeps.toml (default {DEFAULT_SWEEP})")
    ap.add_argument("--list", action="store_true", help="list the sweeps and exit")
    ap.add_argument("--url", default=None, help="gRPC HOST:PORT of a running server to measure instead of starting one")
    ap.add_argument("--pipeline", default=None, metavar="NAME",
                    help="measure the named pipeline's model (NAME_<model>, docs/pipelines.md)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "perf" / "results")
    ap.add_argument("--threads", default=None,
                    help="OMP_NUM_THREADS of every server stub and of the raw baseline "
                         "(default: $OMP_NUM_THREADS, else 1)")
    ap.add_argument("--level-timeout-s", type=float, default=900,
                    help="kill a perf_analyzer call (warm-up or level) after this long: a stalled server must "
                         "not hang the sweep (default 900)")
    over = ap.add_argument_group("overrides of the sweep's row (shorter runs, other levels)")
    over.add_argument("--concurrency", default=None, metavar="A:B[:S]")
    over.add_argument("--request-rate", default=None, metavar="A:B[:S]")
    over.add_argument("--interval-ms", type=int, default=None)
    over.add_argument("--stability", type=int, default=None, metavar="PERCENT")
    over.add_argument("--max-trials", type=int, default=None)
    over.add_argument("--requests-per-level", type=int, default=None, metavar="N")
    over.add_argument("--warmup-requests", type=int, default=None, metavar="N",
                      help="warm-up requests (default: twice the highest concurrency)")
    over.add_argument("--baseline-runs", type=int, default=None, metavar="N", help="0 skips the baseline")
    over.add_argument("--baseline-batch-sizes", default=None, metavar="1,2,4", help="'' skips the batched part")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    sweeps = load_sweeps()
    if args.list:
        for s in sweeps.values():
            print(f"{s.name:<24} {s.what}")
        return 0
    if args.sweep not in sweeps:
        print(f"unknown sweep {args.sweep!r}; known: {', '.join(sweeps)}", file=sys.stderr)
        return 2
    sweep = with_overrides(sweeps[args.sweep], args)
    try:
        sweep = replace(sweep, model=PipelineNames(args.pipeline).model(sweep.model))
    except ValueError as exc:
        print(f"--pipeline: {exc}", file=sys.stderr)
        return 2
    deployment = load_deployment(sweep.deployment)
    entries = data_entries(sweep, deployment)
    # SIGTERM -> SystemExit, so the server is stopped on every exit path.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    invocation = shlex.join(["bash", "perf/run_perf_analyzer.sh", *argv])
    t_start = time.monotonic()
    try:
        pa = install_perf_analyzer()
    except Unavailable as exc:
        log(str(exc))
        return UNAVAILABLE
    host_before = sh("echo \"load average: $(cat /proc/loadavg)\"; ps -eo pid,pcpu,etime,comm --sort=-pcpu | head -n 8")
    shm_bytes = media_bytes(entries)
    with tempfile.TemporaryDirectory(prefix=f"sweep-{sweep.name}-") as tmp:
        work = Path(tmp)
        # The launcher gives every stub one thread unless OMP_NUM_THREADS says otherwise.
        threads = args.threads or os.environ.get("OMP_NUM_THREADS") or "1"
        base, base_cmd = run_baseline(sweep, entries[0], threads, work)
        os.environ["OMP_NUM_THREADS"] = threads
        with serving(sweep, deployment, work, args.url, args.pipeline) as url:
            base_pa = [pa, "-m", sweep.model, "-i", "grpc", "-u", url, "--input-data", str(ROOT / sweep.data)]
            base_pa += ["--streaming"] if sweep.streaming else []
            if sweep.shared_memory != "none":
                base_pa += ["--shared-memory", sweep.shared_memory, "--output-shared-memory-size", str(shm_bytes)]
            warm_count, warm_n = sweep.warmup(deployment.engine.capacity)
            warmup = [*base_pa, "--concurrency-range", str(warm_n), "--request-count", str(warm_count)]
            log(f"warm-up: {warm_count} requests at concurrency {warm_n}")
            warmup_output, warmup_rc = run_pa(warmup, args.level_timeout_s)
            if warmup_rc:
                log(f"warm-up failed (exit {warmup_rc}), so no level is measured:\n{warmup_output[-2000:]}")
            levels = [] if warmup_rc else [run_level(base_pa, sweep, level, args.level_timeout_s, work)
                                           for level in sweep.levels]
            run = Run(sweep, invocation, pa, host_before, shm_bytes, threads, base, base_cmd, warmup,
                      warmup_output if warmup_rc else "", levels, stats=server_statistics(url),
                      info=machine_info(server_version(url)))
        run.wall_s = time.monotonic() - t_start
        files = write_results(result_stem(args.out_dir, machine_label(run.info), sweep), run, work)
    for path in files:
        log(f"wrote {path}")
    unsettled = [f"{lv.level:g}" for lv in run.levels if lv.row is None]
    if len(unsettled) == len(run.levels):
        log("no level measured")
        return 1
    if unsettled:
        log(f"WARNING: {sweep.level_name} {', '.join(unsettled)} did not settle; the other levels are written")
        return PARTIAL
    return 0


if __name__ == "__main__":
    sys.exit(main())
