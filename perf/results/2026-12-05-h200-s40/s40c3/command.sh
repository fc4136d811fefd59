#!/bin/bash
# session 40, call 3 (H200): the 512px ladder at 0.5 / 0.8 / 0.95 of 3.9 req/s, request_batch vs step:cost with the late queue
source .gpu/env.sh
D=$OUT/s40c3; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
SCHED_MODES="request_batch,step:cost+late_queue_ms=2" \
  SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_SIZES=512 SCHED_STEPS=20 SCHED_GUIDANCE=4.5 \
  SCHED_LOADS=0.5,0.8,0.95 SCHED_SAT_RPS=3.9 SCHED_N=40 SCHED_MIN_S=250 \
  SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=$((${CALL_S:-575} - SECONDS)) OUT=$D timeout $((${CALL_S:-575} + 13 - SECONDS)) \
  bash perf/gpu_recipe.sh scheduler 2>&1 | tail -30
echo "T end $SECONDS"
tar czf $OUT/s40c3.tgz -C $OUT s40c3
