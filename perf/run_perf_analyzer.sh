#!/usr/bin/env bash
# One perf_analyzer measurement of the public text-to-image model, plus a raw-diffusers
# baseline, written up as perf/results/<date>-<cpu|gpu>-<model>-perf_analyzer.md.
#
# Usage:  bash perf/run_perf_analyzer.sh [options]
#   --url HOST:PORT     gRPC endpoint of a running server (default: $TRITON_GRPC_URL; when
#                       neither is set, start our own tritonserver and stop it at the end)
#   --stream            measure `txt2img_stream` with `--streaming` (default: `txt2img`, unary)
#   --concurrency A:B   perf_analyzer --concurrency-range (default 1:4)
#   --interval MS       perf_analyzer measurement window in ms (default 4000)
#   --baseline-runs N   serial raw-diffusers runs (default 20; 0 skips the baseline)
#   --server-threads N  OMP_NUM_THREADS for the server we start only (default: inherited, else
#                       the launcher's 1 thread per stub process)
#   --out FILE          result file (default perf/results/<date>-<dev>-<model>-perf_analyzer.md)
# Env equivalents: TRITON_GRPC_URL, PA_SERVER_THREADS, PA_STREAM=1, PA_CONCURRENCY, PA_INTERVAL_MS, BASELINE_RUNS,
# PA_STABILITY (percent, default 50), PA_MAX_TRIALS (default 6), PA_REQUESTS_PER_STREAM
# (default 0; N > 0 = one perf_analyzer call per level with --request-count N x concurrency),
# DITSERVE_DEPLOYMENT (deployment of the server we start), PERF_ANALYZER (binary),
# PYTHON (default .venv/bin/python).
#
# Exit status: 0 all levels measured; 3 some levels did not stabilise (the rest is written);
# 1 nothing measured or a setup step failed.
#
# Order: raw baseline first (no server running, so nothing competes with it), then the
# server, a short warm-up (every txt2img instance loaded), the measured sweep, the server
# stop, and the write-up. A trap stops the server on every exit path.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
INVOCATION="bash perf/run_perf_analyzer.sh${*:+ $*}"

URL="${TRITON_GRPC_URL:-}"
STREAM="${PA_STREAM:-0}"
CONCURRENCY="${PA_CONCURRENCY:-1:4}"
INTERVAL_MS="${PA_INTERVAL_MS:-4000}"
STABILITY="${PA_STABILITY:-50}"
MAX_TRIALS="${PA_MAX_TRIALS:-6}"
BASELINE_RUNS="${BASELINE_RUNS:-20}"
SERVER_THREADS="${PA_SERVER_THREADS:-}"
OUT=""
INPUT_DATA="perf/data/txt2img_prompts.json"
PY="${PYTHON:-$REPO_ROOT/.venv/bin/python}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --url) URL="$2"; shift 2 ;;
        --stream) STREAM=1; shift ;;
        --concurrency) CONCURRENCY="$2"; shift 2 ;;
        --interval) INTERVAL_MS="$2"; shift 2 ;;
        --baseline-runs) BASELINE_RUNS="$2"; shift 2 ;;
        --server-threads) SERVER_THREADS="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "[run_perf_analyzer] $*" >&2; }
die() { echo "[run_perf_analyzer] ERROR: $*" >&2; exit 1; }

[[ -x "$PY" ]] || die "no Python at $PY (run scripts/setup.sh, or set PYTHON=...)"
[[ -f "$INPUT_DATA" ]] || die "missing $INPUT_DATA"

if [[ "$STREAM" == 1 ]]; then MODEL=txt2img_stream; STREAM_FLAGS=(--streaming); else MODEL=txt2img; STREAM_FLAGS=(); fi
DEV_LABEL="${DEVICE_LABEL:-$("$PY" -c 'import torch; print("gpu" if torch.cuda.is_available() else "cpu")')}"
DATE="$(date +%F)"
OUT="${OUT:-perf/results/$DATE-$DEV_LABEL-$MODEL-perf_analyzer.md}"
mkdir -p "$(dirname "$OUT")"

