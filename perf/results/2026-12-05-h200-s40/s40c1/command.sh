#!/bin/bash
# session 40, call 1 (H200): GPU tests (overtake's among them), then the mixed trace at 0.95:
# request_batch vs step:cost with the late queue, without and with first steps that overtake
source .gpu/env.sh
D=$OUT/s40c1; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
OUT=$D timeout 150 bash perf/gpu_recipe.sh gputests 2>&1 | tail -20
echo "T gputests $SECONDS"
SCHED_MODES="request_batch,step:cost+late_queue_ms=2,step:cost+late_queue_ms=2+overtake=true" \
  SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_LOADS=0.95 SCHED_SAT_RPS=1.55 SCHED_N=70 \
  SCHED_SOLO_REPEATS=1 SCHED_MIN_S=300 RECIPE_DEADLINE_S=$((575 - SECONDS)) OUT=$D timeout $((588 - SECONDS)) \
  bash perf/gpu_recipe.sh scheduler 2>&1 | tail -30
echo "T end $SECONDS"
tar czf $OUT/s40c1.tgz -C $OUT s40c1
