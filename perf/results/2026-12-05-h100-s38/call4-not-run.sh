#!/bin/bash
# session 38, call 4 (not run: no machine could be started, then no device time left): the late
# queue's hold past the deadline (349b74d) at 1024px, 0.95 of 0.93 req/s, against step:cost, then
# (a call of its own) the mixed trace at 0.95 with request_batch first. Read dit_holds (joins)
# and ttfs_split_ms (admission wait) against callC's. Copy to .gpu/ and run `bash .gpu/call4-not-run.sh`.
source .gpu/env.sh
SCHED_MODES="step:cost,step:cost+late_queue_ms=2" SCHED_ACCEL="transformer=eager_graphs text_encoder=cuda_graphs" \
  SCHED_SIZES=1024 SCHED_STEPS=20 SCHED_GUIDANCE=4.5 SCHED_LOADS=0.95 SCHED_SAT_RPS=0.93 SCHED_N=24 \
  SCHED_SOLO_REPEATS=1 RECIPE_DEADLINE_S=570 timeout 585 bash perf/gpu_recipe.sh scheduler 2>&1 | tail -40
