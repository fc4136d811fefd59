#!/bin/bash
# session 40, call 2 (H200): the 1024px ladder at 0.8 / 0.95 of 0.93 req/s: request_batch vs step:cost with
# the late queue, without and with first steps that overtake
source .gpu/env.sh
D=$OUT/s40c2; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
SCHED_MODES="request_batch,step:cost+late_queue_ms=2,step:cost+late_queue_ms=2+overtake=true" \
  SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_SIZES=1024 SCHED_STEPS=20 SCHED_GUIDANCE=4.5 \
  SCHED_LOADS=0.8,0.95 SCHED_SAT_RPS=0.93 SCHED_N=24 SCHED_MIN_S=300 \
  SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=$((575 - SECONDS)) OUT=$D timeout $((588 - SECONDS)) \
  bash perf/gpu_recipe.sh scheduler 2>&1 | tail -30
echo "T end $SECONDS"
tar czf $OUT/s40c2.tgz -C $OUT s40c2
