#!/usr/bin/env bash
# One named perf_analyzer sweep (perf/sweeps.toml): installs perf_analyzer if needed, runs the
# raw diffusers baseline, starts its own tritonserver on the repository rendered for the
# sweep's deployment, measures, and writes perf/results/<date>-<machine>-<sweep>.{md,csv,json,png}.
#
# Usage:  bash perf/run_perf_analyzer.sh [--sweep NAME] [options]     (default sweep: cpu-txt2img-unary)
#         bash perf/run_perf_analyzer.sh --list
#         bash perf/run_perf_analyzer.sh --help                        (every option)
#
# This is perf/sweep.py run with the project's interpreter: $PYTHON, else .venv/bin/python,
# else python3 (the GPU image, after `source .gpu/env.sh`). Exit status as perf/sweep.py:
# 0 all levels measured; 3 some did not settle; 75 perf_analyzer cannot be installed here; 1 failure.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
exec "$PYTHON" "$REPO_ROOT/perf/sweep.py" "$@"
