#!/bin/bash
# session 37, call 3 (not run): served step mode against plain diffusers (PixArtSigmaPipeline) in
# one call, for the hot-path changes of sessions 35-37 (engine order, admission side stream, first
# steps apart, at most one step queued ahead). The mixed trace at 0.8 with three servers needs a
# call of its own (call 1's command with SCHED_LOADS=0.8: the scheduler stage needs ~400 s).
source .gpu/env.sh
D=$OUT/c3; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
ACCEL_SETTINGS=transformer=eager_graphs ACCEL_ROWS=pixart512,pixart1024 RECIPE_DEADLINE_S=570 OUT=$D timeout 585 \
  bash perf/gpu_recipe.sh accel 2>&1 | tail -30
echo "T end $SECONDS"
tar czf $OUT/c3.tgz -C $OUT c3
