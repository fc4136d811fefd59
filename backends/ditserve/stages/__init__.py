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
    "cancel": "ditserve.stages.cancel:CancelStage",
}


def known_stage(name: str) -> str:
    """`name`, or a ValueError naming the stages there are."""
    if name not in STAGES:
        raise ValueError(f"config.pbtxt parameter stage={name!r} is unknown; known: {sorted(STAGES)}")
    return name


def stage_class(name: str):
    module, cls = STAGES[known_stage(name)].split(":")
    return getattr(importlib.import_module(module), cls)