PA="$(bash perf/install_perf_analyzer.sh | tail -n1)"
[[ -x "$PA" ]] || die "perf/install_perf_analyzer.sh gave no executable ($PA)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/perf_txt2img.XXXXXX")"
SERVER_PID=""
SERVER_STOP="not started by this script (--url / TRITON_GRPC_URL)"
SERVER_OMP="${SERVER_THREADS:-${OMP_NUM_THREADS:-1, the launcher default}}"

stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        log "stopping the server (pid $SERVER_PID)"
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        # _server.py stops tritonserver via the launcher (SIGINT, then SIGKILL of its group).
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
cleanup() {
    local rc=$?
    stop_server
    if [[ $rc -ne 0 ]]; then log "exit status $rc; scratch files kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# What else runs on this host (a shared machine makes absolute numbers meaningless).
{ echo "load average: $(cat /proc/loadavg)"; ps -eo pid,pcpu,etime,comm --sort=-pcpu | head -n 8; } >"$WORK/host_before.txt" 2>&1 || true

# ---- 1. raw diffusers baseline (same request as the first entry of the input data) ------
BASELINE_JSON="$WORK/baseline.json"
if [[ "$BASELINE_RUNS" -gt 0 ]]; then
    mapfile -t REQ < <("$PY" - "$INPUT_DATA" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))["data"][0]
def one(k):
    v = d[k]
    v = v["content"] if isinstance(v, dict) else v
    return v[0]
for k in ("prompt", "height", "width", "num_inference_steps", "guidance_scale", "seed"):
    print(one(k))
EOF
)
    BASELINE_CMD=("$PY" perf/raw_diffusers_baseline.py --runs "$BASELINE_RUNS" --prompt "${REQ[0]}"
        --height "${REQ[1]}" --width "${REQ[2]}" --steps "${REQ[3]}" --guidance-scale "${REQ[4]}" --seed "${REQ[5]}")
    log "raw diffusers baseline: $BASELINE_RUNS serial runs"
    "${BASELINE_CMD[@]}" >"$BASELINE_JSON" 2>"$WORK/baseline.stderr" \
        || { cat "$WORK/baseline.stderr" >&2; die "baseline failed"; }
    printf '%q ' "${BASELINE_CMD[@]}" | sed "s|$REPO_ROOT/||g; s/ $//" >"$WORK/baseline.cmd"
else
    echo '{}' >"$BASELINE_JSON"; echo "(skipped)" >"$WORK/baseline.cmd"
fi

# ---- 2. server ---------------------------------------------------------------------------
SERVER_LOG="$WORK/server.log"
if [[ -z "$URL" ]]; then
    log "starting tritonserver (log: $SERVER_LOG)"
    ${SERVER_THREADS:+env OMP_NUM_THREADS="$SERVER_THREADS"} "$PY" perf/_server.py --ready-file "$WORK/ready" --log "$SERVER_LOG" \
        ${DITSERVE_DEPLOYMENT:+--deployment "$DITSERVE_DEPLOYMENT"} 2>"$WORK/server.stderr" &
    SERVER_PID=$!
    while [[ ! -s "$WORK/ready" ]]; do
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.stderr" >&2; die "the server did not come up"; }
        sleep 0.5
    done
    URL="$(cut -d' ' -f1 "$WORK/ready")"
    log "server ready at grpc $URL"
fi

# ---- 3. warm-up (not recorded): every instance and stage runs at least once ---------------
WARM_N="${CONCURRENCY#*:}"; WARM_N="${WARM_N%%:*}"; [[ "$WARM_N" =~ ^[0-9]+$ && "$WARM_N" -gt 0 ]] || WARM_N=4
log "warm-up: $((2 * WARM_N)) requests at concurrency $WARM_N"
"$PA" -m "$MODEL" -i grpc -u "$URL" "${STREAM_FLAGS[@]}" --input-data "$INPUT_DATA" \
    --concurrency-range "$WARM_N" --request-count "$((2 * WARM_N))" >"$WORK/warmup.txt" 2>&1 \
    || { cat "$WORK/warmup.txt" >&2; die "warm-up failed"; }

