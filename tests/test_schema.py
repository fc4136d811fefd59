"""Unit tests of request decoding and validation (pure logic, no server)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ditserve.deployment import load_deployment
from ditserve.schema import GenerationParams, InvalidRequest, check_params, decode_request

DEP = load_deployment("configs/tiny-pixart-sigma.toml")


def _inputs(**overrides):
    base = {"prompt": np.array([b"a cat"], dtype=np.object_)}
    base.update(overrides)
    return base


def test_defaults_come_from_the_deployment():
    params = decode_request(_inputs(seed=np.array([7], dtype=np.int64)), DEP)
    assert (params.height, params.width) == (DEP.defaults.height, DEP.defaults.width)
    assert params.num_inference_steps == DEP.defaults.num_inference_steps
    assert params.guidance_scale == DEP.defaults.guidance_scale
    assert params.negative_prompt == DEP.defaults.negative_prompt
    assert params.seed == 7 and not params.seed_was_drawn


def test_missing_seed_is_drawn_and_flagged():
    a, b = decode_request(_inputs(), DEP), decode_request(_inputs(), DEP)
    assert a.seed_was_drawn and 0 <= a.seed < 2**63 and a.seed != b.seed


def test_params_round_trip_through_json():
    params = decode_request(_inputs(seed=np.array([3], dtype=np.int64)), DEP)
    assert GenerationParams.from_json(params.to_json()) == params


@pytest.mark.parametrize("name, value, words", [
    ("height", np.array([72], dtype=np.int32), ["height", "multiple of 16"]),
    ("width", np.array([16], dtype=np.int32), ["width", "[32, 256]"]),
    ("width", np.array([4096], dtype=np.int32), ["width", "[32, 256]"]),
    ("num_inference_steps", np.array([0], dtype=np.int32), ["num_inference_steps", "[1, 100]"]),
    ("num_inference_steps", np.array([101], dtype=np.int32), ["num_inference_steps", "[1, 100]"]),
    ("guidance_scale", np.array([-1.0], dtype=np.float32), ["guidance_scale", "[0.0, 30.0]"]),
    ("guidance_scale", np.array([np.nan], dtype=np.float32), ["guidance_scale", "finite"]),
    ("guidance_scale", np.array([np.inf], dtype=np.float32), ["guidance_scale", "finite"]),
    ("seed", np.array([-5], dtype=np.int64), ["seed", "[0, "]),
    ("prompt", np.array([b"   "], dtype=np.object_), ["prompt", "empty"]),
    ("prompt", np.array([b"x" * 5000], dtype=np.object_), ["prompt", "4096 bytes"]),
    ("prompt", np.array([b"\xff\xfe"], dtype=np.object_), ["prompt", "UTF-8"]),
    ("height", np.array([64], dtype=np.int64), ["height", "INT32"]),
    ("height", np.array([64, 64], dtype=np.int32), ["height", "shape [1]"]),
    ("colour", np.array([1], dtype=np.int32), ["unknown input", "colour"]),
])
def test_bad_values_name_the_input_and_the_limit(name, value, words):
    with pytest.raises(InvalidRequest) as err:
        decode_request(_inputs(**{name: value}), DEP)
    for word in words:
        assert word in str(err.value)


def test_prompt_is_required():
    with pytest.raises(InvalidRequest, match="'prompt'.*required"):
        decode_request({}, DEP)


def test_cfg_follows_diffusers_rule():
    assert not decode_request(_inputs(guidance_scale=np.array([1.0], dtype=np.float32)), DEP).do_cfg
    assert decode_request(_inputs(guidance_scale=np.array([1.5], dtype=np.float32)), DEP).do_cfg


FLUX_DEV = load_deployment("configs/tiny-flux.toml")
FLUX_SCHNELL = load_deployment("configs/flux.1-schnell.toml")


def test_a_guidance_distilled_family_never_runs_cfg():
    params = decode_request(_inputs(guidance_scale=np.array([3.5], dtype=np.float32)), FLUX_DEV)
    assert params.guidance_scale == 3.5 and not params.cfg and not params.do_cfg
    assert GenerationParams.from_json(params.to_json()) == params


@pytest.mark.parametrize("deployment, name, value, words", [
    (FLUX_DEV, "negative_prompt", np.array([b"blurry"], dtype=np.object_),
     ["'negative_prompt'", "family flux", "leave it out"]),
    (FLUX_SCHNELL, "guidance_scale", np.array([3.5], dtype=np.float32),
     ["'guidance_scale'=3.5", "takes no guidance", "send 0"]),
])
def test_inputs_a_family_has_no_use_for_are_rejected_by_name(deployment, name, value, words):
    with pytest.raises(InvalidRequest) as err:
        decode_request(_inputs(**{name: value}), deployment)
    for word in words:
        assert word in str(err.value)
    assert decode_request(_inputs(negative_prompt=np.array([b""], dtype=np.object_)), deployment).negative_prompt == ""


WAN22 = load_deployment("configs/tiny-wan22.toml")


@pytest.mark.parametrize("deployment", [load_deployment("configs/tiny-wan-t2v.toml"), DEP, FLUX_DEV,
                                        load_deployment("configs/tiny-wan22-ti2v.toml")])
def test_guidance_scale_2_is_only_for_a_family_with_a_low_noise_expert(deployment):
    """Served, Triton itself refuses it first (only wan22-t2v models declare it); dit, reachable
    with params JSON, refuses it too."""
    scale = np.array([2.0], dtype=np.float32)
    words = ["'guidance_scale_2'", "low-noise expert", f"family {deployment.model.family}", "wan22-t2v"]
    with pytest.raises(InvalidRequest) as err:
        decode_request(_inputs(guidance_scale_2=scale), deployment)
    assert all(word in str(err.value) for word in words), err.value
    with pytest.raises(InvalidRequest) as err:
        check_params(replace(decode_request(_inputs(), deployment), guidance_scale_2=2.0), deployment)
    assert all(word in str(err.value) for word in words), err.value
    params = decode_request(_inputs(guidance_scale_2=scale, guidance_scale=np.array([4.0], np.float32)), WAN22)
    assert (params.guidance_scale, params.guidance_scale_2) == (4.0, 2.0)
    assert GenerationParams.from_json(params.to_json()) == params
    assert decode_request(_inputs(), WAN22).guidance_scale_2 is None


def test_params_claiming_cfg_for_a_family_without_it_are_rejected():
    """dit is reachable directly with params JSON: it applies the same rule."""
    params = decode_request(_inputs(), FLUX_DEV)
    with pytest.raises(InvalidRequest, match="cfg.*flux has no classifier-free guidance"):
        check_params(replace(params, cfg=True), FLUX_DEV)
    with pytest.raises(InvalidRequest, match="cfg.*runs classifier-free guidance"):
        check_params(replace(decode_request(_inputs(), DEP), cfg=False), DEP)
