"""Triton Python-backend shims, one per stage; `backends/diffusion/model.py` picks one.

These are the only modules that import `triton_python_backend_utils`: they turn Triton
requests into calls on the schema, engine and adapters, and results back into responses.
"""
from __future__ import annotations

import importlib

STAGES = {
    "text_encoder": "ditserve.stages.text_encoder:TextEncoderStage",
    "dit": "ditserve.stages.dit:DitStage",
    "vae_decode": "ditserve.stages.vae_decode:VaeDecodeStage",
    "vae_encode": "ditserve.stages.vae_encode:VaeEncodeStage",
    "generate": "ditserve.stages.generate:GenerateStage",
}


def stage_class(name: str):
    try:
        module, cls = STAGES[name].split(":")
    except KeyError:
        raise ValueError(f"config.pbtxt parameter stage={name!r} is unknown; known: {sorted(STAGES)}") from None
    return getattr(importlib.import_module(module), cls)
