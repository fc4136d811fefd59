#!/usr/bin/env bash
# GPU perf recipe: full-size PixArt-Sigma 1024px (random weights, bf16) on the lent H200.
#
#   source .gpu/env.sh && bash perf/gpu_recipe.sh [STAGE ...]        (from the checkout root)
#
# Stages, run in the order given (default: all = env build baseline smoke control):
#   env       GPU, versions, tools, disk; fails early if something the rest needs is missing
#   gputests  the tests marked @pytest.mark.gpu, which CI skips (no GPU), after building the tiny
#             pipelines they use -> $OUT/gputests.txt (not in `all`; ~1 min)
#   matrix    perf/gpu_matrix.py: every public model of the tiny pipelines on the GPU (gRPC,
#             streaming, a requested-output subset, 3 concurrent streams, CUDA shm, a 97 MB
#             video) -> $OUT/gpu_matrix.json, $OUT/gpu_matrix_logs.tgz (not in `all`; ~3 min;
#             run it first: it shows in minutes whether the served path works on this GPU)
#   build     scripts/build_full_size_random.py --if-missing
#             -> models/pixart-sigma-1024-random (~11 GB; git-ignored; ~1 min)
#   baseline  perf/raw_gpu_baseline.py: plain diffusers, 1024x1024, 20 steps, guidance 4.5,
#             serial (warm-up 1, 5 runs) + batched B=1,2,4,8 + per-component times
#             -> $OUT/raw_baseline.json (~2 min)
#   smoke     tritonserver on configs/pixart-sigma-1024-random.toml (repository rendered for
#             its capacity 8): 1 warm-up, SMOKE_SOLO (3) solo requests one after another (with
#             their server stage means and Triton's per-model times), then 4 concurrent
#             1024px streamed requests -> $OUT/server_smoke.json (~2-3 min; run after `baseline`
#             in the same call, it gives issue 5's same-run served/raw ratios)
#   control   perf/matched_control.py (request mode vs step batching on one workload)
#             -> $OUT/control_* (time depends on CONTROL_RATE / CONTROL_N); an incomplete run
#             leaves every stub's Python stacks in its server log (TritonServer.dump_stacks)
#   scheduler issue 22: perf/matched_control.py on one seeded mixed Poisson trace (sizes
#             SCHED_SIZES 512,768,1024, SCHED_STEPS 4,30 steps, SCHED_GUIDANCE 1.0,4.5), modes SCHED_MODES
#             (default request_batch,step:cost; run step,step:cost in a second call) at capacity
#             SCHED_CAPACITY (16) -> $OUT/control_* as the control stage (not in `all`; one call);
#             with SCHED_LOADS (e.g. 0.5,0.8,0.95) a load ladder instead of SCHED_RATE: saturation
#             measured on the first mode's server (SCHED_SAT_S, 30 s; SCHED_SAT_RPS=R gives it instead,
#             e.g. 1.1968 replays the 1024px traces of 2026-12-03), one trace per fraction, one
#             server per mode; e.g. SCHED_LOADS=0.5,0.8,0.95 SCHED_SIZES=1024 SCHED_STEPS=20 SCHED_GUIDANCE=4.5;
#             The mixed trace saturates request batching at ~1.15 req/s (session 25: SCHED_SAT_RPS=1.55
#             overloaded every rung), and both modes at three loads of 30 requests do not fit one call:
#             run one or two loads per call (SCHED_LOADS=0.5,0.8 then 0.95; each call is its own matched
#             control) and SCHED_SOLO_REPEATS=1 (the SLO's solo latency: 11 shapes x 3 runs per server).
#             SCHED_ACCEL="text_encoder=compile vae_decode=compile" serves both modes with those [accel] keys
#             (eager otherwise; the compile cache in /tmp makes the second server's load warm).
#             A cold compile cache does not fit a ladder with transformer=cuda_graphs in one 600 s
#             call: session 24's 512px ladder with graphs + cuDNN + compiled T5 was not READY after
#             SCHED_SERVER_TIMEOUT (300 s) on the first server (its two T5 instances compiled for
#             229-248 s beside dit's capture). Each [accel] attention choice has its own compile
#             cache directory (accel.configure_compiler), so an earlier call without cuDNN does not
#             warm it: warm it first with a call that starts the same [accel] (e.g. the same ladder
#             with SCHED_LOADS=0.5 SCHED_N=10 SCHED_SERVER_TIMEOUT=560), then run the ladder.
#             Session 30: SCHED_ACCEL="text_encoder=cuda_graphs" (graphed T5, loads in ~4 s) fits any
#             ladder; "transformer=cuda_graphs text_encoder=cuda_graphs" (no compiled T5 / VAE) fits a
#             512px ladder in one call (first server's dit warm-up 142 s cold, the second's 29 s); keep
#             the default row_buckets for step batching (perf/results/2026-12-04-h200-scheduler-s30.md).
#   soak      issue 19: perf/soak.py on SOAK_DEPLOYMENT (default perf/deployments/pixart-sigma-soak-h200.toml:
#             full-size PixArt, step + cost, capacity 16, CUDA graphs and compiled T5 / VAE decode warmed at
#             256x256, compile cache in /tmp) with its own [accel] (SOAK_ACCEL_FROM=FILE takes FILE's, warmed
#             at SOAK_WARM; configs/pixart-sigma-1024-random.toml = eager): measured saturation, then Poisson
#             phases SOAK_PHASES (0.95,1.3,0.8x2: FxW = W times as long) x it sized to send SOAK_TARGET (10000) requests in what is
#             left of the call, slopes fitted over the last (steady) phase; SOAK_SIZES 256 px, SOAK_STEPS 2-8,
#             5 % cancels, 2 % bad, 1 % injected faults, streaming / unary / CUDA-shm clients; pass criteria in
#             the JSON -> $OUT/soak.json, $OUT/soak.png, $OUT/soak.tgz (soak.md, server.log, deployment.toml);
#             not in `all`. The cold compile takes ~175 s: for 10,000 requests run a short call first
#             (SOAK_TARGET=0 SOAK_ARGS="--phase-seconds 15 --phases 0.5,1.3 --reserve-seconds 30"
#             RECIPE_DEADLINE_S=310), then the soak on the same still-warm machine
#             (perf/results/2026-12-02-h200-soak-run7-8.md: 10,001 requests)
#   sweeps    the named perf_analyzer sweeps in SWEEPS (default gpu-pixart1024-unary,gpu-pixart1024-stream),
#             one after the other, each with its own raw baseline and server (perf/run_perf_analyzer.sh)
#             -> $OUT/sweeps.tgz (each sweep's .md/.csv/.json/.png, ready for perf/results/);
#             not in `all`; ~3.5 min per PixArt sweep plus the build; a Wan sweep 5-5.5 min
#             (the first also builds Wan, 23 s): one per call (measured)
#   video     full-size Wan2.1-T2V-1.3B (random weights) -> models/wan2.1-t2v-1.3b-random
#             (~14 GB), then perf/video_transport.py: one 81x480x832 video (97 MB) delivered by
#             gRPC, system shm and CUDA shm, with stage accounting -> $OUT/video_transport.json
#             (not in `all`; ~4-6 min)
#   accel     issue 23: served with [accel] (ACCEL_SETTINGS, default transformer=cuda_graphs) vs eager
#             diffusers in the same call, per row of ACCEL_ROWS (pixart512, pixart1024: full-size PixArt,
#             20 steps, solo + closed loop at capacity: 512 at ACCEL_512_CAPACITY (16) with 2x as many
#             clients and ACCEL_512_BUCKETS (row_buckets=2,8,16,32), 1024 at ACCEL_1024_CAPACITY (8), 2x as many clients; both with
#             ACCEL_IN_FLIGHT generations in flight (default 1.5 x capacity: [engine] in_flight; a row
#             ROW@cap, e.g. ACCEL_ROWS=pixart512,pixart512@cap, runs in_flight = capacity; ROW@spe1 runs
#             [engine] steps_per_execute = 1; ROW@stage1 stage_instances = 1; ROW@cudnn [accel] attention =
#             "cudnn"; ROW@fe also sends the solo requests through the front end); wan: 81x480x832, 10
#             steps, solo; shapes: the trained tiny model in bf16 at 64x64
#             (perf/deployments/tiny-pixart-shapes-bf16.toml), for the PSNR on trained weights) ->
#             $OUT/accel.tgz (perf/accel_bench.py's JSON and server log per row); ~4-5 min per PixArt
#             row with its build, compile and warm-up (not in `all`); ACCEL_RESTART=1 compiles into a fresh
#             cache and then starts the server again on it (warm-cache READY and first request; ~+1-2 min)
#   probe     issue 23: perf/accel_probe.py in process on the full-size PixArt, rows PROBE_ROWS (default:
#             bf16 eager / compiled / graphed vs our FP8 at 1024 x 2 and x 8 rows) -> $OUT/accel_probe.json
#             (not in `all`; ~4 min with the build); then the served FP8 row:
#             ACCEL_ROWS=pixart1024 ACCEL_SETTINGS="transformer=cuda_graphs vae_decode=compile text_encoder=compile fp8=true"
#   family    issue 18: full-size random FLUX.1-dev and SD3.5 Large (FAMILY_ROWS, default flux,sd3; each
#             built with scripts/build_full_size_random.py --if-missing, then deleted unless FAMILY_KEEP=1:
#             the two do not fit the disk together) served eager (step mode, capacity 4) vs eager diffusers
#             in the same call by perf/accel_bench.py: 1024x1024, FAMILY_STEPS (28) steps, raw serial + B=4,
#             served solo + 4 closed-loop clients -> $OUT/family.tgz (accel_<row>.json, server logs,
#             build_info); ~6 min per family with its build: one family per call (not in `all`)
#   cache     issue 20: perf/cache_frontier.py in process on the full-size PixArt deployment
#             ($SIZE px, $STEPS steps): lossless vs the CACHE_TIERS thresholds (default
#             t05=0.05 t10=0.1 t20=0.2), CACHE_PROMPTS (16) prompts in step batches of CACHE_BATCH (8),
#             3 interleaved passes -> $OUT/cache_frontier.json (speed-up, cache hits, block work;
#             random weights: the PSNR/SSIM there are not quality evidence) (not in `all`; ~3-4 min;
#             CACHE_FRONTIER=0 skips it); then, per row of CACHE_SERVED (pixart1024: $SIZE px 20 steps,
#             capacity 8, 8 closed-loop clients; wan: 81x480x832 10 steps solo), the served tiers
#             (perf/accel_bench.py --tiers: lossless vs each of CACHE_SERVED_TIERS, default
#             fast=0.07 t10=0.1 t20=0.2, with ACCEL_SETTINGS and [cache] back_blocks = CACHE_BACK_BLOCKS,
#             default 0, front_blocks = CACHE_FRONT_BLOCKS, default 1) -> $OUT/cache.tgz; e.g.
#             CACHE_FRONTIER=0 CACHE_SERVED=pixart1024 RECIPE_DEADLINE_S=570 bash perf/gpu_recipe.sh cache
#   i2v       full-size Wan2.1-I2V-14B-480P (random weights) -> models/wan2.1-i2v-14b-480p-random
#             (~46 GB: transformer 16.4B, UMT5-XXL 5.7B, CLIP ViT-H/14 0.63B, VAE), then
#             perf/video_transport.py on configs/wan2.1-i2v-14b-480p-random.toml: img2vid_stream,
#             a synthetic 480x832 uint8 image, 81x480x832, I2V_STEPS steps with CFG (guidance 5),
#             per-stage server means (text encode, condition = CLIP image encode + first-frame
#             VAE encode, denoise and one dit step, decode) -> $OUT/i2v_stage_times.json,
#             $OUT/i2v_build_info.json, $OUT/i2v_server.log (not in `all`; estimated ~4-6 min
#             at full depth: build ~1.5-2.5 min, most of it saving 42.5 GiB, server start ~1-2 min,
#             3 requests of 2 CFG steps ~1.5 min; needs ~45 GiB free disk. If it does not fit one
#             call, I2V_TRANSFORMER_LAYERS=20 halves the transformer's build and load; it changes
#             only the transformer's depth: scale the dit step time by 40/20)
# baseline, smoke and control first build the model if it is missing (a machine stays warm
# only ~30 s after a call, so a later call usually finds a bare machine).
#
# Outputs under $OUT (default outputs/gpu_recipe), at most 8 files: recipe.log (everything,
# server log tails included), build_info.json, raw_baseline.json, server_smoke.json,
# summary.md, control_all.tgz and up to two control_*.json/md.
#
# Env knobs: MATRIX_VARIANTS (default,watch_on; gpu_media adds [engine] media_on_host = false),
# RECIPE_DEADLINE_S (default 530: stages that would start too late are skipped,
# running ones are stopped with SIGINT so their partial output is kept; leaves room for
# `source .gpu/env.sh` inside the device's 600 s), PYTHON (default python3),
# BASELINE_RUNS (5), BASELINE_WARMUP (1), BASELINE_BATCHES (1,2,4,8), BASELINE_BATCH_RUNS (2),
# SMOKE_SOLO (3), SMOKE_CONCURRENT (4), SWEEPS (gpu-pixart1024-unary,gpu-pixart1024-stream; a gpu-wan-* sweep
# first builds full-size Wan2.1-T2V-1.3B if missing), SWEEP_LEVEL_TIMEOUT_S (150),
# SOAK_TARGET (10000), SOAK_SIZES (256), SOAK_STEPS (2-8), SOAK_PHASES (0.95,1.3,0.8x2: FxW = W times as long), SOAK_ACCEL_FROM, SOAK_WARM (256x256),
# SOAK_DEPLOYMENT (perf/deployments/pixart-sigma-soak-h200.toml), SOAK_ARGS (extra soak.py args),
# CONTROL_RATE (0.6 req/s), CONTROL_N (24), CONTROL_ARGS (extra args),
# SCHED_MODES, SCHED_CAPACITY, SCHED_RATE (1.0 req/s), SCHED_N (40), SCHED_SIZES, SCHED_STEPS, SCHED_GUIDANCE,
# SCHED_LOADS, SCHED_SAT_S, SCHED_SAT_RPS, SCHED_ACCEL, SCHED_SERVER_TIMEOUT (300 s), SCHED_SOLO_REPEATS (3),
# SCHED_MIN_S (400: the time the stage must have left to start; lower it for a short run, one load of
# few requests) (scheduler stage),
# VIDEO_STEPS (2), VIDEO_REPS (3), VIDEO_TEXT_ENCODER_LAYERS (24 = real),
# I2V_STEPS (2), I2V_REPS (1), I2V_TRANSPORTS (grpc,system), I2V_TEXT_ENCODER_LAYERS (24 = real),
# I2V_TRANSFORMER_LAYERS (40 = real; fewer cut only the transformer's depth: per-step time
# scales with it, the other stages keep their real cost), I2V_MEDIA_ON_HOST (1; 0 serves a
# copy of the deployment with [engine] media_on_host = false), I2V_BUILD (1; 0 skips the build) and,
# for a CPU dry run of the plumbing only, I2V_DEPLOYMENT / I2V_FRAMES / I2V_HEIGHT / I2V_WIDTH,
# and DITSERVE_CUDA_POOL_BYTES (Python-backend CUDA pool; unset = Triton's 64 MB; it matters
# only with media_on_host = false, where a 97 MB video crosses from vae_decode by CUDA IPC).
# Exit status: 0 when every requested stage passed, 1 otherwise (the summary names them).
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
OUT="${OUT:-$REPO_ROOT/outputs/gpu_recipe}"
PY="${PYTHON:-python3}"
DEADLINE_S="${RECIPE_DEADLINE_S:-530}"
# RECIPE_* overrides exist for a CPU dry run of the plumbing with a reduced model; the GPU
# run uses none of them.
DEPLOYMENT="${RECIPE_DEPLOYMENT:-configs/pixart-sigma-1024-random.toml}"
MODEL_DIR="${RECIPE_MODEL_DIR:-models/pixart-sigma-1024-random}"
DEVICE="${RECIPE_DEVICE:-cuda}"
SIZE="${RECIPE_SIZE:-1024}"
STEPS="${RECIPE_STEPS:-20}"
WORK="${TMPDIR:-/tmp}/gpu_recipe.$$"
START_EPOCH=$(date +%s)
declare -a RESULTS=()

