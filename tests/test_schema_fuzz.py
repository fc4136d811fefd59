"""Property-based fuzzing of request validation (hypothesis; pure logic, no server).

For any mapping of input names to arrays, `decode_request` either returns params within
the deployment's limits or raises InvalidRequest; never another exception (which would
reach the client as an internal error instead of a message naming the input).
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ditserve.deployment import load_deployment
from ditserve.schema import MAX_SEED, TXT2IMG_INPUTS, GenerationParams, InvalidRequest, check_params, decode_request

DEP = load_deployment("configs/tiny-pixart-sigma.toml")
LIM = DEP.limits
NAMES = [spec.name for spec in TXT2IMG_INPUTS]

# Values near and at every limit, plus the extremes of each dtype.
INTS = st.one_of(
    st.sampled_from([0, 1, -1, LIM.min_size, LIM.max_size, LIM.size_multiple, LIM.max_steps, LIM.max_steps + 1,
                     LIM.min_size - LIM.size_multiple, LIM.max_size + LIM.size_multiple, 2**31 - 1, -(2**31)]),
    st.integers(-(2**31), 2**31 - 1),
)
INT64S = st.one_of(st.sampled_from([0, -1, MAX_SEED, -(2**63)]), st.integers(-(2**63), 2**63 - 1))
FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1.0, LIM.max_guidance_scale, LIM.max_guidance_scale + 1e-3, -1e-30]),
                   st.floats(width=32, allow_nan=True, allow_infinity=True))
TEXTS = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b" ", b"\t\n", "\u3000".encode(), b"\xff\xfe", b"a" * LIM.max_prompt_bytes,
                     b"a" * (LIM.max_prompt_bytes + 1), "é".encode() * (LIM.max_prompt_bytes // 2)]),
)
SHAPES = st.one_of(st.just((1,)), st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple))


def _array(elements, dtype, shape):
    size = int(np.prod(shape)) if shape else 1
    return st.lists(elements, min_size=size, max_size=size).map(
        lambda values: np.array(values, dtype=dtype).reshape(shape))


@st.composite
def arrays(draw):
    """An input value as Triton's Python backend could hand it over (or a wrong one)."""
    shape = draw(SHAPES)
    kind = draw(st.sampled_from(["bytes", "str", "int32", "int64", "float32", "float64", "bool", "uint8"]))
    if kind == "bytes":
        return draw(_array(TEXTS, np.object_, shape))
    if kind == "str":
        return draw(_array(st.text(max_size=8), np.str_, shape))
    if kind in ("int32", "uint8"):
        return draw(_array(INTS, np.int64, shape)).astype(kind)
    if kind == "int64":
        return draw(_array(INT64S, np.int64, shape))
    if kind in ("float32", "float64"):
        return draw(_array(FLOATS, np.float64, shape)).astype(kind)
    return draw(_array(st.booleans(), np.bool_, shape))


@st.composite
def well_typed(draw):
    """Right dtypes and shapes, arbitrary values: exercises the range checks."""
    inputs = {"prompt": np.array([draw(TEXTS)], dtype=np.object_)}
    values = {"negative_prompt": (TEXTS, np.object_), "height": (INTS, np.int32), "width": (INTS, np.int32),
              "num_inference_steps": (INTS, np.int32), "guidance_scale": (FLOATS, np.float32),
              "seed": (INT64S, np.int64)}
    for name, (elements, dtype) in values.items():
        if draw(st.booleans()):
            inputs[name] = np.array([draw(elements)], dtype=dtype)
    return inputs


REQUESTS = st.one_of(
    well_typed(),
    st.dictionaries(st.one_of(st.sampled_from(NAMES), st.text(min_size=1, max_size=12)),
                    st.one_of(st.none(), arrays()), max_size=9),
)


def _assert_within_limits(params: GenerationParams) -> None:
    assert isinstance(params, GenerationParams)
    for side in (params.height, params.width):
        assert type(side) is int and LIM.min_size <= side <= LIM.max_size and side % LIM.size_multiple == 0
    assert type(params.num_inference_steps) is int and 1 <= params.num_inference_steps <= LIM.max_steps
    assert type(params.guidance_scale) is float and math.isfinite(params.guidance_scale)
    assert 0.0 <= params.guidance_scale <= LIM.max_guidance_scale
    assert type(params.seed) is int and 0 <= params.seed <= MAX_SEED
    assert params.prompt.strip() and len(params.prompt.encode()) <= LIM.max_prompt_bytes
    assert len(params.negative_prompt.encode()) <= LIM.max_prompt_bytes
    assert GenerationParams.from_json(params.to_json()) == params   # what dit receives
    assert check_params(params, DEP) is params                      # and dit re-checks


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REQUESTS)
def test_decode_request_returns_valid_params_or_raises_invalid_request(inputs):
    try:
        params = decode_request(inputs, DEP)
    except InvalidRequest as exc:
        assert str(exc).startswith(("input", "unknown input")), str(exc)
        return
    _assert_within_limits(params)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["prompt", "negative_prompt", "height", "width", "num_inference_steps",
                                        "guidance_scale", "seed", "seed_was_drawn"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                                 st.text(max_size=10)), min_size=8, max_size=8))
def test_dit_rechecks_params_it_is_sent_directly(fields):
    """`dit` can be called by any client: whatever decoded params it gets are checked, never trusted."""
    params = GenerationParams(**fields)
    try:
        check_params(params, DEP)
    except InvalidRequest:
        return
    _assert_within_limits(params)
