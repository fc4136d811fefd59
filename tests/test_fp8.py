"""`[accel] fp8 = true`: the linear layers of the transformer's blocks in FP8 (ditserve/fp8.py).

FP8 changes the numbers, so the oracle is two-fold: a request served alone == plain diffusers
with the same `apply_fp8` applied in process (within 1 uint8 level), and served vs plain
diffusers without FP8 at a PSNR floor with the asked colours on the trained tiny model (measured 19.5-38.5 dB over four
requests: the tiny transformer is narrow and its trajectories sensitive, so FP8's roundings show
far more than in a full-size one; this is a correctness check, not a quality figure). CPU
runs torch's CPU `_scaled_mm` for correctness; speed is a GPU question (perf/results).
"""
from __future__ import annotations

import sys

import pytest
import torch

from conftest import ROOT, SHAPES_DEPLOYMENT, TINY_SHAPES, diffusers_image, rendered_server, serve
from ditserve.client import DitClient, GenerationRequest
from ditserve.deployment import write_variant
from ditserve.fp8 import Float8Linear, apply_fp8, eligible
from helpers import assert_matches, run_staggered

sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "perf")]
import shapes_dataset as shapes  # noqa: E402
from accel_bench import psnr  # noqa: E402  (the benchmarks' PSNR of uint8 images)

STEPS, GUIDANCE = 20, 4.5      # configs/tiny-pixart-shapes.toml [defaults]
# "The same picture": measured 19.5-38.5 dB against full precision on the shipped weights
# (run 3), while unrelated pictures of this model score ~8-10 dB.
PSNR_FLOOR_DB = 15.0


@pytest.fixture(scope="module")
def fp8_server(tmp_path_factory):
    deployment = tmp_path_factory.mktemp("fp8") / "tiny-pixart-shapes-fp8.toml"
    write_variant(SHAPES_DEPLOYMENT, deployment, {}, "tests/test_fp8.py", accel={"fp8": True})
    yield from serve(rendered_server(tmp_path_factory, deployment, TINY_SHAPES, "fp8-server"))


@pytest.fixture(scope="module")
def diffusers_fp8():
    from diffusers import PixArtSigmaPipeline
    pipe = PixArtSigmaPipeline.from_pretrained(str(TINY_SHAPES))
    apply_fp8(pipe.transformer)
    return pipe


def test_served_fp8_equals_diffusers_with_fp8_and_stays_near_full_precision(fp8_server, diffusers_fp8,
                                                                            diffusers_shapes):
    prompt = "a red circle on a blue background"
    with DitClient(fp8_server.grpc_url, "grpc-stream") as client:
        result = client.generate(GenerationRequest(prompt, seed=1))
    assert result.steps_reported == STEPS
    assert_matches(result.media, diffusers_image(diffusers_fp8, prompt, 1, STEPS, GUIDANCE))
    full = diffusers_image(diffusers_shapes, prompt, 1, STEPS, GUIDANCE)
    assert PSNR_FLOOR_DB <= psnr(result.media, full) < float("inf")   # FP8 ran, and stayed close
    assert shapes.score([result.media], [("red", "circle", "blue")]).colours == 1.0


def test_step_batched_fp8_requests_still_draw_what_was_asked(fp8_server, diffusers_shapes):
    """Batched, FP8's roundings move with the batch (the matmul's accumulation order changes with
    its row count, and a last-bit change flips an e4m3 rounding), so the results are checked for
    what they show, not to the bit: every step streamed, the asked colours, close to full precision."""
    combos = [("yellow", "square", "black"), ("green", "triangle", "white"), ("purple", "circle", "orange")]
    requests = [GenerationRequest(shapes.caption(*combo), seed=3 + k, num_inference_steps=steps, guidance_scale=GUIDANCE)
                for k, (combo, steps) in enumerate(zip(combos, (40, 12, STEPS)))]
    results = run_staggered(fp8_server.grpc_url, requests, wait_steps=2)
    images = []
    for request, (progress, media) in zip(requests, results):
        assert len(progress) == request.num_inference_steps
        full = diffusers_image(diffusers_shapes, request.prompt, request.seed, request.num_inference_steps, GUIDANCE)
        print(f"{request.prompt}: PSNR vs full precision {psnr(media, full):.1f} dB")
        assert psnr(media, full) >= PSNR_FLOOR_DB
        images.append(media)
    assert shapes.score(images, combos).colours == 1.0


def test_float8_linear_is_close_to_the_linear_it_replaces():
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 256)
    x = torch.randn(3, 7, 128)
    exact, fp8 = linear(x), Float8Linear(linear)(x)
    assert fp8.shape == exact.shape and fp8.dtype == exact.dtype
    rel_rms = ((fp8 - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()
    assert 0 < rel_rms < 0.06        # e4m3 keeps 3 mantissa bits: a few per cent, never exact


def test_only_block_linears_with_matmul_friendly_shapes_are_replaced():
    assert eligible("transformer_blocks.0.attn1.to_q", torch.nn.Linear(32, 64))
    assert not eligible("proj_out", torch.nn.Linear(32, 64))                       # outside the blocks
    assert not eligible("transformer_blocks.0.ff.net.2", torch.nn.Linear(24, 64))   # 24 % 16 != 0
    model = torch.nn.Module()
    model.embed = torch.nn.Linear(16, 16)
    model.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU())])
    assert apply_fp8(model) == 1
    assert isinstance(model.blocks[0][0], Float8Linear) and isinstance(model.embed, torch.nn.Linear)
    empty = torch.nn.Module()
    empty.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8)])
    with pytest.raises(ValueError, match="fp8 = true: Module has no linear layer"):
        apply_fp8(empty)
