#!/usr/bin/env bash
# Which client kind makes tritonserver's RSS grow (issue 19)? Four soaks of the tiny PixArt-Sigma
# at once, one server each, the same Poisson load (0.8 x the measured saturation, two phases;
# slopes fitted over the second), differing only in the client mix:
#   stream  streamed requests only        cancel  streamed, 30 % cancelled by the client
#   shm     unary into shared memory      unary   unary over gRPC
# (shared memory is CUDA where the server has a GPU). No bad requests, no faults.
# Usage, on the GPU machine: source .gpu/env.sh && OUT=/some/dir bash perf/rss_by_client.sh
# PHASE_S (default 45) sets each phase's length, RUN_TIMEOUT (default 200) bounds each soak, MIXES
# (default "stream cancel shm unary") picks the mixes, e.g. MIXES=stream PHASE_S=240 for one long run.
# Prints tritonserver's RSS by phase per mix; OUT gets each soak.md, rss_by_client.tgz (the JSONs,
# plots) and logs.tgz (the server logs).
set -u
: "${OUT:?set OUT to a folder for the results}"
PY=${PY:-python3}
common=(--deployment configs/tiny-pixart-sigma.toml --sizes 256 --steps 2-4 --phases 0.8,0.8
        --phase-seconds "${PHASE_S:-45}" --saturation-seconds 5 --slope-phases 1 --bad-rate 0 --fault-rate 0
        --sample-interval 1 --exit-timeout 15)
run() {
    local name=$1; shift
    timeout "${RUN_TIMEOUT:-200}" "$PY" perf/soak.py "${common[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "$name: perf/soak.py exit status $? (1 = some criterion failed: see $name.log)"
}
declare -A MIX_ARGS=(
    [stream]="--cancel-rate 0 --unary-share 0 --shm-share 0"
    [cancel]="--cancel-rate 0.3 --unary-share 0 --shm-share 0"
    [shm]="--cancel-rate 0 --unary-share 0 --shm-share 1.0"
    [unary]="--cancel-rate 0 --unary-share 1.0 --shm-share 0"
)
MIXES=${MIXES:-stream cancel shm unary}
mkdir -p "$OUT"
for mix in $MIXES; do
    [[ -n "${MIX_ARGS[$mix]:-}" ]] || { echo "unknown mix $mix; choose from: ${!MIX_ARGS[*]}"; exit 2; }
    run "$mix" ${MIX_ARGS[$mix]} &
done
wait
"$PY" - "$OUT" $MIXES <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for mix in sys.argv[2:]:
    path = out / mix / "soak.json"
    if not path.exists():
        print(f"{mix}: no soak.json (see {mix}.log)")
        continue
    data = json.loads(path.read_text())
    resources = data["resources"]
    slope = resources["last_phases"]["slopes_per_min"].get("rss_mb:tritonserver")
    print(f"{mix}: saturation {data['saturation']['rps']} req/s; tritonserver RSS by phase (MB) "
          f"{resources['tritonserver_rss_by_phase_mb']}; slope over the last phase {slope} MB/min; "
          f"shutdown {data['shutdown']}")
EOF
logs=()
for mix in $MIXES; do
    [[ -f "$OUT/$mix/soak.md" ]] && cp "$OUT/$mix/soak.md" "$OUT/$mix-soak.md"
    logs+=("$mix/server.log")
done
tar czf "$OUT/rss_by_client.tgz" -C "$OUT" --exclude=server.log $MIXES 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" "${logs[@]}" 2>/dev/null
for mix in $MIXES; do rm -rf "${OUT:?}/$mix"; done