log() { echo "[gpu_recipe +$(( $(date +%s) - START_EPOCH ))s] $*"; }
remaining() { echo $(( DEADLINE_S - ($(date +%s) - START_EPOCH) )); }

# run_timed NAME MIN_S FUNCTION: skip when fewer than MIN_S seconds remain; otherwise run the
# stage function in a child bash under `timeout` (SIGINT to its process group first, so
# Python's finally blocks stop servers and write their files). SIGINT comes STOP_GRACE_S before
# the deadline: an interrupted tritonserver with 37 stubs took up to 40 s to stop, and a SIGKILL
# before that loses every file of the stage (session 25's mixed ladder, call 3).
STOP_GRACE_S="${RECIPE_STOP_GRACE_S:-60}"
run_timed() {
    local name=$1 min_s=$2 fn=$3
    local left; left=$(remaining)
    if (( left < min_s )); then
        log "SKIP $name: ${left}s left of RECIPE_DEADLINE_S=${DEADLINE_S}, needs ~${min_s}s; run it in its own call: bash perf/gpu_recipe.sh $name"
        RESULTS+=("$name: SKIPPED (time)")
        return 2
    fi
    log "BEGIN $name (${left}s left)"
    local t0=$(date +%s) rc
    local soft=$(( left - 5 - STOP_GRACE_S )); (( soft < 1 )) && soft=1
    timeout --signal=INT --kill-after="$STOP_GRACE_S" "$soft" bash -o pipefail -c "$fn"
    rc=$?
    local dt=$(( $(date +%s) - t0 ))
    if (( rc == 0 )); then RESULTS+=("$name: ok (${dt}s)"); log "END $name: ok in ${dt}s"
    elif (( rc == 124 || rc == 130 )); then RESULTS+=("$name: TIMED OUT (${dt}s)"); log "END $name: timed out after ${dt}s"
    else RESULTS+=("$name: FAILED rc=$rc (${dt}s)"); log "END $name: FAILED rc=$rc after ${dt}s"
    fi
    return $rc
}

