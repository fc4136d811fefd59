"""WanT2VAdapter on the tiny Wan2.1 pipeline against plain diffusers WanPipeline (no server).

One adapter per stage, as the serving stages hold them: text_encoder encodes
[negative, prompt], dit prepares and steps, vae_decode makes uint8 frames.

Parity tolerance: max abs diff <= 1 uint8 level per value. Without CFG the video is
bit-identical. With CFG the adapter runs [negative, prompt] as ONE batch-2 transformer
forward where diffusers runs two batch-1 forwards; CPU matmuls over a different row count
differ in the last float bit (measured 9e-7 on outputs of magnitude ~2), which can move a
value across one rounding boundary. The same holds for requests batched together.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from diffusers import WanPipeline

from ditserve.deployment import load_deployment
from ditserve.schema import GenerationParams
from ditserve.state import RequestState, TextConditioning
from helpers import assert_matches
from wan_helpers import oracle, run_steps, stage_adapters, video_params

DEP = load_deployment("configs/tiny-wan-t2v.toml")


@pytest.fixture(scope="module")
def stages():
    return stage_adapters(DEP)


@pytest.fixture(scope="module")
def pipe():
    return oracle(WanPipeline, DEP)




def _admit(stages, key: str, params: GenerationParams) -> RequestState:
    texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
    return stages["dit"].prepare(key, params, TextConditioning(*stages["text_encoder"].encode_text(texts)))




def _diffusers(pipe, params: GenerationParams) -> np.ndarray:
    frames = pipe(params.prompt, negative_prompt=params.negative_prompt, height=params.height, width=params.width,
                  num_frames=params.num_frames, num_inference_steps=params.num_inference_steps,
                  guidance_scale=params.guidance_scale, generator=torch.Generator("cpu").manual_seed(params.seed),
                  max_sequence_length=DEP.model.max_sequence_length, output_type="np").frames
    return (frames[0] * 255).round().astype(np.uint8)




@pytest.mark.parametrize("params", [
    video_params(seed=7),
    video_params(seed=8, guidance=1.0),
    video_params(seed=9, frames=5, height=48, width=32, negative=""),
], ids=["cfg", "no-cfg", "cfg-5-frames-48x32"])
def test_generation_matches_diffusers(stages, pipe, params):
    ours = run_steps(stages, [_admit(stages, "solo", params)], [0])[0]
    assert ours.shape == (params.num_frames, params.height, params.width, 3)  # [F, H, W, C]
    assert_matches(ours, _diffusers(pipe, params))


def test_requests_batched_at_different_timesteps_equal_their_solo_runs(stages):
    a, b = video_params(seed=1), video_params(seed=2, prompt="a dog in the snow", negative="")
    solo = [run_steps(stages, [_admit(stages, key, p)], [0])[0] for key, p in (("a", a), ("b", b))]
    # b joins 3 steps late: from then on every denoise is one forward over both requests' rows.
    batched = run_steps(stages, [_admit(stages, "a", a), _admit(stages, "b", b)], [0, 3])
    for ours, expected in zip(batched, solo):
        assert_matches(ours, expected)


def test_shapes_come_from_the_model_even_without_the_vae(stages):
    dit = stages["dit"]
    assert dit.pipe.vae is None and dit.pipe.transformer_2 is None
    assert (dit.vae_scale_factor, dit.vae_scale_factor_temporal) == (8, 4)
    assert dit.latent_shape(video_params(seed=0, frames=81, height=480, width=832)) == (1, 16, 21, 60, 104)
    assert dit.latent_dtype == torch.float32


@pytest.mark.parametrize("limits, words", [
    (dict(size_multiple=8), "set size_multiple = 16"),
    (dict(frames_step=3), "set frames_step = 4"),
])
def test_limits_that_disagree_with_the_model_fail_at_load(stages, limits, words):
    dit = copy.copy(stages["dit"])
    dit.deployment = replace(DEP, limits=replace(DEP.limits, **limits))
    with pytest.raises(ValueError, match=words):
        dit.check_limits("dit")
