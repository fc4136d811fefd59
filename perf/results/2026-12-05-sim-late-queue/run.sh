#!/bin/bash
# Session 37: the late queue ([engine] late_queue_ms) simulated on session 36's H200 traces.
# --queue ahead models dit's default read-ahead with the hold; the step:cost+late_queue row queues
# late (3 ms margin). pre-ms = encode + Triton's round trip (1.6 ms solo) + admission, from each
# control's ttfs_split_ms; encode-ms = its encode (the hold's announcement lead).
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=perf/results/2026-12-05-sim-late-queue
T=$(mktemp -d)
tar xzf perf/results/2026-12-05-h200-s36/call1-gputests-mixed-0p8-0p95/control_all.tgz -C "$T" --wildcards '*load0p8.json'
mv "$T"/*load0p8.json "$T/mixed-0p8.json"
tar xzf perf/results/2026-12-05-h200-s36/call2-1024-ladder/control_all.tgz -C "$T" --wildcards '*load0p8.json'
mv "$T"/*load0p8.json "$T/1024-0p8.json"
MIXED95=perf/results/2026-12-05-h200-s36/call1-gputests-mixed-0p8-0p95/control_2026-12-05-gpu-h200-matched-control-load0p95.json
L1024_95=perf/results/2026-12-05-h200-s36/call2-1024-ladder/control_2026-12-05-gpu-h200-matched-control-load0p95.json
COMMON=(--old-ref d73e915 --curve-1024 h200-profile --capacity 16 --queue ahead --late-queue --late-margin-ms 3 --n 300)
.venv/bin/python perf/sched_sim.py --control "$T/mixed-0p8.json" "${COMMON[@]}" --pre-ms 26.6 --encode-ms 20.4 \
    --synthetic mixed-0.8:512,768,1024:0.8 --out $HERE/mixed-0p8 > /dev/null
.venv/bin/python perf/sched_sim.py --control $MIXED95 "${COMMON[@]}" --pre-ms 25.8 --encode-ms 19.7 \
    --synthetic mixed-0.95:512,768,1024:0.95 --out $HERE/mixed-0p95 > /dev/null
.venv/bin/python perf/sched_sim.py --control "$T/1024-0p8.json" "${COMMON[@]}" --pre-ms 28.2 --encode-ms 21.2 \
    --synthetic 1024-0.8:1024:0.8:20:4.5 --out $HERE/1024-0p8 > /dev/null
.venv/bin/python perf/sched_sim.py --control $L1024_95 "${COMMON[@]}" --pre-ms 30.5 --encode-ms 23.2 \
    --synthetic 1024-0.95:1024:0.95:20:4.5 --out $HERE/1024-0p95 > /dev/null
rm -rf "$T"
