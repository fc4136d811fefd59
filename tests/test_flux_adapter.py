"""FluxAdapter on the tiny FLUX.1 pipeline against plain diffusers FluxPipeline (no server).

One adapter per stage, as the serving stages hold them. FLUX.1 has no CFG rows, so a solo
request runs the same one-row forwards as diffusers and its image is bit-identical. Requests
batched in one forward (one size, different steps, schedules and guidance) are within 1 uint8
level: CPU matmuls over 2 rows can differ from 1 row in the last float bit (measured: 1 pixel
of 12288 off by 1). A FLUX.1-schnell-style variant (no guidance embedding, no dynamic shift) is
built from the tiny pipeline's parts and saved to a temporary folder.
"""
from __future__ import annotations

import copy
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

from ditserve.deployment import dump_toml, load_deployment
from ditserve.schema import GenerationParams
from mmdit_helpers import FLUX_DEPLOYMENT as DEP
from mmdit_helpers import diffusers_flux_image
from helpers import assert_matches
from wan_helpers import oracle, run_engine, run_steps, stage_adapters


@pytest.fixture(scope="module")
def stages():
    return stage_adapters(DEP)


@pytest.fixture(scope="module")
def pipe():
    return oracle(FluxPipeline, DEP)


def params(seed: int, steps: int = 6, guidance: float = 3.5, height: int = 64, width: int = 64,
           prompt: str = "a red cat on a blue sofa") -> GenerationParams:
    return GenerationParams(prompt, "", height, width, steps, guidance, seed, cfg=False)


def admit(stages, key: str, p: GenerationParams):
    return stages["dit"].prepare(key, p, stages["text_encoder"].encode_prompts([p.prompt]))


def expected(pipe, p: GenerationParams) -> np.ndarray:
    return diffusers_flux_image(pipe, p.prompt, p.seed, p.num_inference_steps, p.guidance_scale, p.height, p.width)


@pytest.mark.parametrize("p", [params(seed=7), params(seed=8, guidance=1.0, height=96, width=32)],
                         ids=["64x64-guidance-3.5", "96x32-guidance-1"])
def test_generation_is_bit_identical_to_diffusers(stages, pipe, p):
    state = admit(stages, "solo", p)
    assert state.latents.shape == (1, 16, p.height // 8, p.width // 8)  # the VAE layout; packed per forward
    assert [tuple(t.shape) for t in state.cond.extra.values()] == [(1, 16), (1,)]  # pooled CLIP, guidance
    np.testing.assert_array_equal(run_steps(stages, [state], [0])[0], expected(pipe, p))


def test_each_size_gets_its_own_shifted_schedule(stages):
    small, large = (admit(stages, k, params(seed=1, height=h, width=h)) for k, h in (("s", 32), ("l", 256)))
    assert not torch.equal(small.timesteps, large.timesteps)
    assert (large.timesteps[1:] > small.timesteps[1:]).all()  # more tokens, larger shift: later sigmas higher


def test_requests_batched_at_different_steps_and_sizes_equal_diffusers(stages, pipe):
    """The step engine's own grouping: the 64x64 requests share one forward, the 96x64 one has its own."""
    requests = {"a": params(seed=1), "b": params(seed=2, steps=9, guidance=5.0, prompt="a dog in the snow"),
                "c": params(seed=3, steps=5, height=96, width=64)}
    # b joins 2 steps late and c 3: a and b then share every forward, at different timesteps of
    # different schedules, with different guidance.
    media, sizes = run_engine(stages, requests, {"a": 0, "b": 2, "c": 3},
                              lambda p: stages["text_encoder"].encode_prompts([p.prompt]))
    assert max(sizes) == 2
    for key, p in requests.items():
        assert_matches(media[key], expected(pipe, p))


def test_a_schnell_style_model_runs_without_guidance(pipe, tmp_path):
    """No guidance embedding and a static shift of 1, as FLUX.1-schnell, saved and served from
    its own folder with guidance 0: still bit-identical. Its dit refuses a deployment that
    allows guidance."""
    config = dict(pipe.transformer.config) | {"guidance_embeds": False}
    torch.manual_seed(0)
    schnell = FluxPipeline(**{**pipe.components, "transformer": FluxTransformer2DModel.from_config(config).eval(),
                              "scheduler": FlowMatchEulerDiscreteScheduler.from_config(
                                  pipe.scheduler.config, shift=1.0, use_dynamic_shifting=False)})
    schnell.set_progress_bar_config(disable=True)
    schnell.save_pretrained(tmp_path / "tiny-schnell", safe_serialization=True)
    data = tomllib.loads(Path(DEP.source).read_text())
    data["model"]["path"] = str(tmp_path / "tiny-schnell")
    data["defaults"]["guidance_scale"] = data["limits"]["max_guidance_scale"] = 0.0
    (tmp_path / "schnell.toml").write_text(dump_toml(data))
    variant = stage_adapters(load_deployment(tmp_path / "schnell.toml"))
    p = params(seed=4, steps=4, guidance=0.0)
    state = admit(variant, "schnell", p)
    assert "guidance" not in state.cond.extra
    np.testing.assert_array_equal(run_steps(variant, [state], [0])[0], expected(schnell, p))
    dit = copy.copy(variant["dit"])
    dit.deployment = replace(dit.deployment, limits=DEP.limits)
    with pytest.raises(ValueError, match="max_guidance_scale = 0"):
        dit.check_limits("dit")


def test_limits_that_disagree_with_the_model_fail_at_load(stages):
    dit = copy.copy(stages["dit"])
    dit.deployment = replace(DEP, limits=replace(DEP.limits, size_multiple=8))
    with pytest.raises(ValueError, match="multiple of 16"):
        dit.check_limits("dit")


def test_missing_pooled_embedding_is_a_clear_error(stages):
    cond = stages["text_encoder"].encode_prompts(["a cat"])
    cond.extra.clear()
    with pytest.raises(ValueError, match="pooled_embeds.*got None"):
        stages["dit"].prepare("bad", params(seed=1), cond)
