#!/bin/bash
# session 36, call 1: GPU tests, then the mixed trace at 0.8/0.95 with session 35's engine changes
source .gpu/env.sh
D=$OUT/c1; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
git log --oneline -1 2>/dev/null
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
OUT=$D timeout 150 bash perf/gpu_recipe.sh gputests 2>&1 | tail -20
echo "T gputests $SECONDS"
SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_LOADS=0.8,0.95 SCHED_SAT_RPS=1.55 SCHED_N=70 SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=$((570 - SECONDS)) OUT=$OUT timeout $((585 - SECONDS)) bash perf/gpu_recipe.sh scheduler 2>&1 | tail -40
echo "T end $SECONDS"
tar czf $OUT/c1.tgz -C $OUT c1
ls -la $OUT
