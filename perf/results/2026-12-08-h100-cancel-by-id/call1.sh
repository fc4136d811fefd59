#!/usr/bin/env bash
# Device call 1 (asked for nvidia-h200, ran on an H100): cancel by id on a CUDA host, the tiny PixArt (default repository).
#   run: source .gpu/env.sh && bash perf/results/2026-12-08-h100-cancel-by-id/call1.sh
# carry: .gpu models/tiny-pixart-sigma. Everything goes to $OUT/call1.tgz (and log.txt).
set -u
R=/tmp/call1; mkdir -p $R
t0=$(date +%s); el() { echo "[+$(( $(date +%s) - t0 ))s] $*"; }
{
el "machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; git log -1 --format=%H 2>/dev/null
el "tests/test_cancel_by_id.py on CUDA"
python3 -m pytest -q -x tests/test_cancel_by_id.py 2>&1 | tail -5
el "flag cost A/B"
python3 perf/cancel_flag_cost.py --pairs 40 --out $R/flag_cost.json --log $R/flag_cost.log 2>&1 | grep -v '^\.*$' | tail -25
for by in id stream; do
  el "survival storm, cancel at final, by $by, 60 s, 12 clients"
  python3 perf/cancel_storm.py --cancel-at final --cancel-by $by --clients 12 --seconds 60 --survival \
      --log $R/survival-$by.log 2>&1 | grep -v '^\.*$' | tail -6
done
for i in 1 2; do for by in id stream; do
  (( $(date +%s) - t0 > 360 )) && { el "skip unload $by $i: out of time"; continue; }
  el "unload after a 15 s final storm by $by, run $i"
  python3 perf/cancel_storm.py --cancel-at final --cancel-by $by --clients 12 --seconds 15 --unload-wait 30 \
      --log $R/unload-$by-$i.log 2>&1 | grep -v '^\.*$' | tail -4
done; done
el "done"
} 2>&1 | tee $R/log.txt
cp $R/log.txt $OUT/log.txt; tar -czf $OUT/call1.tgz -C $R .