# ---- 4. the measurement --------------------------------------------------------------------
# One perf_analyzer call per concurrency level, so a level that does not settle costs only
# that level (one call over the whole range aborts the rest of the sweep) and each call's
# output stays readable. Default: time windows of --interval ms; the stability band is wide
# (50 %) because the dev machines are shared 2-core hosts where other jobs come and go;
# perf_analyzer still needs 3 consecutive windows that agree, within PA_MAX_TRIALS windows
# (worst case 4 levels x 6 x 4 s). 2.48 exits 0 even then, so the output is checked.
# PA_REQUESTS_PER_STREAM=N > 0: a fixed --request-count (N x concurrency) instead; bounded
# but coarse: 2.48 reports its throughput over whole seconds, so short levels under-report it
# (the write-up's Little's-law column shows it).
PER_STREAM="${PA_REQUESTS_PER_STREAM:-0}"
CSV="$WORK/$MODEL.csv"
# No --bls-composing-models: naming the iterative-sequence `dit` there makes perf_analyzer
# 2.48 treat txt2img as a sequence model (async calls, sequence IDs). Per-stage numbers come
# from the server's statistics instead (below). --verbose-csv adds the "Avg latency" column;
# -v prints every measurement window, which is what explains a level that did not settle.
COMMON=(-m "$MODEL" -i grpc -u "$URL" "${STREAM_FLAGS[@]}" --input-data "$INPUT_DATA" --verbose-csv -v)
IFS=: read -r C_START C_END C_STEP <<<"$CONCURRENCY"
C_END="${C_END:-$C_START}"; C_STEP="${C_STEP:-1}"
: >"$WORK/pa.txt"; : >"$WORK/pa.cmd"; : >"$WORK/unstable.txt"; PA_RC=0
show_cmd() { printf '%q ' "$@" | sed "s|$REPO_ROOT/||g; s|$WORK/|\$SCRATCH/|g; s/ $//"; echo; }
T0=$(date +%s)
for c in $(seq "$C_START" "$C_STEP" "$C_END"); do
    if [[ "$PER_STREAM" -gt 0 ]]; then
        how=(--request-count "$((PER_STREAM * c))")
    else
        how=(--measurement-mode time_windows --measurement-interval "$INTERVAL_MS"
             --stability-percentage "$STABILITY" --max-trials "$MAX_TRIALS")
    fi
    cmd=("$PA" "${COMMON[@]}" --concurrency-range "$c" "${how[@]}" -f "$WORK/c$c.csv")
    show_cmd "${cmd[@]}" >>"$WORK/pa.cmd"
    log "concurrency $c"
    rm -f "$WORK/c$c.csv"
    set +e
    "${cmd[@]}" 2>&1 | tee "$WORK/c$c.txt" >&2
    rc=${PIPESTATUS[0]}
    set -e
    cat "$WORK/c$c.txt" >>"$WORK/pa.txt"
    if [[ $rc -ne 0 ]] || grep -q "Failed to obtain stable measurement" "$WORK/c$c.txt" || [[ ! -s "$WORK/c$c.csv" ]]; then
        [[ $rc -ne 0 ]] && PA_RC=$rc
        echo "$c" >>"$WORK/unstable.txt"
        log "concurrency $c: no stable measurement (exit $rc); continuing"
        continue
    fi
    if [[ ! -s "$CSV" ]]; then cp "$WORK/c$c.csv" "$CSV"; else tail -n +2 "$WORK/c$c.csv" >>"$CSV"; fi
