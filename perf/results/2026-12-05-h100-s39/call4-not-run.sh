#!/bin/bash
# NOT RUN in session 39: the device refused to start twice and the budget ran out. Copy to .gpu/ and run `bash .gpu/call4-not-run.sh`.
# session 39, call 4: 512px at 0.95 of 3.9 req/s (the H200 ladders' saturation), transformer in
# eager_graphs and T5 in graphs: request_batch vs step:cost with the late queue. matched_control
# directly (the recipe's scheduler stage wanted 400 s of deadline then; SCHED_MIN_S now lowers it).
source .gpu/env.sh
D=$OUT/s39c4; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
[ -d models/pixart-sigma-1024-random ] || python scripts/build_full_size_random.py --out models/pixart-sigma-1024-random --device cuda --if-missing 2>&1 | tail -3
echo "T build $SECONDS"
timeout -s INT $((185 - SECONDS)) python perf/matched_control.py --deployment configs/pixart-sigma-1024-random.toml \
  --modes request_batch,step:cost+late_queue_ms=2 --compare step:cost+late_queue_ms=2 --capacity 16 --load-fractions 0.95 \
  --saturation-rps 3.9 --accel transformer=eager_graphs text_encoder=cuda_graphs --num-requests 40 --sizes 512 \
  --steps 20 --guidance 4.5 --seed 22 --server-timeout 120 --solo-repeats 1 --keep-workdir --out-dir $D/control 2>&1 | tail -25
echo "T end $SECONDS"
tar czf $OUT/s39c4.tgz -C $OUT s39c4
