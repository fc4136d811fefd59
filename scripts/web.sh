#!/usr/bin/env bash
# README: set up (idempotent), then serve the trained tiny model (the quickstart's) with the web page and the
# OpenAI-compatible API on http://127.0.0.1:8080/ until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/web.py "$@"