done
PA_WALL=$(( $(date +%s) - T0 ))
log "perf_analyzer done after ${PA_WALL}s (levels without a stable measurement: $(tr '\n' ' ' <"$WORK/unstable.txt"))"

# ---- 5. context, stop, write-up ----------------------------------------------------------------
"$PY" - "$URL" >"$WORK/server_meta.txt" 2>&1 <<'EOF' || true
import sys
import tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
m = c.get_server_metadata()
print(f"{m.name} {m.version}")
EOF
# Cumulative server-side statistics of every model (warm-up included): for `dit`,
# inference count / execution count is the average step batch size.
"$PY" - "$URL" >"$WORK/server_stats.txt" 2>&1 <<'EOF' || true
import sys
import tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
print(f"{'model':<16}{'inferences':>11}{'executions':>11}{'avg batch':>10}{'success':>9}{'fail':>6}{'queue ms':>10}{'infer ms':>10}")
for m in c.get_inference_statistics(as_json=True).get("model_stats", []):
    s = m.get("inference_stats", {})
    def avg(k):
        d = s.get(k, {}); n = int(d.get("count", 0))
        return int(d.get("ns", 0)) / n / 1e6 if n else 0.0
    inf, ex = int(m.get("inference_count", 0)), int(m.get("execution_count", 0))
    ok, bad = int(s.get("success", {}).get("count", 0)), int(s.get("fail", {}).get("count", 0))
    print(f"{m['name']:<16}{inf:>11}{ex:>11}{(inf / ex if ex else 0):>10.2f}{ok:>9}{bad:>6}{avg('queue'):>10.2f}{avg('compute_infer'):>10.2f}")
EOF
if [[ -n "$SERVER_PID" ]]; then
    T1=$(date +%s)
    stop_server
    SERVER_STOP="stopped by this script in $(( $(date +%s) - T1 ))s"
    grep -q "Exit timeout expired" "$SERVER_LOG" && SERVER_STOP="$SERVER_STOP; tritonserver hit --exit-timeout-secs (see log excerpt)"
fi

"$PY" - "$OUT" "$WORK" "$MODEL" "$PA_RC" "$PA_WALL" "$INVOCATION" "$SERVER_STOP" "$REPO_ROOT" "$PA" "$SERVER_OMP" <<'EOF'
import csv, io, json, os, platform, re, subprocess, sys
from pathlib import Path

out, work, model, pa_rc, pa_wall, invocation, server_stop, root, pa_bin, server_omp = sys.argv[1:]
work = Path(work)

def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=root).stdout.strip()
    except Exception as exc:
        return f"({exc})"

def read(name, default=""):
    p = work / name
    return p.read_text(errors="replace") if p.exists() else default

cpu = "unknown"
for line in Path("/proc/cpuinfo").read_text().splitlines():
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip(); break
try:
    import torch, diffusers, transformers, tritonclient, numpy
    versions = (f"torch {torch.__version__} (cuda available: {torch.cuda.is_available()}, "
                f"threads {torch.get_num_threads()}), diffusers {diffusers.__version__}, "
                f"transformers {transformers.__version__}, numpy {numpy.__version__}, "
                f"tritonclient {tritonclient.__version__ if hasattr(tritonclient, '__version__') else sh('.venv/bin/pip show tritonclient | sed -n 2p')}")
except Exception as exc:
    versions = f"(import failed: {exc})"
gpu = sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null") or "none"

pa_txt = read("pa.txt")
csv_text = read(f"{model}.csv")
rows = list(csv.DictReader(io.StringIO(csv_text))) if csv_text else []
base = json.loads(read("baseline.json", "{}") or "{}")

