#!/usr/bin/env bash
# README command 2: set up (idempotent) and run the whole test suite against a real tritonserver.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Debian packages some tests need, installed when missing (root with apt-get only; else those tests skip):
# chromium for tests/test_frontend.py's web page (Playwright's own browser download cannot reach its
# servers from our machines), libjemalloc2 and libtcmalloc-minimal4 for tests/test_malloc.py's servers.
packages=()
command -v chromium >/dev/null || packages+=(chromium)
ls /usr/lib/*-linux-gnu/libjemalloc.so.2 >/dev/null 2>&1 || packages+=(libjemalloc2)
ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1 || packages+=(libtcmalloc-minimal4)
if (( ${#packages[@]} )) && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[test] installing Debian's ${packages[*]} (for the web page and allocator tests)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" \
        >/dev/null; } || echo "[test] warning: ${packages[*]} did not install; the tests that need them will skip"
fi
exec .venv/bin/python -m pytest -q "$@"