model_ready() { [[ -f "$MODEL_DIR/build_info.json" ]] && [[ -f "$MODEL_DIR/model_index.json" ]]; }

stage_env() {
    log "env: repo $REPO_ROOT, OUT=$OUT, python $(command -v "$PY")"
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm --format=csv 2>&1 || true
    echo "TRITONSERVER=${TRITONSERVER:-<unset>} TRITON_BACKENDS=${TRITON_BACKENDS:-<unset>} PERF_ANALYZER=${PERF_ANALYZER:-<unset>}"
    df -h "$REPO_ROOT" /tmp 2>&1 | sed 's/^/  /'
    echo "cores: $(nproc)  mem: $(free -g 2>/dev/null | awk '/Mem:/{print $2" GiB"}')"
    "$PY" - <<'EOF'
import importlib, os, sys
ok = True  # False only when build/baseline cannot run at all; server-side gaps are warnings
for name in ("torch", "numpy", "diffusers", "transformers", "tokenizers", "safetensors", "huggingface_hub",
             "tritonclient", "PIL", "tqdm", "accelerate", "sentencepiece"):
    try:
        mod = importlib.import_module(name)
        print(f"  {name:16s} {getattr(mod, '__version__', '?')}")
    except Exception as exc:  # report every missing one
        core = name in ("torch", "numpy", "diffusers", "transformers", "tokenizers", "safetensors", "huggingface_hub")
        print(f"  {name:16s} MISSING ({type(exc).__name__}: {exc}){'' if core else ' - smoke/control will fail'}")
        ok &= not core
import numpy, torch
print(f"  python {sys.version.split()[0]} at {sys.executable}; cuda available: {torch.cuda.is_available()}")
if int(numpy.__version__.split(".")[0]) >= 2:
    print("  WARNING: numpy 2 in the server environment: Triton 2.51's Python backend sends EMPTY tensors (see DESIGN.md)")
try:  # the offline tokenizer needs transformers 5's T5Tokenizer(vocab=...)
    from transformers import T5Tokenizer
    T5Tokenizer(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581a", -1.0)], extra_ids=0)
    print("  T5Tokenizer(vocab=...) ok")
except Exception as exc:
    print(f"  T5Tokenizer(vocab=...) FAILED: {exc}")
    ok = False
sys.exit(0 if ok and (torch.cuda.is_available() or not os.environ.get("DEVICE", "cuda").startswith("cuda")) else 1)
EOF
    local rc=$?
    [[ -n "${TRITONSERVER:-}" && -x "${TRITONSERVER:-}" ]] \
        || echo "  WARNING: TRITONSERVER not set or not executable (source .gpu/env.sh first): smoke/control will fail"
    return $rc
}

stage_build() {
    "$PY" scripts/build_full_size_random.py --out "$MODEL_DIR" --device "$DEVICE" --if-missing || return $?
    cp "$MODEL_DIR/build_info.json" "$OUT/build_info.json"
}

ensure_model() {  # ensure_model STAGE
    if model_ready; then return 0; fi
    log "model missing at $MODEL_DIR: building it before $1"
    run_timed build 90 stage_build && model_ready && return 0
    RESULTS+=("$1: NOT RUN (no model)")
    return 1
}

stage_baseline() {
    "$PY" perf/raw_gpu_baseline.py --model "$MODEL_DIR" --device "$DEVICE" --dtype bfloat16 \
        --height "$SIZE" --width "$SIZE" --steps "$STEPS" --guidance-scale 4.5 \
        --warmup "${BASELINE_WARMUP:-1}" --runs "${BASELINE_RUNS:-5}" \
        --batch-sizes "${BASELINE_BATCHES:-1,2,4,8}" --batch-runs "${BASELINE_BATCH_RUNS:-2}" \
        --out "$OUT/raw_baseline.json" > "$WORK/raw_baseline.stdout"
}

stage_smoke() {
    "$PY" - "$DEPLOYMENT" "$WORK" "$OUT/server_smoke.json" "${SMOKE_CONCURRENT:-4}" "$SIZE" "$STEPS" "${SMOKE_SOLO:-3}" <<'EOF'
"""Serve the full-size deployment once: start-up time, one solo and N concurrent 1024px requests."""
import json, subprocess, sys, threading, time, urllib.request
from pathlib import Path

deployment, work, out_path, n_conc = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
size, steps, n_solo = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
sys.path[:0] = ["backends", "perf"]
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from ditserve.client import DitClient, GenerationRequest  # noqa: E402
import loadgen  # noqa: E402  (/metrics scraping)

report = {"deployment": deployment, "ok": False}
repo = work / "repo-random"
subprocess.run([sys.executable, "scripts/render_repository.py", "--deployment", deployment, "--out", str(repo)], check=True)
http, grpc, metrics = free_ports(3)
log_path = work / "server_smoke.log"
server = TritonServer(ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                                    deployment=deployment), log_path=log_path)

def one(seed, record):
    t0 = time.perf_counter()
    try:
        with DitClient(server.grpc_url, protocol="grpc-stream") as client:
            res = client.generate(GenerationRequest("a red fox sitting in the snow, watercolor", seed=seed,
                                                    height=size, width=size, num_inference_steps=steps,
                                                    guidance_scale=4.5), timeout_s=240)
        record.update(ms=round((time.perf_counter() - t0) * 1000, 1), shape=list(res.media.shape),
                      steps_reported=res.steps_reported, mean=round(float(res.media.mean()), 2))
    except Exception as exc:
        record.update(ms=round((time.perf_counter() - t0) * 1000, 1), error=f"{type(exc).__name__}: {exc}"[:500])
    return record

t0 = time.perf_counter()
server.start()
try:
    server.wait_ready(timeout_s=420)
    report["startup_s"] = round(time.perf_counter() - t0, 1)
    print(f"[smoke] server ready in {report['startup_s']}s", flush=True)
    def gpu_memory():
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            return f"n/a ({exc})"
    report["gpu_memory_used"] = gpu_memory()
    report["warmup"] = one(0, {})
    print(f"[smoke] warm-up {report['warmup']}", flush=True)
    before = loadgen.scrape(server.metrics_url)
    report["solo_runs"] = [one(1, {}) for _ in range(n_solo)]  # one after another on the idle server
    after = loadgen.scrape(server.metrics_url)
    report["solo"] = sorted(report["solo_runs"], key=lambda r: r["ms"])[n_solo // 2]  # the median run
    # Where the solo requests' time went (means over them), beside the raw baseline's components
    # (issue 5's 1.03x target).
    report["solo_stage_ms"] = {
        name: None if (m := loadgen.histogram_mean(before, after, f"ditserve_{metric}_seconds", model)) is None
        else round(m * 1000, 1)
        for name, metric, model in (("encode", "encode_duration", "txt2img_stream"),
                                    ("denoise", "denoise_duration", "txt2img_stream"),
                                    ("decode (BLS to vae_decode and back)", "decode_duration", "txt2img_stream"),
                                    ("dit step", "step_duration", "dit"),
                                    ("dit admission", "admission_duration", "dit"),
                                    ("time to first step", "time_to_first_step", "txt2img_stream"))}
    # Triton's own time per model for the same requests (per solo request): a stage's time in the
    # public model minus the called model's queue + compute is the BLS hop's cost.
    report["solo_triton_ms"] = {
        model: {part: round(loadgen.metric_delta(before, after, f"nv_inference_{part}_duration_us", model)
                            / 1000 / n_solo, 1)
                for part in ("queue", "compute_input", "compute_infer", "compute_output")}
        for model in ("text_encoder", "dit", "vae_decode", "txt2img_stream")}
    print(f"[smoke] solo {report['solo']} stages {report['solo_stage_ms']} triton {report['solo_triton_ms']}", flush=True)
    records = [{} for _ in range(n_conc)]
    threads = [threading.Thread(target=one, args=(10 + i, records[i])) for i in range(n_conc)]
    t1 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report["concurrent"] = {"n": n_conc, "wall_ms": round((time.perf_counter() - t1) * 1000, 1), "requests": records}
    report["gpu_memory_used_after"] = gpu_memory()
    print(f"[smoke] concurrent {report['concurrent']}", flush=True)
    try:
        text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
        report["metrics"] = [l for l in text.splitlines() if l.startswith(("ditserve", "nv_inference_count",
                             "nv_inference_exec_count", "nv_inference_request_success", "nv_inference_request_failure"))][:200]
    except OSError as exc:
        report["metrics"] = f"unavailable: {exc}"
    runs = [report["warmup"], *report["solo_runs"], *records]
    report["ok"] = all("error" not in r and r.get("shape") == [size, size, 3] for r in runs)
except BaseException as exc:  # timeout's SIGINT too: keep the partial report
    report["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
finally:
    server.stop()
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print("[smoke] server log tail:\n" + server.log_tail(60), flush=True)
sys.exit(0 if report["ok"] else 1)
EOF
}

build_tiny() {
    "$PY" scripts/build_tiny_pipelines.py > "$WORK/build_tiny.log" 2>&1 || { tail -20 "$WORK/build_tiny.log"; return 1; }
}

# The tests marked @pytest.mark.gpu (CI skips them: it has no GPU), on the tiny pipelines.
stage_gputests() {
    build_tiny || return $?
    local files; files=$(grep -l "pytest.mark.gpu" tests/test_*.py)
    "$PY" -m pytest -q -rs -m gpu $files 2>&1 | tee "$OUT/gputests.txt"
    return "${PIPESTATUS[0]}"
}

stage_matrix() {
    build_tiny || return $?
    "$PY" perf/gpu_matrix.py --variants "${MATRIX_VARIANTS:-default,watch_on}" --request-timeout-s 60 --deadline-s "$(( $(remaining) - 90 ))" \
        --out "$OUT/gpu_matrix.json" --logs "$OUT/gpu_matrix_logs.tgz"
}

# Full-size Wan2.1-T2V-1.3B (random weights), built once: the video stage and the gpu-wan-* sweeps
# serve it from configs/wan2.1-t2v-1.3b-random.toml. A model already there is kept as it is
# (--if-missing), whatever VIDEO_TEXT_ENCODER_LAYERS it was built with.
build_wan_t2v() {
    "$PY" scripts/build_full_size_random.py --family wan-t2v --out models/wan2.1-t2v-1.3b-random --device "$DEVICE" \
        --if-missing --text-encoder-layers "${VIDEO_TEXT_ENCODER_LAYERS:-24}"
}

stage_video() {
    build_wan_t2v || return $?
    "$PY" perf/video_transport.py \
        --deployment configs/wan2.1-t2v-1.3b-random.toml --steps "${VIDEO_STEPS:-2}" --reps "${VIDEO_REPS:-3}" \
        --out "$OUT/video_transport.json" --log "$OUT/video_server.log"
    local rc=$?
    if (( rc != 0 )); then  # the shutdown countdown would fill a plain tail
        echo "----- video server log (full copy: $OUT/video_server.log)"
        grep -v "live models and" "$OUT/video_server.log" | tail -80
    fi
    return $rc
}

# Issue 23's rows (perf/accel_bench.py: eager diffusers, then the served [accel] variant, in the
# same call): ACCEL_ROWS picks them, in order. Each row's JSON and server log land in $OUT/accel.tgz
# after every row, so a call that runs out of time keeps the finished ones. A PixArt row written
# ROW@VARIANT changes one thing, for an A/B after ROW in the same call (the compile cache is then
# warm): ROW@cap runs with in_flight = capacity (named ROW-inflight-cap), ROW@spe1 with
# steps_per_execute = 1, one denoise step per dit execute (named ROW-spe1), ROW@stage1 with one
# text_encoder and one vae_decode instance (stage_instances = 1; at capacity 16 the default is 2),
# ROW@cudnn with [accel] attention = "cudnn" (named ROW-cudnn), ROW@fe also through the OpenAI-compatible
# front end (accel_bench.py --frontend; named ROW-frontend). Variants combine with +:
# pixart512@cudnn+spe1 is named pixart512-cudnn-spe1.
accel_row() {
    local common=(--out "$WORK/accel") accel=(${ACCEL_SETTINGS:-transformer=cuda_graphs vae_decode=compile text_encoder=compile})
    [[ -n "${ACCEL_RESTART:-}" ]] && common+=(--restart)
    local row=${1%%@*} variants="" variant suffix="" cap
    [[ "$row" != "$1" ]] && variants=${1#*@}
    for variant in ${variants//+/ }; do
        case "$variant" in
            cap) suffix+=-inflight-cap ;;
            spe1) suffix+=-spe1; common+=(--steps-per-execute 1) ;;
            stage1) suffix+=-stage1; common+=(--stage-instances 1) ;;
            cudnn) suffix+=-cudnn; accel+=(attention=cudnn) ;;
            fe) suffix+=-frontend; common+=(--frontend) ;;   # also through the OpenAI-compatible front end
            *) echo "unknown accel row variant: $variant in $1 (ROW@cap, ROW@spe1, ROW@stage1, ROW@cudnn, ROW@fe or several joined by +)"; return 2 ;;
        esac
    done
    case "$row" in
        pixart512)  model_ready || stage_build || return $?
                    # capacity 16 (run 4 had 8): at 8 the dit was full only part of the time, the other
                    # requests being in T5 or decode, and served throughput stopped at 0.99x raw B=16
                    cap=${ACCEL_512_CAPACITY:-16}
                    "$PY" perf/accel_bench.py --deployment "$DEPLOYMENT" --name "pixart512$suffix" --size 512x512 \
                        --steps 20 --capacity "$cap" --in-flight "$(in_flight "$cap" "$variants")" --raw-batches 8,16,32 \
                        --concurrency $(( 2 * cap )) --per-client 2 "${common[@]}" \
                        --accel "${accel[@]}" ${ACCEL_512_BUCKETS:-row_buckets=2,8,16,32} ;;
        pixart1024) model_ready || stage_build || return $?
                    # twice as many clients as capacity (run 4: as many) and in_flight 1.5 x capacity
                    # (runs 4-5: = capacity): otherwise the requests in T5 or decode, under load
                    # 0.4-0.6 s each at 1024px, leave dit's slots empty (run 5: 6.2 of 8 busy)
                    cap=${ACCEL_1024_CAPACITY:-8}
                    "$PY" perf/accel_bench.py --deployment "$DEPLOYMENT" --name "pixart1024$suffix" --size 1024x1024 \
                        --steps 20 --capacity "$cap" --in-flight "$(in_flight "$cap" "$variants")" --raw-batches 4,8 \
                        --raw-runs 3 --solo 4 --concurrency $(( 2 * cap )) --per-client 2 "${common[@]}" --accel "${accel[@]}" ;;
        shapes|shapes32)  # trained weights (committed): the PSNR of the served [accel] path against
                    # eager in bf16 (shapes) or in the model's own float32 (shapes32)
                    local file=perf/deployments/tiny-pixart-shapes-bf16.toml
                    [[ "$row" == shapes32 ]] && file=configs/tiny-pixart-shapes.toml
                    "$PY" perf/accel_bench.py --deployment "$file" \
                        --name "$row$suffix" --size 64x64 --prompt "a red circle on a blue background" --steps 20 \
                        --capacity 4 --raw-runs 3 --solo 3 "${common[@]}" --accel "${accel[@]}" ;;
        wan)        build_wan_t2v || return $?
                    "$PY" perf/accel_bench.py --deployment configs/wan2.1-t2v-1.3b-random.toml --name "wan$suffix" \
                        --size 480x832 --frames 81 --steps 10 --guidance 5 --capacity 1 --raw-runs 2 --solo 2 \
                        "${common[@]}" --accel "${accel[@]}" ;;
        *) echo "unknown accel row: $1 (pixart512|pixart1024|wan|shapes|shapes32, PixArt rows also ROW@cap, ROW@spe1, ROW@stage1, ROW@fe; any ROW@cudnn)"; return 2 ;;
    esac
}