# Server log: everything at E (error) level and any Python traceback, minus the lines a
# CPU-only host always prints (no CUDA driver, NVML, DCGM, pinned memory).
harmless = re.compile(r"CudaDriverHelper|NVML|DCGM|pinned memory|Exit timeout expired")
log_lines = read("server.log").splitlines()
problems = [l for l in log_lines if (re.match(r"^E\d{4} ", l) or "Traceback" in l or "rror:" in l) and not harmless.search(l)]
cpu_only_noise = [l for l in log_lines if harmless.search(l)]
shutdown = [l for l in log_lines if re.search(r"Timeout \d+: Found|unloaded|Exit timeout|failed to stop", l)]

def us_to_ms(v):
    return float(v) / 1000.0 if v not in (None, "") else float("nan")

PARTS = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
         "Server Compute Infer", "Server Compute Output", "Client Recv")

def avg_us(r):
    """perf_analyzer's average latency; without --verbose-csv, the sum of its breakdown."""
    if r.get("Avg latency"):
        return r["Avg latency"]
    return sum(float(r[k]) for k in PARTS if r.get(k))

table = []
unstable = {int(c) for c in read("unstable.txt").split()}
for c in sorted(unstable | {int(r["Concurrency"]) for r in rows}):
    r = next((r for r in rows if int(r["Concurrency"]) == c), None)
    if r is None:
        table.append(f"| {c} | did not stabilise | | | | | | | (windows in the raw output below) |")
        continue
    table.append(
        f"| {r['Concurrency']} | {float(r['Inferences/Second']):.2f} | {int(r['Concurrency']) * 1e6 / float(avg_us(r)):.2f} | {us_to_ms(avg_us(r)):.1f} | "
        f"{us_to_ms(r['p50 latency']):.1f} | {us_to_ms(r['p90 latency']):.1f} | {us_to_ms(r['p99 latency']):.1f} | "
        f"{us_to_ms(r['Server Queue']):.1f} | {us_to_ms(r['Server Compute Infer']):.1f} |")

ratio_lines = []
c1 = next((r for r in rows if r["Concurrency"] == "1"), None)
if c1 and base.get("mean_ms"):
    avg, p50 = us_to_ms(avg_us(c1)), us_to_ms(c1["p50 latency"])
    ratio_lines = [
        "Concurrency 1, served (perf_analyzer, client side) vs raw (in-process, serial). On a shared host the p50 "
        "ratio is the robust one; a mean is pulled by any burst of other work.",
        "",
        f"- served avg latency at concurrency 1: **{avg:.1f} ms**; raw diffusers mean: **{base['mean_ms']:.1f} ms** "
        f"-> served/raw = **{avg / base['mean_ms']:.2f}x**",
        f"- p50: served {p50:.1f} ms vs raw {base['p50_ms']:.1f} ms -> **{p50 / base['p50_ms']:.2f}x**",
    ]
    if len(rows) > 1:
        best = max(rows, key=lambda r: float(r["Inferences/Second"]))
        ratio_lines.append(
            f"- throughput: best served {float(best['Inferences/Second']):.2f} infer/s at concurrency {best['Concurrency']} "
            f"vs raw serial 1/p50 = {1000.0 / base['p50_ms']:.2f} gen/s -> **{float(best['Inferences/Second']) * base['p50_ms'] / 1000.0:.2f}x**")
elif not base:
    ratio_lines = ["- (baseline skipped)"]
else:
    ratio_lines = ["- (no concurrency-1 row in the CSV: perf_analyzer failed or concurrency 1 was not measured)"]

def fence(text, lang=""):
    return f"```{lang}\n{text.rstrip()}\n```"

