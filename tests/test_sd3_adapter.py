"""SD3Adapter on the tiny Stable Diffusion 3.5 pipeline against plain diffusers
StableDiffusion3Pipeline (no server).

Tolerance: 1 uint8 level (helpers.TOLERANCE): with CFG the adapter runs [negative, prompt]
as one 2-row forward where diffusers does too, but it encodes both texts in one batch and
batches requests together; CPU kernels over other row counts can move a last float bit.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from diffusers import StableDiffusion3Pipeline

from ditserve.schema import GenerationParams
from mmdit_helpers import SD3_DEPLOYMENT as DEP
from mmdit_helpers import diffusers_sd3_image
from helpers import assert_matches
from wan_helpers import encode, oracle, run_engine, run_steps, stage_adapters


@pytest.fixture(scope="module")
def stages():
    return stage_adapters(DEP)


@pytest.fixture(scope="module")
def pipe():
    return oracle(StableDiffusion3Pipeline, DEP)


def params(seed: int, steps: int = 6, guidance: float = 5.0, height: int = 64, width: int = 64,
           prompt: str = "a red cat on a blue sofa", negative: str = "blurry") -> GenerationParams:
    return GenerationParams(prompt, negative, height, width, steps, guidance, seed)


def expected(pipe, p: GenerationParams) -> np.ndarray:
    return diffusers_sd3_image(pipe, p.prompt, p.seed, p.num_inference_steps, p.guidance_scale, p.height, p.width,
                               p.negative_prompt)


@pytest.mark.parametrize("p", [params(seed=7), params(seed=8, guidance=1.0, height=96, width=32)],
                         ids=["cfg-64x64", "no-cfg-96x32"])
def test_generation_matches_diffusers(stages, pipe, p):
    state = stages["dit"].prepare("solo", p, encode(stages, p))
    rows = 2 if p.do_cfg else 1
    assert state.cond.embeds.shape[:2] == (rows, 77 + DEP.model.max_sequence_length)  # CLIP tokens, then T5
    assert tuple(state.cond.extra["pooled_embeds"].shape) == (rows, 32)  # CLIP-L + CLIP-G pooled, per row
    assert_matches(run_steps(stages, [state], [0])[0], expected(pipe, p))


def test_requests_batched_at_different_steps_match_diffusers(stages, pipe):
    """Through the step engine: two CFG requests share forwards at different timesteps; a no-CFG
    one runs in its own group."""
    requests = {"a": params(seed=1), "b": params(seed=2, steps=9, guidance=7.0, prompt="a dog in the snow"),
                "c": params(seed=3, steps=5, guidance=1.0)}
    media, sizes = run_engine(stages, requests, {"a": 0, "b": 2, "c": 1}, lambda p: encode(stages, p))
    assert max(sizes) == 2
    for key, p in requests.items():
        assert_matches(media[key], expected(pipe, p))


@pytest.mark.parametrize("limits, words", [
    (dict(size_multiple=8), "multiple of 16"),
    (dict(max_size=512), "max_size <= 256"),
])
def test_limits_that_disagree_with_the_model_fail_at_load(stages, limits, words):
    dit = copy.copy(stages["dit"])
    dit.deployment = replace(DEP, limits=replace(DEP.limits, **limits))
    with pytest.raises(ValueError, match=words):
        dit.check_limits("dit")


def test_pooled_rows_must_match_the_text_rows(stages):
    cond = stages["text_encoder"].encode_prompts(["a cat"])  # one row, but the request runs CFG (two)
    cond.embeds = torch.cat([cond.embeds] * 2)
    with pytest.raises(ValueError, match=r"pooled_embeds' must be \[2, 32\].*got \(1, 32\)"):
        stages["dit"].prepare("bad", params(seed=1), cond)
