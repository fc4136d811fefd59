"""Wan22TI2VAdapter (Wan2.2 TI2V-5B, text-to-video) on its tiny pipeline against plain diffusers
WanPipeline with `expand_timesteps` (no server): a timestep per latent token, the 48-channel
16x Wan2.2 VAE.

Parity tolerance: 1 uint8 level (tests/test_wan_adapter.py says why).
"""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from diffusers import WanPipeline

from conftest import diffusers_video
from ditserve.deployment import load_deployment
from ditserve.schema import GenerationParams
from helpers import assert_matches
from wan_helpers import encode, oracle, run_engine, stage_adapters, video_params

DEP = load_deployment("configs/tiny-wan22-ti2v.toml")


@pytest.fixture(scope="module")
def stages():
    return stage_adapters(DEP)


def expected(pipe, p: GenerationParams):
    return diffusers_video(pipe, p.prompt, p.seed, p.num_inference_steps, p.guidance_scale, p.num_frames,
                           p.height, p.width, p.negative_prompt)


def test_shapes_come_from_the_wan22_vae(stages):
    dit = stages["dit"]
    assert (dit.vae_scale_factor, dit.vae_scale_factor_temporal) == (16, 4)
    assert dit.latent_shape(video_params(seed=0, frames=121, height=704, width=1280)) == (1, 48, 31, 44, 80)


def test_solo_and_batched_requests_match_diffusers(stages):
    """Through the real StepEngine: `a` alone first, then `b` joins it two steps later (their
    rows at different timesteps in one forward); `c` runs without CFG at another size."""
    pipe = oracle(WanPipeline, DEP)
    requests = {"a": video_params(seed=1), "b": video_params(seed=2, guidance=3.0, prompt="a dog in the snow"),
                "c": video_params(seed=3, guidance=1.0, frames=5, height=32, width=96)}
    media, sizes = run_engine(stages, requests, {"a": 0, "b": 2, "c": 1}, lambda p: encode(stages, p))
    assert max(sizes) == 2
    for key, p in requests.items():
        assert_matches(media[key], expected(pipe, p))


def test_a_size_multiple_below_the_vae_and_patch_fails_at_load(stages):
    dit = copy.copy(stages["dit"])
    dit.deployment = replace(DEP, limits=replace(DEP.limits, size_multiple=16))
    with pytest.raises(ValueError, match="set size_multiple = 32"):
        dit.check_limits("dit")