md = f"""# perf_analyzer: `{model}` on {'CPU' if 'cuda available: False' in versions else 'GPU'} — {Path(out).name[:10]}

**CPU absolute times are not meaningful** (tiny random-weight pipeline, 2-core shared host);
read only the ratios (served vs raw diffusers on the same machine, and across concurrency).

## Reproduce
{fence(invocation, 'bash')}
perf_analyzer exit code: {pa_rc}; sweep wall time: {pa_wall} s. Server: {server_stop}.

perf_analyzer command(s) as run (`$SCRATCH` is a temporary dir; the CSV is copied below):
{fence(read('pa.cmd').strip(), 'bash')}
Warm-up before them (not recorded): the same model and data, `--concurrency-range N --request-count 2N`
with N the highest concurrency.

Raw baseline command:
{fence(read('baseline.cmd').strip(), 'bash')}

## Machine
- `uname -a`: {sh('uname -a')}
- nproc: {sh('nproc')}; CPU: {cpu}; GPU: {gpu}
- host activity before the run (this is a shared machine; other processes compete for the 2 cores):
{fence(read('host_before.txt').strip())}
- load average at write-up: {sh('cat /proc/loadavg')}
- Python {platform.python_version()} ({sys.executable}); {versions}
- OMP_NUM_THREADS: server {server_omp}; raw baseline {os.environ.get('OMP_NUM_THREADS', 'unset')}
- server: {read('server_meta.txt').strip() or 'unknown'}; perf_analyzer: {sh(f'{pa_bin} --version 2>&1 | head -n1')} ({pa_bin.replace(root + '/', '')})
- git: {sh('git rev-parse --short HEAD')} ({'dirty working tree' if sh('git status --porcelain') else 'clean'})
- input data: `perf/data/txt2img_prompts.json` (4 prompts, 64x64, 10 steps, guidance 4.5, seeds 1-4)

## Results (ms unless noted)
| concurrency | infer/s | concurrency / avg latency (1/s) | avg latency | p50 | p90 | p99 | server queue | server compute infer |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(table) if table else '| (no CSV rows) | | | | | | | | |'}

`infer/s` is perf_analyzer's throughput; `concurrency / avg latency` is the Little's-law
throughput implied by its latency (a cross-check: they agree when the client keeps every slot busy).

Server-side statistics of every model, cumulative over warm-up and all levels (for `dit`,
inferences / executions = average number of generations per denoise step; `queue`/`infer` are
per-request averages as Triton counts them, so for the decoupled `dit` they are per step):
{fence(read('server_stats.txt').strip() or '(unavailable)')}

## Served vs raw diffusers
{'Raw baseline skipped (--baseline-runs 0).' if not base else ''}Raw: `diffusers.PixArtSigmaPipeline` from `models/tiny-pixart-sigma`, same prompt/seed/shape/steps/guidance
as the first input-data entry, `use_resolution_binning=False, clean_caption=False`, output converted to
uint8 HWC, serial, {base.get('runs', 0)} runs after {base.get('warmup', 0)} warm-up, device {base.get('device', '?')},
{base.get('torch_threads', '?')} torch threads; mean {base.get('mean_ms', float('nan')):.1f} ms, p50 {base.get('p50_ms', float('nan')):.1f} ms,
p90 {base.get('p90_ms', float('nan')):.1f} ms, min {base.get('min_ms', float('nan')):.1f} ms, max {base.get('max_ms', float('nan')):.1f} ms.

{chr(10).join(ratio_lines)}

## Server log
Errors / tracebacks (excluding CPU-only noise): {len(problems)}
{fence(chr(10).join(problems[:40])) if problems else ''}
CPU-only noise seen (expected without a GPU): {len(cpu_only_noise)} line(s).

Shutdown:
{fence(chr(10).join(shutdown[-16:]) or '(server not started by this script)')}

## Raw perf_analyzer output
{fence(pa_txt)}

## CSV (`-f`)
{fence(csv_text or '(none written)', 'csv')}

## Raw baseline JSON
{fence(json.dumps(base, indent=2), 'json')}
"""
Path(out).write_text(md)
print(out)
EOF
log "wrote $OUT"
[[ -s "$CSV" ]] || die "perf_analyzer measured nothing (last exit $PA_RC); see $OUT"
if [[ -s "$WORK/unstable.txt" ]]; then
    log "WARNING: concurrency $(tr '\n' ' ' <"$WORK/unstable.txt")did not stabilise; the other levels are in $OUT"
    exit 3
fi
