#!/bin/bash
# session 37, call 2 (not run): the 1024px ladder at 0.8 / 0.95 (graphs; first steps apart since
# 297f95b) with three servers: request_batch, step:cost, step:cost + late_queue_ms = 2.
source .gpu/env.sh
D=$OUT/c2; mkdir -p $D
exec > >(tee $D/log.txt) 2>&1
python scripts/build_full_size_random.py --out models/pixart-sigma-1024-random --device cuda --if-missing 2>&1 | tail -2
echo "T build $SECONDS"
timeout --signal=INT --kill-after=10 $((${LIMIT:-580} - SECONDS)) python perf/matched_control.py \
  --deployment configs/pixart-sigma-1024-random.toml \
  --modes step:cost,step:cost+late_queue_ms=2 --compare step:cost --capacity 16 \
  --load-fractions 0.8,0.95 --saturation-seconds 30 --saturation-rps 0.93 \
  --accel transformer=eager_graphs text_encoder=cuda_graphs --num-requests 24 --sizes 1024 --steps 20 \
  --guidance 4.5 --seed 22 --server-timeout 120 --solo-repeats 1 --keep-workdir --out-dir $D/control 2>&1 \
  | grep -v "^\[matched_control\] *[0-9]*/" | tail -30
echo "T end $SECONDS"
logs=$(ls -t /tmp/matched_control.*/server-*.log 2>/dev/null | head -3); [[ -n "$logs" ]] && tar czf $D/server_logs.tgz $logs
tar czf $OUT/c2.tgz -C $OUT c2
