#!/bin/bash
# session 36, call 2: the 1024px ladder, both modes, eager_graphs + graphed T5
source .gpu/env.sh
git log --oneline -1 2>/dev/null
SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" SCHED_SIZES=1024 SCHED_STEPS=20 SCHED_GUIDANCE=4.5 SCHED_LOADS=0.5,0.8,0.95 SCHED_SAT_RPS=0.93 SCHED_N=32 SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=$((575 - SECONDS)) OUT=$OUT timeout $((590 - SECONDS)) bash perf/gpu_recipe.sh scheduler 2>&1 | tail -40
echo "T end $SECONDS"
ls -la $OUT
