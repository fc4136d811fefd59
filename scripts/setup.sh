#!/usr/bin/env bash
# Install everything into .venv at the repo root and build the embedded tiny pipelines.
# Idempotent: a second run only checks. Works offline except for the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PY --version)"
    $PY -m venv .venv
fi
if ! .venv/bin/python -c "import ditserve, pytriton, tritonclient.grpc, diffusers, av, ftfy, hypothesis, kubernetes_validate, matplotlib, fastapi, uvicorn, python_multipart, openai, playwright" 2>/dev/null; then
    # torch first, pinned: an unpinned torch would pull a multi-GB CUDA build on a CPU machine.
    echo "[setup] installing ${TORCH_SPEC:=torch==2.13.0} and the package (.[server,frontend,test])"
    .venv/bin/pip install -q --disable-pip-version-check "$TORCH_SPEC"
    .venv/bin/pip install -q --disable-pip-version-check -e '.[server,frontend,test]'
fi
.venv/bin/python scripts/build_tiny_pipelines.py
echo "[setup] ready: $(.venv/bin/python -c 'import torch, diffusers, tritonclient; print("torch", torch.__version__, "diffusers", diffusers.__version__)')"
