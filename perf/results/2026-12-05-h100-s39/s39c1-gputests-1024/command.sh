#!/bin/bash
# session 39, call 1: GPU tests at 349b74d+, then the late queue's hold past the deadline against
# step:cost on the mixed trace at 0.95 and at 1024px 0.95 (session 38's call 4).
source .gpu/env.sh
D=$OUT/s39c1; mkdir -p $D/mixed $D/1024
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
git log --oneline -1 2>/dev/null
OUT=$D timeout 150 bash perf/gpu_recipe.sh gputests 2>&1 | tail -20
echo "T gputests $SECONDS"
SCHED_MODES="step:cost,step:cost+late_queue_ms=2" \
  SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_LOADS=0.95 SCHED_SAT_RPS=1.55 SCHED_N=70 \
  SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=$((400 - SECONDS)) OUT=$D/mixed timeout $((410 - SECONDS)) \
  bash perf/gpu_recipe.sh scheduler 2>&1 | tail -30
echo "T mixed $SECONDS"
SCHED_MODES="step:cost,step:cost+late_queue_ms=2" SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" \
  SCHED_SIZES=1024 SCHED_STEPS=20 SCHED_GUIDANCE=4.5 SCHED_LOADS=0.95 SCHED_SAT_RPS=0.93 SCHED_N=24 \
  SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=$((570 - SECONDS)) OUT=$D/1024 timeout $((585 - SECONDS)) \
  bash perf/gpu_recipe.sh scheduler 2>&1 | tail -30
echo "T end $SECONDS"
tar czf $OUT/s39c1.tgz -C $OUT s39c1
ls -la $OUT
