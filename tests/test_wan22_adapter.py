"""Wan22T2VAdapter on the tiny Wan2.2 A14B pipeline against plain diffusers WanPipeline (no server).

The tiny pipeline's two experts have different random weights, so a row run by the wrong
expert would not match diffusers. With 10 steps its timesteps are
[999, 964, 923, 875 | 818, ...]: four steps of the high-noise `transformer`, then six of
the low-noise `transformer_2` (boundary 0.875 x 1000, `t >= boundary` is high-noise).

Parity tolerance: 1 uint8 level (tests/test_wan_adapter.py says why).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from diffusers import WanPipeline

from conftest import ROOT, diffusers_video
from ditserve.adapters import adapter_for
from ditserve.deployment import load_deployment, write_variant
from ditserve.schema import GenerationParams
from helpers import assert_matches
from wan_helpers import encode, oracle, run_engine, stage_adapters, video_params

DEP = load_deployment("configs/tiny-wan22.toml")
HIGH, LOW = "transformer", "transformer_2"


@pytest.fixture(scope="module")
def stages():
    return stage_adapters(DEP)


@pytest.fixture(scope="module")
def pipe():
    return oracle(WanPipeline, DEP)


def expected(pipe, p: GenerationParams):
    return diffusers_video(pipe, p.prompt, p.seed, p.num_inference_steps, p.guidance_scale, p.num_frames,
                           p.height, p.width, p.negative_prompt)


def test_each_step_runs_the_expert_diffusers_picks(stages):
    state = stages["dit"].prepare("plan", video_params(seed=1), encode(stages, video_params(seed=1)))
    assert state.timesteps.tolist()[3:5] == [875, 818]
    assert state.modules == (HIGH,) * 4 + (LOW,) * 6
    assert set(stages["dit"].runners) == {HIGH, LOW}


def test_rows_straddling_the_boundary_split_by_expert_and_match_diffusers(stages, pipe, monkeypatch):
    """Through the real StepEngine: `b` joins two steps after `a`, so while `a` runs the low-noise
    expert `b` still runs the high-noise one; `c` is another size (its own group) and runs
    without CFG. Every forward runs one expert, and every video equals diffusers'."""
    requests = {"a": video_params(seed=1), "b": video_params(seed=2, guidance=3.0, prompt="a dog in the snow"),
                "c": video_params(seed=3, guidance=1.0, frames=5, height=48, width=32)}
    dit, forwards = stages["dit"], []
    denoise = dit.denoise

    def spy(states):
        forwards.append((tuple(s.key for s in states), *sorted({s.module for s in states})))
        return denoise(states)

    monkeypatch.setattr(dit, "denoise", spy)
    media, _ = run_engine(stages, requests, {"a": 0, "b": 2, "c": 1}, lambda p: encode(stages, p))
    assert all(len(forward) == 2 for forward in forwards)        # never two experts in one forward
    assert (("a", "b"), HIGH) in forwards and (("a", "b"), LOW) in forwards
    # a's low-noise steps (ticks 4-9) fall while b is in flight (ticks 2-11): a tick of a
    # low-noise forward of `a` alone also ran a high-noise one of `b` alone.
    assert (("a",), LOW) in forwards and (("b",), HIGH) in forwards
    for key, p in requests.items():
        assert_matches(media[key], expected(pipe, p))


@pytest.mark.parametrize("family, path, words", [
    ("wan-t2v", "models/tiny-wan22", 'two-expert Wan2.2 A14B .* set \\[model\\] family = "wan22-t2v"'),
    ("wan22-t2v", "models/tiny-wan-t2v", 'is a Wan2.1 .* set \\[model\\] family = "wan-t2v"'),
    ("wan22-t2v", "models/tiny-wan22-ti2v", 'is a Wan2.2 TI2V-5B .* set \\[model\\] family = "wan22-ti2v"'),
])
def test_a_checkpoint_of_the_other_wan_family_fails_at_load(family, path, words):
    deployment = replace(DEP, model=replace(DEP.model, family=family, path=path))
    with pytest.raises(ValueError, match=words):
        adapter_for(family)(deployment, "text_encoder")


def test_each_expert_is_compiled_and_warmed_apart(tmp_path, stages):
    """[accel] compile: warming compiles one forward per expert; a high-noise and a low-noise
    row then run compiled, each equal to the eager forward of its own expert."""
    fast = adapter_for(DEP.model.family)(
        write_variant(ROOT / "configs" / "tiny-wan22.toml", tmp_path / "wan22.toml", {}, "test",
                      accel={"transformer": "compile", "compile_backend": "aot_eager", "warm_sizes": ["9x64x64"]}),
        "dit")
    assert [v.split(" (")[0] for v in fast.warm_up().variants] == ["9x64x64", "9x64x64 transformer_2"]
    p = video_params(seed=4, guidance=1.0)
    cond = encode(stages, p)
    for step in (0, 9):   # the high-noise expert's first step, the low-noise one's last
        got, want = (adapter.prepare("x", p, cond) for adapter in (fast, stages["dit"]))
        got.step_index = want.step_index = step
        torch.testing.assert_close(fast.denoise([got])[0], stages["dit"].denoise([want])[0], rtol=1e-4, atol=1e-4)
    assert fast.forward_calls == {"compiled": 2, "eager": 0}
