#!/bin/bash
# session 37, call 1 (not run: no device was lent): every GPU test (the late queue's hold on a real
# device, the engine's started_at / ran_dry), then the mixed trace at 0.95 with three servers:
# request_batch, step:cost, step:cost with [engine] late_queue_ms = 2 (the summary's ratios are
# last / first; compare the middle one by hand). Copy to .gpu/ and run `bash .gpu/call1-not-run.sh`.
source .gpu/env.sh
D=$OUT/c1; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
OUT=$D timeout 150 bash perf/gpu_recipe.sh gputests 2>&1 | tail -20
echo "T gputests $SECONDS"
SCHED_MODES="request_batch,step:cost,step:cost+late_queue_ms=2" \
  SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_LOADS=0.95 SCHED_SAT_RPS=1.55 SCHED_N=70 \
  SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=$((570 - SECONDS)) OUT=$OUT timeout $((585 - SECONDS)) \
  bash perf/gpu_recipe.sh scheduler 2>&1 | tail -40
echo "T end $SECONDS"
tar czf $OUT/c1.tgz -C $OUT c1
ls -la $OUT