# [engine] in_flight of an accel row at capacity $1: = capacity for a ROW@cap row ($2, the row's
# variants, has cap), else ACCEL_IN_FLIGHT (default 1.5 x capacity).
in_flight() { [[ "+$2+" == *+cap+* ]] && echo "$1" || echo "${ACCEL_IN_FLIGHT:-$(( $1 * 3 / 2 ))}"; }

stage_cache() {
    local rc=0
    if [[ "${CACHE_FRONTIER:-1}" != 0 ]]; then
        model_ready || stage_build || return $?
        "$PY" perf/cache_frontier.py --deployment "$DEPLOYMENT" --steps "$STEPS" --prompts "${CACHE_PROMPTS:-16}" \
            --batch "${CACHE_BATCH:-8}" --threads 16 --extra ${CACHE_TIERS:-t05=0.05 t10=0.1 t20=0.2} \
            --back-blocks "${CACHE_BACK_BLOCKS:-0}" --front-blocks "${CACHE_FRONT_BLOCKS:-1}" \
            --out "$OUT/cache_frontier.json" || rc=$?
    fi
    [[ -z "${CACHE_SERVED:-}" ]] || run_rows cache cache_row "$CACHE_SERVED" || rc=$?
    return $rc
}

# Issue 20's served rows (perf/accel_bench.py --tiers): lossless, then each lossy tier of
# CACHE_SERVED_TIERS (default fast=0.07, the trained tiny model's calibration, plus t10=0.1 t20=0.2
# for the speed against steps reused) on one server with the GPU configs' [accel] (lossless rows run
# the CUDA graphs, lossy rows the captured cached segments of cache_graphs.py), solo and a closed loop at capacity.
cache_row() {
    local tiers=(${CACHE_SERVED_TIERS:-fast=0.07 t10=0.1 t20=0.2}) names
    names=$(printf ',%s' "${tiers[@]%%=*}")
    local common=(--out "$WORK/cache" --tiers "lossless$names" --cache-tiers "${tiers[@]}"
                  --cache-back-blocks "${CACHE_BACK_BLOCKS:-0}" --cache-front-blocks "${CACHE_FRONT_BLOCKS:-1}"
                  --accel ${ACCEL_SETTINGS:-transformer=cuda_graphs vae_decode=compile text_encoder=compile})
    case "$1" in
        pixart1024) model_ready || stage_build || return $?
                    "$PY" perf/accel_bench.py --deployment "$DEPLOYMENT" --name cache-pixart1024 --size "${SIZE}x${SIZE}" \
                        --steps 20 --capacity 8 --raw-batches 4,8 --raw-runs 3 --solo 3 --concurrency 8 --per-client 2 \
                        "${common[@]}" ;;
        wan)        build_wan_t2v || return $?
                    "$PY" perf/accel_bench.py --deployment configs/wan2.1-t2v-1.3b-random.toml --name cache-wan \
                        --size 480x832 --frames 81 --steps 10 --guidance 5 --capacity 1 --raw-runs 2 --solo 2 \
                        "${common[@]}" ;;
        *) echo "unknown cache row: $1 (pixart1024|wan)"; return 2 ;;
    esac
}

