"""What each stage declares to Triton: the inputs and outputs `auto_complete_config` fills in.

Kept apart from the stages and free of torch, diffusers and the adapters: Triton starts one stub
per model only to complete its config, and that stub imports this module, not the stage. With
the stage modules it imported torch and every diffusers pipeline three extra times per server
start (~7 s of a tiny CPU server's ~22 s, measured 2026-12-03).
"""
from __future__ import annotations

from typing import Callable

from ..deployment import FAMILY_TEXT_CONDITIONING, TASK_CONDITIONING, Deployment
from . import STAGES, known_stage
from .common import TensorSpec, declare, media_dims, stage_deployment
from .cancel import IO_SPECS as CANCEL_SPECS
from .generate import io_specs as generate_specs

Specs = tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]

TEXT_INPUTS = (TensorSpec("text", "TYPE_STRING", (-1,)),)
EMBEDS_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}

# The public models hand `embeds` and `mask` (and a task's conditioning) over out of band
# (handoff.py) so they do not travel again at every step; a direct client sends them here.
DIT_INPUTS = (
    TensorSpec("embeds", "TYPE_FP32", (-1, -1, -1), optional=True),
    TensorSpec("mask", "TYPE_INT64", (-1, -1), optional=True),
    TensorSpec("params", "TYPE_STRING", (1,)),
)
# A request that cannot finish ends with an `error` output, not an error response:
# Triton 2.51 loses error responses of a decoupled model on the BLS path (the caller
# would wait forever), while data responses arrive. The message is UTF-8 in a UINT8
# tensor, not BYTES: on the H200, public-model stubs died right after dit's BYTES error
# responses to cancels, and BYTES is the only output whose unpacking in the caller's stub
# runs Python code (suspected, not proven: perf/results/2026-11-29-h200-soak.md).
# Responses carry only the outputs the request asked for (common.requested_outputs): a
# direct client that did not ask for `error` gets an error response, and one that did
# not ask for `progress` no progress.
# `cache_hits`, with the final latents: the steps the request's cache tier reused (0 for lossless).
DIT_OUTPUTS = (
    TensorSpec("progress", "TYPE_INT32", (2,)),
    TensorSpec("error", "TYPE_UINT8", (-1,)),
    TensorSpec("cache_hits", "TYPE_INT32", (1,)),
)
DIT_OUTPUT_NAMES = tuple(spec.name for spec in DIT_OUTPUTS) + ("latents",)

VAE_ENCODE_INPUTS = (TensorSpec("image", "TYPE_UINT8", (-1, -1, 3)), TensorSpec("params", "TYPE_STRING", (1,)))


def latents_spec(deployment: Deployment) -> TensorSpec:
    """[C, h, w] per image generation, [C, f, h, w] per video generation (batch dim implied)."""
    return TensorSpec("latents", "TYPE_FP32", (-1,) * (4 if deployment.is_video else 3))


def text_encoder_specs(deployment: Deployment) -> Specs:
    """`embeds` (and the family's extras) in the deployment's dtype, `mask` as int64."""
    dtype = EMBEDS_TYPES[deployment.model.dtype]
    extras = tuple(TensorSpec(name, dtype, (-1,) * rank)
                   for name, rank in FAMILY_TEXT_CONDITIONING.get(deployment.model.family, ()))
    return TEXT_INPUTS, (TensorSpec("embeds", dtype, (-1, -1, -1)), TensorSpec("mask", "TYPE_INT64", (-1, -1))) + extras


def dit_specs(deployment: Deployment) -> Specs:
    """The fixed I/O plus the latents and the optional conditioning inputs of the family's text
    encoders and of image-conditioned tasks (deployment.Deployment.conditioning)."""
    conditioning = tuple(TensorSpec(name, "TYPE_FP32", (-1,) * rank, optional=True)
                         for name, rank in deployment.conditioning)
    return DIT_INPUTS + conditioning, DIT_OUTPUTS + (latents_spec(deployment),)


def vae_decode_specs(deployment: Deployment) -> Specs:
    return (latents_spec(deployment),), (TensorSpec("media", "TYPE_UINT8", media_dims(deployment)),)


def vae_encode_specs(deployment: Deployment) -> Specs:
    return VAE_ENCODE_INPUTS, tuple(TensorSpec(name, "TYPE_FP32", (-1,) * rank)
                                    for name, rank in TASK_CONDITIONING.get(deployment.task, ()))


SPECS: dict[str, Callable[[Deployment], Specs]] = {
    "text_encoder": text_encoder_specs,
    "dit": dit_specs,
    "vae_decode": vae_decode_specs,
    "vae_encode": vae_encode_specs,
    "generate": generate_specs,
    "cancel": lambda deployment: CANCEL_SPECS,
}
assert SPECS.keys() == STAGES.keys(), "every stage declares its I/O here"


def auto_complete(stage: str, config):
    """Fill the inputs and outputs config.pbtxt leaves out for a model of `stage`."""
    return declare(config, *SPECS[known_stage(stage)](stage_deployment(config.as_dict())))
