#!/bin/bash
# session 41, call 4: every GPU test on d41a956+ (the overtake test last ran on dd38371, before
# bdee1ae's shared _queue_group)
source .gpu/env.sh
D=$OUT/s41c4; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
git log -1 --format=%h 2>/dev/null
OUT=$D timeout 280 bash perf/gpu_recipe.sh gputests 2>&1 | tail -25
echo "T end $SECONDS"
