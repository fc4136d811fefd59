#!/bin/bash
# session 42: session 40's prepared calls plus `accel` (GPU tests, then served vs raw diffusers at 512 / 1024px) and `frontend` (the same rows, also through the OpenAI-compatible front end).
#   bash .gpu/next-calls-not-run.sh mixed    # the mixed trace at 0.5 / 0.8 with overtake (issue 22's loads)
#   bash .gpu/next-calls-not-run.sh 512      # 512px: does the late queue's idle gap cost the median?
#   bash .gpu/next-calls-not-run.sh 1024     # 1024px at 0.8 again, with the hold rule of the commit after dd38371
source .gpu/env.sh
D=$OUT/next-$1; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
common=(SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_SOLO_REPEATS=1 SCHED_MIN_S=300
        RECIPE_DEADLINE_S=$((575 - SECONDS)) OUT=$D)
case "$1" in
  frontend) ACCEL_SETTINGS=transformer=eager_graphs ACCEL_ROWS=pixart1024@fe,pixart512@fe OUT=$D/accel timeout $((588 - SECONDS)) bash perf/gpu_recipe.sh accel ;;
  accel) OUT=$D/gputests timeout 150 bash perf/gpu_recipe.sh gputests; echo "T gputests $SECONDS"
         ACCEL_SETTINGS=transformer=eager_graphs ACCEL_ROWS=pixart512,pixart1024 OUT=$D/accel timeout $((588 - SECONDS)) bash perf/gpu_recipe.sh accel ;;
  mixed) env "${common[@]}" SCHED_MODES="request_batch,step:cost+late_queue_ms=2+overtake=true" \
           SCHED_LOADS=0.5,0.8 SCHED_SAT_RPS=1.55 SCHED_N=70 timeout $((588 - SECONDS)) bash perf/gpu_recipe.sh scheduler ;;
  512)   env "${common[@]}" SCHED_MODES="request_batch,step:cost,step:cost+late_queue_ms=2" SCHED_SIZES=512 SCHED_STEPS=20 \
           SCHED_GUIDANCE=4.5 SCHED_LOADS=0.8,0.95 SCHED_SAT_RPS=3.9 SCHED_N=40 timeout $((588 - SECONDS)) bash perf/gpu_recipe.sh scheduler ;;
  1024)  env "${common[@]}" SCHED_MODES="request_batch,step:cost+late_queue_ms=2,step:cost+late_queue_ms=2+overtake=true" \
           SCHED_SIZES=1024 SCHED_STEPS=20 SCHED_GUIDANCE=4.5 SCHED_LOADS=0.5,0.8 SCHED_SAT_RPS=0.93 SCHED_N=24 \
           timeout $((588 - SECONDS)) bash perf/gpu_recipe.sh scheduler ;;
esac 2>&1 | tail -30
echo "T end $SECONDS"
tar czf $OUT/next-$1.tgz -C $OUT next-$1
