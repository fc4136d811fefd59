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

from ditserve.adapters import adapter_for
from ditserve.deployment import load_deployment
from ditserve.schema import GenerationParams
from ditserve.state import RequestState, TextConditioning

DEP = load_deployment("configs/tiny-wan-t2v.toml")
TOLERANCE = 1


@pytest.fixture(scope="module")
def stages():
    adapter = adapter_for(DEP.model.family)
    return {stage: adapter(DEP, stage) for stage in ("text_encoder", "dit", "vae_decode")}


@pytest.fixture(scope="module")
def pipe():
    pipe = WanPipeline.from_pretrained(DEP.model_location())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _params(seed: int, guidance: float = 5.0, frames: int = 9, height: int = 64, width: int = 64,
            prompt: str = "a red cat on a blue sofa", negative: str = "blurry, dark") -> GenerationParams:
    return GenerationParams(prompt, negative, height, width, 10, guidance, seed, num_frames=frames)


def _admit(stages, key: str, params: GenerationParams) -> RequestState:
    texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
    return stages["dit"].prepare(key, params, TextConditioning(*stages["text_encoder"].encode_text(texts)))


def _run(stages, states: list[RequestState], start_ticks: list[int]) -> list[np.ndarray]:
    """Step all admitted states together (one denoise per tick) until done; uint8 videos."""
    tick = 0
    while not all(s.done for s in states):
        active = [s for s, start in zip(states, start_ticks) if start <= tick and not s.done]
        for state, output in zip(active, stages["dit"].denoise(active)):
            stages["dit"].scheduler_step(state, output)
        tick += 1
    videos = []
    for state in states:
        media, finite = stages["vae_decode"].decode(state.latents)
        assert finite == [True]
        videos.append(media[0].numpy())
    return videos


def _diffusers(pipe, params: GenerationParams) -> np.ndarray:
    frames = pipe(params.prompt, negative_prompt=params.negative_prompt, height=params.height, width=params.width,
                  num_frames=params.num_frames, num_inference_steps=params.num_inference_steps,
                  guidance_scale=params.guidance_scale, generator=torch.Generator("cpu").manual_seed(params.seed),
                  max_sequence_length=DEP.model.max_sequence_length, output_type="np").frames
    return (frames[0] * 255).round().astype(np.uint8)


def _assert_close(ours: np.ndarray, expected: np.ndarray) -> None:
    assert ours.dtype == np.uint8 and ours.shape == expected.shape
    diff = np.abs(ours.astype(int) - expected.astype(int))
    assert diff.max() <= TOLERANCE, f"max diff {diff.max()}, mean {diff.mean():.5f}"


@pytest.mark.parametrize("params", [
    _params(seed=7),
    _params(seed=8, guidance=1.0),
    _params(seed=9, frames=5, height=48, width=32, negative=""),
], ids=["cfg", "no-cfg", "cfg-5-frames-48x32"])
def test_generation_matches_diffusers(stages, pipe, params):
    ours = _run(stages, [_admit(stages, "solo", params)], [0])[0]
    assert ours.shape == (params.num_frames, params.height, params.width, 3)  # [F, H, W, C]
    _assert_close(ours, _diffusers(pipe, params))


def test_requests_batched_at_different_timesteps_equal_their_solo_runs(stages):
    a, b = _params(seed=1), _params(seed=2, prompt="a dog in the snow", negative="")
    solo = [_run(stages, [_admit(stages, key, p)], [0])[0] for key, p in (("a", a), ("b", b))]
    # b joins 3 steps late: from then on every denoise is one forward over both requests' rows.
    batched = _run(stages, [_admit(stages, "a", a), _admit(stages, "b", b)], [0, 3])
    for ours, expected in zip(batched, solo):
        _assert_close(ours, expected)


def test_shapes_come_from_the_model_even_without_the_vae(stages):
    dit = stages["dit"]
    assert dit.pipe.vae is None and dit.pipe.transformer_2 is None
    assert (dit.vae_scale_factor, dit.vae_scale_factor_temporal) == (8, 4)
    assert dit.latent_shape(_params(seed=0, frames=81, height=480, width=832)) == (1, 16, 21, 60, 104)
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
