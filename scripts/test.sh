#!/usr/bin/env bash
# README command 2: set up (idempotent) and run the whole test suite against a real tritonserver.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# tests/test_frontend.py drives the web page in Debian's chromium: Playwright's own browser
# download cannot reach its servers from our machines. Root with apt-get only; else that test skips.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[test] installing Debian's chromium (for the web page test)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
        >/dev/null; } || echo "[test] warning: chromium did not install; the page test will skip"
fi
exec .venv/bin/python -m pytest -q "$@"
