#!/usr/bin/env bash
# One perf_analyzer measurement of the public text-to-image model, plus a raw-diffusers
# baseline, written up as perf/results/<date>-<cpu|gpu>-<model>-perf_analyzer.md.
#
# Usage:  bash perf/run_perf_analyzer.sh [options]
#   --url HOST:PORT     gRPC endpoint of a running server (default: $TRITON_GRPC_URL; when
#                       neither is set, start our own tritonserver and stop it at the end)
#   --stream            measure `txt2img_stream` with `--streaming` (default: `txt2img`, unary)
#   --concurrency A:B   perf_analyzer --concurrency-range (default 1:4)
#   --interval MS       measurement window in ms (default 5000)
#   --baseline-runs N   serial raw-diffusers runs (default 20; 0 skips the baseline)
#   --out FILE          result file (default perf/results/<date>-<dev>-<model>-perf_analyzer.md)
# Env equivalents: TRITON_GRPC_URL, PA_STREAM=1, PA_CONCURRENCY, PA_INTERVAL_MS,
# PA_STABILITY (percent, default 25), PA_MAX_TRIALS (default 6), BASELINE_RUNS,
# DITSERVE_DEPLOYMENT (deployment of the server we start), PERF_ANALYZER (binary),
# PYTHON (default .venv/bin/python).
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
INTERVAL_MS="${PA_INTERVAL_MS:-5000}"
STABILITY="${PA_STABILITY:-25}"
MAX_TRIALS="${PA_MAX_TRIALS:-6}"
BASELINE_RUNS="${BASELINE_RUNS:-20}"
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
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
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

stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        log "stopping the server (pid $SERVER_PID)"
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        # _server.py gives tritonserver up to 30 s, then SIGKILLs its process group.
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
cleanup() {
    local rc=$?
    stop_server
    if [[ $rc -ne 0 ]]; then log "failed (rc $rc); scratch files kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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
    "$PY" perf/_server.py --ready-file "$WORK/ready" --log "$SERVER_LOG" \
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
CSV="$WORK/$MODEL.csv"
PA_CMD=("$PA" -m "$MODEL" -i grpc -u "$URL" "${STREAM_FLAGS[@]}" --input-data "$INPUT_DATA"
    --concurrency-range "$CONCURRENCY" --measurement-mode time_windows --measurement-interval "$INTERVAL_MS"
    --stability-percentage "$STABILITY" --max-trials "$MAX_TRIALS" --percentile 50 -f "$CSV")
printf '%q ' "${PA_CMD[@]}" | sed "s|$REPO_ROOT/||g; s|$WORK/|\$SCRATCH/|g; s/ $//" >"$WORK/pa.cmd"
log "running: ${PA_CMD[*]}"
T0=$(date +%s)
set +e
"${PA_CMD[@]}" 2>&1 | tee "$WORK/pa.txt" >&2
PA_RC=${PIPESTATUS[0]}
set -e
PA_WALL=$(( $(date +%s) - T0 ))
log "perf_analyzer exit code $PA_RC after ${PA_WALL}s"

# ---- 5. context, stop, write-up ----------------------------------------------------------------
"$PY" - "$URL" >"$WORK/server_meta.txt" 2>&1 <<'EOF' || true
import sys
import tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
m = c.get_server_metadata()
print(f"{m.name} {m.version}")
EOF
if [[ -n "$SERVER_PID" ]]; then
    T1=$(date +%s)
    stop_server
    SERVER_STOP="stopped by this script in $(( $(date +%s) - T1 ))s"
    grep -q "Exit timeout expired" "$SERVER_LOG" && SERVER_STOP="$SERVER_STOP; tritonserver hit --exit-timeout-secs (see log excerpt)"
fi

"$PY" - "$OUT" "$WORK" "$MODEL" "$PA_RC" "$PA_WALL" "$INVOCATION" "$SERVER_STOP" "$REPO_ROOT" "$PA" <<'EOF'
import csv, io, json, os, platform, re, subprocess, sys
from pathlib import Path

out, work, model, pa_rc, pa_wall, invocation, server_stop, root, pa_bin = sys.argv[1:]
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
    return float(v) / 1000.0

table = []
for r in rows:
    table.append(
        f"| {r['Concurrency']} | {float(r['Inferences/Second']):.2f} | {us_to_ms(r['Avg latency']):.1f} | "
        f"{us_to_ms(r['p50 latency']):.1f} | {us_to_ms(r['p90 latency']):.1f} | {us_to_ms(r['p99 latency']):.1f} | "
        f"{us_to_ms(r['Server Queue']):.1f} | {us_to_ms(r['Server Compute Infer']):.1f} |")

ratio_lines = []
c1 = next((r for r in rows if r["Concurrency"] == "1"), None)
if c1 and base.get("mean_ms"):
    avg, p50 = us_to_ms(c1["Avg latency"]), us_to_ms(c1["p50 latency"])
    ratio_lines = [
        f"- served avg latency at concurrency 1: **{avg:.1f} ms**; raw diffusers mean: **{base['mean_ms']:.1f} ms** "
        f"-> served/raw = **{avg / base['mean_ms']:.2f}x**",
        f"- p50: served {p50:.1f} ms vs raw {base['p50_ms']:.1f} ms -> **{p50 / base['p50_ms']:.2f}x**",
    ]
    if len(rows) > 1:
        best = max(rows, key=lambda r: float(r["Inferences/Second"]))
        ratio_lines.append(
            f"- throughput: best served {float(best['Inferences/Second']):.2f} infer/s at concurrency {best['Concurrency']} "
            f"vs raw serial {1000.0 / base['mean_ms']:.2f} gen/s -> **{float(best['Inferences/Second']) * base['mean_ms'] / 1000.0:.2f}x**")
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

perf_analyzer command (the `-f` CSV was written to a scratch dir and is copied below):
{fence(read('pa.cmd').strip(), 'bash')}
Warm-up before it (not recorded): the same command shape with `--concurrency-range N --request-count 2N`.

Raw baseline command:
{fence(read('baseline.cmd').strip(), 'bash')}

## Machine
- `uname -a`: {sh('uname -a')}
- nproc: {sh('nproc')}; CPU: {cpu}; GPU: {gpu}
- load average at write-up: {sh('cat /proc/loadavg')}
- Python {platform.python_version()} ({sys.executable}); {versions}
- server: {read('server_meta.txt').strip() or 'unknown'}; perf_analyzer: {sh(f'{pa_bin} --version 2>&1 | head -n1')} ({pa_bin.replace(root + '/', '')})
- git: {sh('git rev-parse --short HEAD')} ({'dirty working tree' if sh('git status --porcelain') else 'clean'})
- input data: `perf/data/txt2img_prompts.json` (4 prompts, 64x64, 10 steps, guidance 4.5, seeds 1-4)

## Results (ms unless noted)
| concurrency | infer/s | avg latency | p50 | p90 | p99 | server queue | server compute infer |
|---|---|---|---|---|---|---|---|
{chr(10).join(table) if table else '| (no CSV rows) | | | | | | | |'}

## Served vs raw diffusers
Raw: `diffusers.PixArtSigmaPipeline` from `models/tiny-pixart-sigma`, same prompt/seed/shape/steps/guidance
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
[[ "$PA_RC" -eq 0 ]] || die "perf_analyzer failed (exit $PA_RC); partial results in $OUT"
