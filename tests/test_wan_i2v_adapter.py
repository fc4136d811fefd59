"""WanI2VAdapter on the tiny Wan2.1 I2V pipeline against plain diffusers WanImageToVideoPipeline
(no server).

One adapter per stage, as the serving stages will hold them: text_encoder encodes
[negative, prompt], vae_encode turns the input image into CLIP image embeddings and the
first-frame condition, dit prepares and steps, vae_decode makes uint8 frames. diffusers
gets the same pixels as a PIL image, the way its users call it.

Parity tolerance: max abs diff <= 1 uint8 level per value, for the reason test_wan_adapter.py
gives (CFG rows and batched requests share one forward where diffusers runs batch-1
forwards; CPU matmuls over another row count differ in the last float bit). The image
conditioning itself is bit-identical to the pipeline's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import WanImageToVideoPipeline

from ditserve.adapters.wan_i2v import CONDITION, IMAGE_EMBEDS
from ditserve.deployment import load_deployment
from ditserve.schema import GenerationParams
from ditserve.state import RequestState, TextConditioning
from helpers import assert_matches
from wan_helpers import conditioning_image, oracle, run_steps, stage_adapters, video_params

DEP = load_deployment("configs/tiny-wan-i2v.toml")


def _image(seed: int, height: int = 40, width: int = 56) -> torch.Tensor:
    return torch.from_numpy(conditioning_image(seed, height, width))


@pytest.fixture(scope="module")
def stages():
    return stage_adapters(DEP, ("text_encoder", "vae_encode", "dit", "vae_decode"))


@pytest.fixture(scope="module")
def pipe():
    return oracle(WanImageToVideoPipeline, DEP)




def _admit(stages, key: str, params: GenerationParams, image: torch.Tensor) -> RequestState:
    texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
    extra = stages["vae_encode"].encode_conditioning(image, params)
    cond = TextConditioning(*stages["text_encoder"].encode_text(texts), extra=extra)
    return stages["dit"].prepare(key, params, cond)




def _pil(image: torch.Tensor) -> PIL.Image.Image:
    return PIL.Image.fromarray(image.numpy())


def _diffusers(pipe, params: GenerationParams, image: torch.Tensor) -> np.ndarray:
    frames = pipe(_pil(image), params.prompt, negative_prompt=params.negative_prompt, height=params.height,
                  width=params.width, num_frames=params.num_frames, num_inference_steps=params.num_inference_steps,
                  guidance_scale=params.guidance_scale, generator=torch.Generator("cpu").manual_seed(params.seed),
                  max_sequence_length=DEP.model.max_sequence_length, output_type="np").frames
    return (frames[0] * 255).round().astype(np.uint8)




@pytest.mark.parametrize("params, image", [
    (video_params(seed=7), _image(1)),
    (video_params(seed=8, guidance=1.0), _image(2)),
    (video_params(seed=9, frames=5, height=48, width=32, negative=""), _image(3, height=100, width=30)),
], ids=["cfg", "no-cfg", "cfg-5-frames-48x32-from-100x30"])
def test_generation_matches_diffusers(stages, pipe, params, image):
    ours = run_steps(stages, [_admit(stages, "solo", params, image)], [0])[0]
    assert ours.shape == (params.num_frames, params.height, params.width, 3)  # [F, H, W, C]
    assert_matches(ours, _diffusers(pipe, params, image))


def test_requests_batched_at_different_timesteps_equal_their_solo_runs(stages):
    a, b = video_params(seed=1), video_params(seed=2, prompt="a dog in the snow", negative="")
    images = {"a": _image(4), "b": _image(5, height=64, width=64)}
    solo = [run_steps(stages, [_admit(stages, key, p, images[key])], [0])[0] for key, p in (("a", a), ("b", b))]
    # b joins 3 steps late: from then on every denoise is one forward over both requests' rows.
    states = [_admit(stages, "a", a, images["a"]), _admit(stages, "b", b, images["b"])]
    assert states[0].compat_key == states[1].compat_key
    for ours, expected in zip(run_steps(stages, states, [0, 3]), solo):
        assert_matches(ours, expected)


def test_image_conditioning_is_the_pipelines_bit_for_bit(stages, pipe):
    params, image = video_params(seed=3), _image(6)
    extra = stages["vae_encode"].encode_conditioning(image, params)
    assert torch.equal(extra[IMAGE_EMBEDS], pipe.encode_image(_pil(image), torch.device("cpu")))
    pixels = pipe.video_processor.preprocess(_pil(image), height=params.height, width=params.width)
    assert torch.equal(stages["vae_encode"].preprocess_image(image, params.height, params.width), pixels)
    assert pixels.min() >= -1 and pixels.max() <= 1
    _, condition = pipe.prepare_latents(pixels, 1, 16, params.height, params.width, params.num_frames,
                                        torch.float32, torch.device("cpu"), torch.Generator("cpu").manual_seed(0))
    assert extra[CONDITION].shape == (1, 4 + 16, 3, 8, 8) and torch.equal(extra[CONDITION], condition)


def test_compat_key_separates_image_from_text_conditioning(stages):
    state = _admit(stages, "k", video_params(seed=4), _image(7))
    text_only = replace(state, cond=TextConditioning(state.cond.embeds, state.cond.mask))
    assert tuple(state.latents.shape) == tuple(text_only.latents.shape) == (1, 16, 3, 8, 8)
    assert state.compat_key != text_only.compat_key


def test_stages_load_only_their_components_and_shapes_come_from_the_model(stages):
    encode, dit = stages["vae_encode"], stages["dit"]
    assert encode.pipe.transformer is None and encode.pipe.text_encoder is None
    assert encode.pipe.image_encoder is not None and encode.pipe.image_processor is not None
    assert dit.pipe.vae is None and dit.pipe.image_encoder is None and dit.pipe.transformer_2 is None
    assert dit.pipe.transformer.config.in_channels == 36 and dit.num_channels_latents == 16
    assert dit.latent_shape(video_params(seed=0, frames=81, height=480, width=832)) == (1, 16, 21, 60, 104)


@pytest.mark.parametrize("image, words", [
    (_image(0).float(), "must be uint8"),
    (torch.zeros(40, 56, 4, dtype=torch.uint8), "3 channels .* got 4"),
    (torch.zeros(40, 56, 1, dtype=torch.uint8), "3 channels .* got 1"),
    (torch.zeros(3, 40, 56, dtype=torch.uint8), "3 channels .* got 56"),  # channels first
    (torch.zeros(40, 56, dtype=torch.uint8), r"must be \[H, W, 3\]"),
    (torch.zeros(0, 56, 3, dtype=torch.uint8), "empty"),
    (torch.zeros(40, 0, 3, dtype=torch.uint8), "empty"),
    (np.zeros((40, 56, 3), dtype=np.uint8), "torch.Tensor"),
], ids=["float", "rgba", "gray-hw1", "chw", "2d", "zero-height", "zero-width", "numpy"])
def test_bad_input_images_are_refused_with_the_problem_named(stages, image, words):
    encode = stages["vae_encode"]
    with pytest.raises(ValueError, match=words):
        encode.preprocess_image(image, 64, 64)
    with pytest.raises(ValueError, match=words):
        encode.encode_image([image])


def test_conditioning_that_does_not_fit_the_request_is_refused(stages):
    params, dit = video_params(seed=5), stages["dit"]
    texts = TextConditioning(*stages["text_encoder"].encode_text([params.negative_prompt, params.prompt]))
    with pytest.raises(ValueError, match="lacks"):
        dit.prepare("x", params, texts)
    extra = stages["vae_encode"].encode_conditioning(_image(8), replace(params, num_frames=5))
    with pytest.raises(ValueError, match="condition.*9 frames"):
        dit.prepare("x", params, replace(texts, extra=extra))
    with pytest.raises(ValueError, match="num_frames - 1 must be a multiple of 4"):
        stages["vae_encode"].encode_condition(torch.zeros(1, 3, 64, 64), num_frames=8)