# The component probe (perf/accel_probe.py) on rows PROBE_ROWS: by default bf16 vs FP8
# (ditserve/fp8.py) at 1024 x 2 and x 8 rows, eager, compiled and in a CUDA graph.
stage_probe() {
    "$PY" perf/accel_probe.py --model "$MODEL_DIR" --out "$OUT/accel_probe.json" --deadline-s "$(( $(remaining) - 15 ))" \
        --only "${PROBE_ROWS:-forward1024x2,compile1024x2,fp8_1024x2,forward1024x8,compile1024x8,fp8_1024x8}"
}

# One full-size MMDiT family served eager against eager diffusers (issue 18's H200 rows).
family_row() {
    local dir out
    case "$1" in
        flux) dir=models/flux.1-dev-random ;;
        sd3)  dir=models/sd3.5-large-random ;;
        *) echo "unknown family row: $1 (flux|sd3)"; return 2 ;;
    esac
    "$PY" scripts/build_full_size_random.py --family "$1" --device "$DEVICE" --if-missing || return $?
    out="$WORK/family"
    cp "$dir/build_info.json" "$out/build_info_$1.json" 2>/dev/null
    "$PY" perf/accel_bench.py --deployment "configs/$(basename "$dir").toml" --name "$1" --size 1024x1024 \
        --steps "${FAMILY_STEPS:-28}" --guidance 3.5 --capacity 4 --accel transformer=eager \
        --raw-runs 3 --raw-batches 4 --solo 3 --concurrency 4 --per-client 2 --out "$out"
    local rc=$?
    [[ -n "${FAMILY_KEEP:-}" ]] || rm -rf "$dir"
    return $rc
}
# run_rows NAME ROW_FUNCTION ROWS: ROW_FUNCTION for each of the comma-separated ROWS, each in
# $WORK/NAME; $OUT/NAME.tgz is rewritten after every row, so a timed-out call keeps the finished ones.
run_rows() {
    local name=$1 fn=$2 row rc=0
    mkdir -p "$WORK/$name"
    for row in ${3//,/ }; do
        log "$name row $row"
        "$fn" "$row" || { rc=$?; log "$name row $row: exit $rc"; }
        tar -czf "$OUT/$name.tgz" -C "$WORK/$name" --exclude='repo-*' --exclude='*.npy' .
    done
    return $rc
}
stage_family() { run_rows family family_row "$FAMILY_ROWS"; }
stage_accel() { run_rows accel accel_row "$ACCEL_ROWS"; }

stage_sweeps() {
    local dir="$WORK/sweeps" name rc=0
    mkdir -p "$dir"
    local sweeps="${SWEEPS:-gpu-pixart1024-unary,gpu-pixart1024-stream}"
    for name in ${sweeps//,/ }; do
        if [[ "$name" == gpu-wan-* ]]; then  # each sweep builds the full-size model it serves, if missing
            build_wan_t2v || { rc=$?; continue; }
        elif [[ "$name" == gpu-pixart* ]]; then
            model_ready || stage_build || { rc=$?; continue; }
        fi
        log "sweep $name"
        bash perf/run_perf_analyzer.sh --sweep "$name" --out-dir "$dir" --level-timeout-s "${SWEEP_LEVEL_TIMEOUT_S:-150}" \
            || { rc=$?; log "sweep $name: exit $rc"; }
        tar -czf "$OUT/sweeps.tgz" -C "$dir" .   # after each sweep, so a timed-out call keeps the finished ones
    done
    return $rc
}

stage_soak() {
    local soak="$WORK/soak" accel=()
    [[ -n "${SOAK_ACCEL_FROM:-}" ]] && accel=(--accel-from "$SOAK_ACCEL_FROM" --warm-sizes "${SOAK_WARM:-256x256}")
    "$PY" perf/soak.py --deployment "${SOAK_DEPLOYMENT:-perf/deployments/pixart-sigma-soak-h200.toml}" "${accel[@]}" \
        --sizes "${SOAK_SIZES:-256}" --steps "${SOAK_STEPS:-2-8}" --guidance 1.0,4.5 \
        --phases "${SOAK_PHASES:-0.95,1.3,0.8x2}" --slope-phases 1 --target-requests "${SOAK_TARGET:-10000}" \
        --budget-seconds "$(( $(remaining) - 10 ))" --saturation-seconds 15 --sample-interval 3 \
        --request-timeout 120 --out "$soak" ${SOAK_ARGS:-}
    local rc=$?
    cp "$soak/soak.json" "$soak/soak.png" "$OUT/" 2>/dev/null
    tar -czf "$OUT/soak.tgz" -C "$soak" soak.md server.log deployment.toml 2>/dev/null
    return $rc
}

# Full-size Wan2.1 I2V: build (or reuse) the random-weight model, then one img2vid_stream request
# per transport with the server's per-stage means. The build prints its own timings (init, sanity
# forwards, save) and the report carries the server's start-up-free stage times.
stage_i2v() {
    local i2v=models/wan2.1-i2v-14b-480p-random
    if [[ "${I2V_BUILD:-1}" != 0 ]]; then
        mkdir -p models
        log "i2v: $(df -BG --output=avail models | tail -1 | tr -d ' ') free for models/ (a full-depth build writes ~46 GB)"
        "$PY" scripts/build_full_size_random.py --family wan-i2v --out "$i2v" --device "$DEVICE" --if-missing \
            --text-encoder-layers "${I2V_TEXT_ENCODER_LAYERS:-24}" \
            --transformer-layers "${I2V_TRANSFORMER_LAYERS:-40}" || return $?
        cp "$i2v/build_info.json" "$OUT/i2v_build_info.json"
    fi
    local deployment="${I2V_DEPLOYMENT:-configs/wan2.1-i2v-14b-480p-random.toml}"
    if [[ "${I2V_MEDIA_ON_HOST:-1}" == 0 ]]; then
        "$PY" -c 'import sys; from pathlib import Path; sys.path.insert(0, "backends")
from ditserve.deployment import write_variant
write_variant(Path(sys.argv[1]), Path(sys.argv[2]), {"media_on_host": False}, "perf/gpu_recipe.sh i2v")' \
            "$deployment" "$WORK/i2v-gpu-media.toml" || return $?
        deployment="$WORK/i2v-gpu-media.toml"
    fi
    "$PY" perf/video_transport.py \
        --deployment "$deployment" \
        --frames "${I2V_FRAMES:-81}" --height "${I2V_HEIGHT:-480}" --width "${I2V_WIDTH:-832}" \
        --image-size "${I2V_HEIGHT:-480}x${I2V_WIDTH:-832}" --steps "${I2V_STEPS:-2}" --guidance 5.0 \
        --reps "${I2V_REPS:-1}" --transports "${I2V_TRANSPORTS:-grpc,system}" --skip-mp4 \
        --out "$OUT/i2v_stage_times.json" --log "$OUT/i2v_server.log"
    local rc=$?
    if (( rc != 0 )); then
        echo "----- i2v server log (full copy: $OUT/i2v_server.log)"
        grep -v "live models and" "$OUT/i2v_server.log" | tail -80
    fi
    return $rc
}

# perf/matched_control.py: request_batch then step mode, each its own server on the same
# seeded Poisson trace (1024px, 20 steps); writes <date>-gpu-h200-matched-control.{md,json}.
stage_control() {
    local ctrl="$WORK/control"
    mkdir -p "$ctrl"
    if [[ ! -f perf/matched_control.py ]]; then
        echo "perf/matched_control.py is missing in this checkout: nothing to run"
        return 3
    fi
    # shellcheck disable=SC2086  # CONTROL_ARGS is a word list on purpose
    "$PY" perf/matched_control.py --deployment "$DEPLOYMENT" --modes request_batch,step \
        --rate "${CONTROL_RATE:-0.6}" --num-requests "${CONTROL_N:-24}" --sizes "$SIZE" --steps "$STEPS" \
        --server-timeout 300 --out-dir "$ctrl" ${CONTROL_ARGS:-}
    local rc=$? f
    if (( rc != 0 )); then  # its scratch (server logs, with stub stacks) is kept on failure
        local logs; logs=$(ls -t "${TMPDIR:-/tmp}"/matched_control.*/server-*.log 2>/dev/null | head -2)
        for f in $logs; do echo "----- tail of $f"; tail -40 "$f"; done
        # shellcheck disable=SC2086
        [[ -n "$logs" ]] && tar czf "$OUT/control_server_logs.tgz" $logs 2>/dev/null
    fi
    collect_control "$ctrl"
    return $rc
}

# Issue 22: the step scheduler ([engine] scheduler = "cost") against request batching and plain
# step batching on a mixed trace (sizes, 4/30 steps, CFG on/off), same trace, one server per mode.
stage_scheduler() {
    local ctrl="$WORK/control"
    mkdir -p "$ctrl"
    local modes="${SCHED_MODES:-request_batch,step:cost}"
    local load=(--rate "${SCHED_RATE:-1.0}") accel=()
    [[ -n "${SCHED_LOADS:-}" ]] && load=(--load-fractions "$SCHED_LOADS" --saturation-seconds "${SCHED_SAT_S:-30}")
    [[ -n "${SCHED_LOADS:-}" && -n "${SCHED_SAT_RPS:-}" ]] && load+=(--saturation-rps "$SCHED_SAT_RPS")
    [[ -n "${SCHED_ACCEL:-}" ]] && accel=(--accel $SCHED_ACCEL)
    # The verdict holds the first mode that is not request_batch against request batching, in either order.
    local compare; compare=$(tr ',' '\n' <<<"$modes" | grep -vx request_batch | head -1)
    "$PY" perf/matched_control.py --deployment "$DEPLOYMENT" --modes "$modes" --compare "${compare:-step}" \
        --capacity "${SCHED_CAPACITY:-16}" "${load[@]}" "${accel[@]}" --num-requests "${SCHED_N:-40}" \
        --sizes "${SCHED_SIZES:-512,768,1024}" --steps "${SCHED_STEPS:-4,30}" --guidance "${SCHED_GUIDANCE:-1.0,4.5}" \
        --seed 22 --server-timeout "${SCHED_SERVER_TIMEOUT:-300}" --solo-repeats "${SCHED_SOLO_REPEATS:-3}" \
        --keep-workdir --out-dir "$ctrl"
    local rc=$? logs
    # Every mode's server log (the scheduler's curves, stage timings, any stack dump) comes back too.
    logs=$(ls -t "${TMPDIR:-/tmp}"/matched_control.*/server-*.log 2>/dev/null | head -"$(tr ',' '\n' <<<"$modes" | wc -l)")
    # shellcheck disable=SC2086
    [[ -n "$logs" ]] && tar czf "$OUT/control_server_logs.tgz" $logs 2>/dev/null
    collect_control "$ctrl"
    return $rc
}

# At most 8 files come back: control's two newest JSON/MD files (plus a tarball when it
# wrote more than those).
collect_control() {
    local ctrl=$1
    [[ -n "$(ls -A "$ctrl" 2>/dev/null)" ]] || return 0
    if (( $(find "$ctrl" -type f | wc -l) > 2 )); then
        tar czf "$OUT/control_all.tgz" -C "$ctrl" . && log "control: $(find "$ctrl" -type f | wc -l) files -> control_all.tgz"
    fi
    local f n=0
    while IFS= read -r f; do
        [[ -n "$f" ]] || continue
        cp "$f" "$OUT/control_$(basename "$f" | tr -c 'A-Za-z0-9._\n-' '_')" && n=$((n + 1))
        (( n >= 2 )) && break
    done < <(find "$ctrl" -maxdepth 2 -type f \( -name '*.md' -o -name '*.json' \) -printf '%T@ %p\n' | sort -rn | cut -d' ' -f2-)
}

write_summary() {
    "$PY" - "$OUT" "${RESULTS[@]}" > "$OUT/summary.md" <<'EOF'
import json, sys
from pathlib import Path
out, results = Path(sys.argv[1]), sys.argv[2:]
print("# GPU recipe summary\n")
print("| stage | result |\n|---|---|")
for r in results:
    name, _, res = r.partition(": ")
    print(f"| {name} | {res} |")
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
b = load("build_info.json")
if b:
    print(f"\nModel: {b.get('reference')}; full_size={b.get('full_size')}, params={b.get('params')}, "
          f"{b.get('size_bytes', 0) / 2**30:.1f} GiB, build times {b.get('times_s')}")
r = load("raw_baseline.json")
if r:
    print(f"\n## Raw diffusers ({r.get('gpu')}, {r['dtype']}, {r['request']['height']}px, "
          f"{r['request']['num_inference_steps']} steps, cfg {r['request']['guidance_scale']})\n")
    print(f"Serial: mean {r['mean_ms']:.0f} ms, p50 {r['p50_ms']:.0f}, p90 {r['p90_ms']:.0f} "
          f"over {r['runs']} runs; load {r['load_s']} s; peak mem {r.get('peak_memory_gib')} GiB\n")
    comp = {c["batch_size"]: c for c in r.get("components", [])}
    print("| B | ms/call | ms/image | img/s | T5 ms | fwd(2B) ms | VAE ms |\n|---|---|---|---|---|---|---|")
    for row in r.get("batched", []):
        c = comp.get(row["batch_size"], {})
        print(f"| {row['batch_size']} | {row['mean_ms']:.0f} | {row['ms_per_image']:.0f} | {row['images_per_s']:.3f} "
              f"| {c.get('encode_prompt_ms', float('nan')):.1f} | {c.get('transformer_forward_ms', float('nan')):.1f} "
              f"| {c.get('vae_decode_ms', float('nan')):.1f} |")
s = load("server_smoke.json")
if s:
    print(f"\n## Served smoke ({s.get('deployment')})\n")
    print(f"ok={s.get('ok')}, start-up {s.get('startup_s')} s, GPU memory {s.get('gpu_memory_used')}")
    for k in ("warmup", "solo", "solo_stage_ms", "solo_triton_ms"):
        if k in s:
            print(f"- {k}: {s[k]}")
    if "concurrent" in s:
        c = s["concurrent"]
        print(f"- {c['n']} concurrent: wall {c['wall_ms']} ms; per request ms {[q.get('ms') for q in c['requests']]}")
    if "error" in s:
        print(f"- error: {s['error'][:500]}")
m = load("gpu_matrix.json")
if m:
    print(f"\n## GPU functional matrix ({m.get('gpu')}, torch {m.get('torch')})\n")
    print("| deployment | variant | result | failing cases |\n|---|---|---|---|")
    for run in m.get("runs", []):
        bad = [f"{k}: {(c.get('error') or 'check failed')[:80]}" for k, c in (run.get("cases") or {}).items()
               if not c.get("ok")]
        state = run.get("skipped") or ("ok" if run.get("ok") else "FAILED")
        print(f"| {run.get('deployment')} | {run.get('variant')} | {state} | "
              f"{'; '.join(bad) or run.get('error', '')[:120]} |")
v = load("i2v_stage_times.json")
if v:
    ib = load("i2v_build_info.json") or {}
    print(f"\n## Image-to-video stage times ({v.get('deployment')}; request {v.get('request')})\n")
    if ib:
        print(f"Model: {ib.get('reference')}; full_size={ib.get('full_size')}, transformer_layers="
              f"{ib.get('transformer_layers')}, params={ib.get('params')}, {ib.get('size_bytes', 0) / 2**30:.1f} GiB, "
              f"build times {ib.get('times_s')}\n")
    print("| stage | mean s |\n|---|---|")
    for name, mean in (v.get("server_stage_means_s") or {}).items():
        print(f"| {name} | {'n/a' if mean is None else f'{mean:.3f}'} |")
    for transport, row in (v.get("summary") or {}).items():
        print(f"- {transport}: total median {row['total_s']['median']:.2f} s")
ctrl = sorted(out.glob("control_*"))
if ctrl:
    print("\n## Matched control\n\nFiles: " + ", ".join(p.name for p in ctrl))
    for path in out.glob("control_*.json"):
        c = load(path.name) or {}
        v = c.get("verdict") or {}
        if v:
            print(f"\nVerdict: success={v.get('success')}. {v.get('text', '')}\n")
            for name, check in (v.get("checks") or {}).items():
                print(f"- {name}: ratio {check.get('ratio')} -> {'pass' if check.get('pass') else 'FAIL'}")
        for mode, rep in (c.get("reports") or {}).items():
            keys = ("offered_request_rate", "request_throughput", "completed_requests", "failed_requests",
                    "p50_e2el_ms", "p99_e2el_ms", "p50_ttfs_ms", "mean_step_batch_size", "server_ready_s")
            print(f"- {mode}: " + ", ".join(f"{k}={rep.get(k)}" for k in keys))
EOF
}

# The device image's scipy and scikit-learn are built for numpy 2, and transformers imports
# scikit-learn when it finds it (diffusers -> peft -> transformers.generation): under the numpy 1.26
# that the Python backend needs, diffusers then fails to import. scripts/slim_gpu_bundle.sh makes
# .gpu/env.sh hide them; a .gpu built without that step (session 26, call 1: a device call lost)
# gets the same .pth line here, before any stage.
check_imports() {
    local probe="from diffusers import AutoencoderKL, PixArtSigmaPipeline"
    "$PY" -c "$probe" 2>/dev/null && return 0
    local site; site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [[ "$site" == /tmp/gpu/venv/* && ! -f "$site/00_numpy2_only_absent.pth" ]]; then
        echo 'import sys; sys.modules.update(dict.fromkeys(("scipy", "sklearn")))' > "$site/00_numpy2_only_absent.pth"
        log "diffusers did not import: hid the image's numpy 2-only scipy / scikit-learn in $site (next time run bash scripts/slim_gpu_bundle.sh after building .gpu)"
        "$PY" -c "$probe" && return 0
    fi
    log "diffusers does not import in $(command -v "$PY"): $("$PY" -c "$probe" 2>&1 | tail -1)"
    log "on the dev machine: bash ../shared/tools/make_gpu_bundle.sh && bash scripts/slim_gpu_bundle.sh, then carry .gpu and source .gpu/env.sh"
    return 1
}

main() {
    local stages=("$@")
    (( ${#stages[@]} )) || stages=(all)
    local expanded=() s
    for s in "${stages[@]}"; do
        case "$s" in
            all) expanded+=(env build baseline smoke control) ;;
            env|gputests|matrix|build|baseline|smoke|control|scheduler|sweeps|soak|video|i2v|accel|probe|cache|family) expanded+=("$s") ;;
            -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; return 0 ;;
            *) echo "unknown stage: $s (env|gputests|matrix|build|baseline|smoke|control|scheduler|sweeps|soak|video|i2v|accel|probe|cache|family|all)"; return 2 ;;
        esac
    done
    mkdir -p "$WORK"
    export REPO_ROOT PY OUT DEADLINE_S DEPLOYMENT MODEL_DIR DEVICE SIZE STEPS WORK START_EPOCH ACCEL_ROWS="${ACCEL_ROWS:-pixart512,pixart1024}" ACCEL_SETTINGS CACHE_SERVED CACHE_SERVED_TIERS CACHE_BACK_BLOCKS CACHE_FRONT_BLOCKS CACHE_FRONTIER \
        FAMILY_ROWS="${FAMILY_ROWS:-flux,sd3}"
    export -f log remaining model_ready stage_env stage_build stage_baseline stage_smoke stage_control stage_scheduler collect_control \
        build_tiny stage_gputests stage_matrix build_wan_t2v stage_sweeps stage_soak stage_video stage_i2v accel_row in_flight stage_accel family_row stage_family run_rows stage_probe stage_cache cache_row
    log "stages: ${expanded[*]} (deadline ${DEADLINE_S}s)"
    check_imports || { RESULTS+=("imports: FAILED (diffusers)"); write_summary; return 1; }
    for s in "${expanded[@]}"; do
        case "$s" in
            env) run_timed env 10 stage_env || { log "env check failed: stopping (torch/CUDA/diffusers/transformers)"; break; } ;;
            build) run_timed build 90 stage_build ;;
            baseline) ensure_model baseline && run_timed baseline 120 stage_baseline ;;
            smoke) ensure_model smoke && run_timed smoke 150 stage_smoke ;;
            control) ensure_model control && run_timed control 200 stage_control ;;
            scheduler) ensure_model scheduler && run_timed scheduler "${SCHED_MIN_S:-400}" stage_scheduler ;;
            sweeps) run_timed sweeps 240 stage_sweeps ;;
            soak) ensure_model soak && run_timed soak 240 stage_soak ;;  # load, warm-up, saturation, phases sized to fit
            gputests) run_timed gputests 60 stage_gputests ;;
            matrix) run_timed matrix 150 stage_matrix ;;
            video) run_timed video 240 stage_video ;;
            i2v) run_timed i2v 300 stage_i2v ;;
            accel) run_timed accel 200 stage_accel ;;
            probe) ensure_model probe && run_timed probe 150 stage_probe ;;
            cache) run_timed cache 240 stage_cache ;;
            family) run_timed family 300 stage_family ;;
        esac
    done
    [[ -f "$MODEL_DIR/build_info.json" && ! -f "$OUT/build_info.json" ]] && cp "$MODEL_DIR/build_info.json" "$OUT/"
    write_summary
    log "summary ($OUT/summary.md):"
    cat "$OUT/summary.md"
    log "files in OUT: $(ls "$OUT" | tr '\n' ' ')"
    rm -rf "$WORK"
    local r
    for r in "${RESULTS[@]}"; do [[ "$r" == *": ok "* ]] || return 1; done
    return 0
}

mkdir -p "$OUT"
main "$@" 2>&1 | tee -a "$OUT/recipe.log"
exit "${PIPESTATUS[0]}"
