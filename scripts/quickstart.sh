#!/usr/bin/env bash
# README command 1: set up .venv, build the tiny pipelines, serve the trained tiny model, generate one PNG.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/quickstart.py "$@"
