"""QwenImageAdapter on the tiny Qwen-Image pipeline against plain diffusers QwenImagePipeline
(no server), with our guidance_scale as its true_cfg_scale.

Tolerance: 1 uint8 level (helpers.TOLERANCE). The pipeline encodes the prompt and the
negative prompt apart, each as long as it is; we encode them in one batch padded to
max_sequence_length and mask the padding out of the attention, and run [negative, prompt] as
one forward. The masked padding and other row counts can move a last float bit.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import QwenImagePipeline

from ditserve.adapters.qwen_image import pack_tokens
from ditserve.schema import GenerationParams
from mmdit_helpers import QWEN_DEPLOYMENT as DEP
from mmdit_helpers import diffusers_qwen_image
from helpers import assert_matches
from wan_helpers import encode, oracle, run_engine, run_steps, stage_adapters


@pytest.fixture(scope="module")
def stages():
    return stage_adapters(DEP)


@pytest.fixture(scope="module")
def pipe():
    return oracle(QwenImagePipeline, DEP)


def params(seed: int, steps: int = 6, guidance: float = 4.0, height: int = 64, width: int = 64,
           prompt: str = "a red cat on a blue sofa", negative: str = " ") -> GenerationParams:
    return GenerationParams(prompt, negative, height, width, steps, guidance, seed)


def expected(pipe, p: GenerationParams) -> np.ndarray:
    return diffusers_qwen_image(pipe, p.prompt, p.seed, p.num_inference_steps, p.guidance_scale, p.height, p.width,
                                p.negative_prompt)


def test_texts_are_padded_to_max_sequence_length_with_their_padding_masked(stages, pipe):
    cond = encode(stages, params(seed=0, negative="blurry"))
    assert cond.embeds.shape == (2, DEP.model.max_sequence_length, 32)
    own, _ = pipe.encode_prompt(["a red cat on a blue sofa"], max_sequence_length=DEP.model.max_sequence_length)
    length = own.shape[1]   # the prompt's tokens after the template's
    assert cond.mask[1].tolist() == [1] * length + [0] * (DEP.model.max_sequence_length - length)
    torch.testing.assert_close(cond.embeds[1, :length], own[0], rtol=1e-5, atol=1e-5)
    assert not cond.embeds[1, length:].any()


@pytest.mark.parametrize("p", [params(seed=7), params(seed=8, guidance=1.0, height=96, width=32),
                               params(seed=9, guidance=6.0, negative="blurry, dark", height=48, width=80)],
                         ids=["true-cfg-64x64", "no-cfg-96x32", "true-cfg-negative-48x80"])
def test_generation_matches_diffusers(stages, pipe, p):
    state = stages["dit"].prepare("solo", p, encode(stages, p))
    assert state.latents.shape == (1, 16, p.height // 8, p.width // 8)
    assert_matches(run_steps(stages, [state], [0])[0], expected(pipe, p))


def test_requests_batched_at_different_steps_match_diffusers(stages, pipe):
    """Through the step engine: two true-CFG requests of different prompts, guidance and step
    counts share forwards at different timesteps; a no-CFG one and another size run apart."""
    requests = {"a": params(seed=1), "b": params(seed=2, steps=9, guidance=7.0, prompt="a dog in the snow"),
                "c": params(seed=3, steps=5, guidance=1.0), "d": params(seed=4, height=32, width=96)}
    media, sizes = run_engine(stages, requests, {"a": 0, "b": 2, "c": 1, "d": 1}, lambda p: encode(stages, p))
    assert max(sizes) == 2
    for key, p in requests.items():
        assert_matches(media[key], expected(pipe, p))


def test_final_latents_match_diffusers_to_float_precision(stages, pipe):
    """The tiny VAE maps most latent differences below one uint8 level, so the true-CFG
    rescale is checked on the latents: with it they agree to ~1e-6 (measured), with plain CFG
    they would be ~1e-2 off."""
    p = params(seed=5, guidance=5.0, negative="blurry")
    state = stages["dit"].prepare("solo", p, encode(stages, p))
    while not state.done:
        stages["dit"].scheduler_step(state, stages["dit"].denoise([state])[0])
    want = pipe(p.prompt, negative_prompt=p.negative_prompt, true_cfg_scale=p.guidance_scale, height=p.height,
                width=p.width, num_inference_steps=p.num_inference_steps, output_type="latent",
                max_sequence_length=DEP.model.max_sequence_length,
                generator=torch.Generator("cpu").manual_seed(p.seed)).images
    torch.testing.assert_close(pack_tokens(state.latents), want, rtol=0, atol=1e-4)
