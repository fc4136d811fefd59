"""Quality tiers (input `quality`): a First-Block Cache per request inside step batches (ditserve/cache.py).

Unit tests pin the decision and the row scatter; the served tests use the trained tiny
PixArt-Sigma (configs/tiny-pixart-shapes.toml, [cache] tiers balanced and fast), on the
session's shapes_server (conftest.py): a `fast` request reuses steps and says how many (output
`cache_hits`, metric `ditserve_cache_hits_total`), a `lossless` request step-batched beside
`fast` ones equals its solo result and diffusers, and a tier the deployment does not enable
is rejected naming `quality` and the allowed values.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from tritonclient.utils import InferenceServerException

from conftest import ROOT, TINY_SHAPES, diffusers_image, rendered_server, serve
from ditserve.cache import RowCache, apply_first_block_cache, relative_change
from ditserve.client import DitClient, GenerationRequest
from ditserve.deployment import load_deployment, write_variant
from ditserve.schema import InvalidRequest, decode_request
from helpers import (StreamCall, assert_matches, cancel_mid_denoise, histogram_above, run_staggered, scrape,
                     wait_for_metric)

SHAPES = ROOT / "configs" / "tiny-pixart-shapes.toml"
PROMPT, STEPS = "a red circle on a blue background", 12


# ---- the decision and the scatter, no server ---------------------------------------------
def _rest(calls: list):
    """run_rest that adds 10 and records which rows it was given."""
    def run(index, hidden):
        calls.append(None if index is None else index.tolist())
        return hidden + 10
    return run


def test_first_step_computes_and_later_small_changes_reuse():
    cache, calls = RowCache(threshold=0.1), []
    first_in, first_out = torch.zeros(2, 3), torch.ones(2, 3)
    out = apply_first_block_cache(first_in, first_out, [cache], _rest(calls))
    assert calls == [None] and cache.hits == 0 and torch.equal(out, first_out + 10)
    assert torch.equal(cache.rest_residual, torch.full((2, 3), 10.0))
    # Residual 1.05 vs 1.0: a 5 % change, under 0.1: reuse (first-block output + cached residual).
    out = apply_first_block_cache(first_in, first_out * 1.05, [cache], _rest(calls))
    assert calls == [None] and cache.hits == 1 and torch.allclose(out, first_out * 1.05 + 10)
    # The reference stays the last computed step's residual (as diffusers): 1.2 vs 1.0 computes.
    apply_first_block_cache(first_in, first_out * 1.2, [cache], _rest(calls))
    assert calls == [None, None] and cache.hits == 1


def test_only_rows_that_compute_run_the_rest_and_lossless_always_does():
    fast, lossless, calls = RowCache(threshold=0.5), None, []
    first_in = torch.zeros(4, 3)                      # 2 requests x 2 CFG rows
    apply_first_block_cache(first_in, torch.ones(4, 3), [fast, lossless], _rest(calls))
    out = apply_first_block_cache(first_in, torch.ones(4, 3) * 1.1, [fast, lossless], _rest(calls))
    assert calls == [None, [2, 3]], "the reusing request's rows leave the batch for the other blocks"
    assert fast.hits == 1 and torch.allclose(out, torch.full((4, 3), 11.1))


def test_relative_change_is_the_mean_absolute_change_over_the_mean_magnitude():
    assert float(relative_change(torch.tensor([1.1, -2.2]), torch.tensor([1.0, -2.0]))) == pytest.approx(0.1)


def test_bad_tier_is_rejected_before_any_model_work_naming_the_allowed_values():
    deployment = load_deployment(SHAPES)
    inputs = {"prompt": np.array([b"x"], dtype=np.object_), "quality": np.array([b"turbo"], dtype=np.object_)}
    with pytest.raises(InvalidRequest, match=r"input 'quality'='turbo'.*\['lossless', 'balanced', 'fast'\]"):
        decode_request(inputs, deployment)


def test_cache_section_is_checked_at_load(tmp_path):
    with pytest.raises(ValueError, match=r"\[cache\] enabled=\['turbo'\] names tiers \['turbo'\]"):
        write_variant(SHAPES, tmp_path / "bad.toml", {}, "test", cache={"enabled": ["turbo"]})
    only_fast = write_variant(SHAPES, tmp_path / "fast.toml", {}, "test", cache={"enabled": ["fast"]})
    assert only_fast.cache.allowed == ("lossless", "fast")


def test_a_family_without_a_cached_forward_refuses_cache_tiers_at_load(tmp_path):
    from ditserve.adapters import adapter_for

    flux = write_variant(ROOT / "configs" / "tiny-flux.toml", tmp_path / "flux.toml", {}, "test",
                         cache={"tiers": {"fast": 0.1}})
    with pytest.raises(ValueError, match=r"family 'flux' has no cached forward yet"):
        adapter_for(flux.model.family)(flux, "dit")


def _three_cfg_requests(config: str, back: int = 0, front: int = 1) -> tuple:
    """dit's adapter for a family with a cached forward (`front` first and `back` last blocks run
    for every row), and three CFG requests at different timesteps."""
    from ditserve.adapters import adapter_for
    from ditserve.schema import GenerationParams

    deployment = load_deployment(ROOT / "configs" / config)
    deployment = replace(deployment, cache=replace(deployment.cache, back_blocks=back, front_blocks=front))
    adapter = adapter_for(deployment.model.family)(deployment, "dit")
    blocks = getattr(adapter.pipe.transformer, adapter.cache_blocks)
    if len(blocks) < 2:   # the tiny Wan has one block: give it a second, so that there is a rest to skip
        blocks.append(copy.deepcopy(blocks[0]))
    frames = {"num_frames": 9} if deployment.is_video else {}
    states = []
    for i, steps in enumerate((12, 8, 5)):
        params = GenerationParams(f"prompt {i}", "", 64, 64, steps, 4.5, i, **frames)
        cond = adapter.example_conditioning(params)
        cond.embeds = torch.randn(2, *cond.embeds.shape[1:], generator=torch.Generator().manual_seed(i))
        cond.mask = torch.ones(2, cond.mask.shape[1], dtype=torch.int64)
        cond.mask[:, 12:] = 0
        states.append(adapter.prepare(str(i), params, cond))
    return adapter, states


@pytest.mark.parametrize("config, compile_backend, back, front", [
    ("tiny-pixart-shapes.toml", None, 0, 1), ("tiny-wan-t2v.toml", None, 0, 1), ("tiny-wan-i2v.toml", None, 0, 1),
    ("tiny-pixart-shapes.toml", "aot_eager", 0, 1), ("tiny-pixart-shapes.toml", None, 2, 1),
    ("tiny-pixart-shapes.toml", None, 1, 2)])
def test_segmented_cached_forward_equals_the_eager_one(config, compile_backend, back, front):
    """cache_graphs.CachedGraphs (the cached forward cut into head / rest / tail for CUDA graphs),
    captured where a GPU is present, else run on its static buffers: over steps where the requests
    compute, reuse or mix, its outputs and cache hits equal the eager cached forward's; also with
    its blocks compiled (as a `cuda_graphs` deployment captures them), and with front and back blocks."""
    from torch._dynamo.utils import counters

    from ditserve.accel import signature
    from ditserve.cache_graphs import CachedGraphs

    adapter, states = _three_cfg_requests(config, back, front)
    capture = adapter.device.type == "cuda"
    graphs = CachedGraphs(adapter.forward, adapter.pipe.transformer, adapter.cache_blocks, [1, 2, 4, 8],
                          pool=torch.cuda.graph_pool_handle() if capture else None, capture=capture,
                          compile_backend=compile_backend, front=front, back=back)
    inputs = adapter.batch_inputs(states)
    sig = signature(inputs, {})
    compiled_before = counters["stats"]["unique_graphs"]
    graphs.capture_all(sig, *inputs)
    assert (counters["stats"]["unique_graphs"] > compiled_before) == (compile_backend is not None)
    assert graphs.fits(sig, 6) and not graphs.fits(sig, 9)
    eager_caches = [RowCache(threshold=0.2), None, RowCache(threshold=1e9)]
    segment_caches = copy.deepcopy(eager_caches)
    for scale in (1.0, 1.02, 1.6, 1.001):   # the latents move: all compute; 0 and 2 reuse; 0 computes; both reuse
        for state in states:
            state.latents = state.latents * scale
        inputs = adapter.batch_inputs(states)
        eager = adapter.cached_forward(*inputs, eager_caches)
        segmented = graphs(sig, *inputs, segment_caches)
        assert torch.allclose(segmented, eager, rtol=1e-4, atol=1e-5), (scale, (segmented - eager).abs().max())
        assert [c.hits for c in segment_caches if c] == [c.hits for c in eager_caches if c]
    assert segment_caches[0].hits >= 1 and segment_caches[2].hits == 3   # steps that mixed rest and tail rows


@pytest.mark.parametrize("config, back, front", [("tiny-pixart-shapes.toml", 0, 1), ("tiny-wan-t2v.toml", 0, 1),
                                                 ("tiny-wan-i2v.toml", 0, 1), ("tiny-pixart-shapes.toml", 2, 1),
                                                 ("tiny-pixart-shapes.toml", 1, 2)])
def test_lossless_rows_of_the_cached_path_equal_the_plain_forward_bit_for_bit(config, back, front):
    """The in-process half of the parity claim, per family with a cached forward: beside
    requests that reuse (and so leave the batch for the later blocks), a lossless request's
    output equals that of the plain forward of the same batch exactly; with no reuse at all the
    cached path is the plain forward. Also with front and back blocks."""
    adapter, states = _three_cfg_requests(config, back, front)
    plain = adapter.denoise(states)
    caches = [RowCache(threshold=1e9), None, RowCache(threshold=1e9)]   # always reuse once cached
    for state, cache in zip(states, caches):
        state.cache = cache
    first = adapter.denoise(states)                                     # nothing cached yet: all compute
    assert all(torch.equal(a, b) for a, b in zip(first, plain))
    for state in states:                                                # the next step's inputs
        state.latents = state.latents * 1.05
    mixed = adapter.denoise(states)                                     # requests 0 and 2 reuse
    assert [c.hits for c in caches if c] == [1, 1]
    for state in states:
        state.cache = None
    plain = adapter.denoise(states)
    assert torch.equal(mixed[1], plain[1])
    assert not torch.equal(mixed[0], plain[0]), "a reusing request's output comes from its cache"


def test_front_and_back_blocks_run_every_row_and_the_reused_rows_skip_only_the_middle():
    """[cache] back_blocks = 2 (DBCache's Bn), front_blocks = 2 (Fn): while two of three requests
    reuse, the front and back blocks see all 6 CFG rows, the blocks between them only the
    computing request's 2; a reused output then differs from the same step with no back blocks
    (they correct it)."""
    outputs = {}
    for front, back in ((1, 0), (1, 2), (2, 1)):
        adapter, states = _three_cfg_requests("tiny-pixart-shapes.toml", back, front)
        blocks = list(getattr(adapter.pipe.transformer, adapter.cache_blocks))
        rows: dict[int, list[int]] = {i: [] for i in range(len(blocks))}
        for i, block in enumerate(blocks):
            block.register_forward_hook(lambda module, args, out, i=i: rows[i].append(out.shape[0]))
        for state in states:
            state.cache = RowCache(threshold=1e9)
        adapter.denoise(states)                       # all compute
        states[1].cache = None                        # request 1 lossless: it computes
        for state in states:
            state.latents = state.latents * 1.05
        for seen in rows.values():
            seen.clear()
        outputs[front, back] = adapter.denoise(states)   # requests 0 and 2 reuse
        skipped = [i for i, seen in rows.items() if seen == [2]]
        assert all(rows[i] == [6] for i in range(front)) and skipped == list(range(front, len(blocks) - back))
        assert all(rows[i] == [6] for i in range(len(blocks) - back, len(blocks)))
    assert torch.equal(outputs[1, 0][1], outputs[1, 2][1]), "the lossless request runs every block either way"
    assert torch.equal(outputs[1, 0][1], outputs[2, 1][1])
    assert not torch.equal(outputs[1, 0][0], outputs[1, 2][0])


def test_front_and_back_blocks_beyond_the_model_are_refused_at_load(tmp_path):
    with pytest.raises(ValueError, match=r"\[cache\] back_blocks=-1; allowed: an integer >= 0"):
        write_variant(SHAPES, tmp_path / "neg.toml", {}, "test", cache={"back_blocks": -1})
    with pytest.raises(ValueError, match=r"\[cache\] front_blocks=0; allowed: an integer >= 1"):
        write_variant(SHAPES, tmp_path / "zero.toml", {}, "test", cache={"front_blocks": 0})
    _three_cfg_requests("tiny-pixart-shapes.toml", 6)      # 8 blocks: the first and one more stay cached
    _three_cfg_requests("tiny-pixart-shapes.toml", 3, 4)
    with pytest.raises(ValueError, match=r"front_blocks=1, back_blocks=7; this transformer has 8 blocks: allowed "
                                         r"front_blocks \+ back_blocks up to 7"):
        _three_cfg_requests("tiny-pixart-shapes.toml", 7)
    with pytest.raises(ValueError, match=r"front_blocks=6, back_blocks=2; this transformer has 8 blocks"):
        _three_cfg_requests("tiny-pixart-shapes.toml", 2, 6)


# ---- served ------------------------------------------------------------------------------
def test_bad_tier_is_rejected_by_the_server(shapes_server):
    with DitClient(shapes_server.grpc_url, "grpc") as client:
        with pytest.raises(InferenceServerException, match=r"input 'quality'.*allowed: \['lossless', 'balanced', "
                                                           r"'fast'\]"):
            client.generate(GenerationRequest(PROMPT, seed=1, quality="turbo"))
        assert client.generate(GenerationRequest(PROMPT, seed=1, num_inference_steps=2)).cache_hits == 0


FAST = GenerationRequest(PROMPT, seed=3, num_inference_steps=STEPS, quality="fast")


@pytest.fixture(scope="module")
def fast_solo(shapes_server):
    """A `fast` request served alone, and what ditserve_cache_hits_total and
    ditserve_eager_forwards_total moved by meanwhile."""
    metrics = scrape(shapes_server.metrics_url)
    before = {name: metrics.get((name, "dit"), 0.0) for name in ("ditserve_cache_hits_total",
                                                                  "ditserve_eager_forwards_total")}
    with DitClient(shapes_server.grpc_url, "grpc") as client:
        result = client.generate(FAST)
    hits = wait_for_metric(shapes_server.metrics_url, "ditserve_cache_hits_total", "dit",
                           before["ditserve_cache_hits_total"] + result.cache_hits)
    forwards = wait_for_metric(shapes_server.metrics_url, "ditserve_eager_forwards_total", "dit",
                               before["ditserve_eager_forwards_total"] + STEPS)
    return result, {"hits": hits - before["ditserve_cache_hits_total"],
                    "forwards": forwards - before["ditserve_eager_forwards_total"]}


def test_fast_request_reuses_steps_and_counts_them(fast_solo):
    """Its hits are returned and counted; every one of its steps is one forward on the eager
    cached path (the first block runs even when the others are reused), counted as such."""
    result, counted = fast_solo
    assert 0 < result.cache_hits < STEPS
    assert counted == {"hits": result.cache_hits, "forwards": STEPS}


def test_cancelled_fast_request_leaves_no_cache_behind(shapes_server, fast_solo):
    """Cancelled mid-denoise (state freed, no decode), then the same request gets exactly its
    solo result and hits again: nothing of the cancelled request's cache is reused."""
    cancel_mid_denoise(shapes_server, FAST, "txt2img", after_steps=STEPS // 2)
    with DitClient(shapes_server.grpc_url, "grpc") as client:
        again = client.generate(FAST)
    assert again.cache_hits == fast_solo[0].cache_hits
    assert np.array_equal(again.media, fast_solo[0].media)


def test_lossless_beside_fast_in_step_batches_equals_its_solo_result(shapes_server, diffusers_shapes):  # noqa: F811
    lossless = GenerationRequest(PROMPT, seed=5, num_inference_steps=STEPS)
    with DitClient(shapes_server.grpc_url, "grpc") as client:
        solo = client.generate(lossless).media
    assert_matches(solo, diffusers_image(diffusers_shapes, PROMPT, 5, STEPS, 4.5))
    # fast / lossless / fast / lossless, each joining the earlier ones mid-denoise. The first runs
    # 300 steps so that the others always join it: a fast host can finish 12 tiny steps before
    # the next request is admitted (as in tests/test_wan22.py).
    requests = [GenerationRequest(PROMPT, seed=6, num_inference_steps=300, quality="fast"), lossless,
                GenerationRequest("a green square on a white background", seed=7, num_inference_steps=STEPS - 4,
                                  quality="fast"),
                GenerationRequest(PROMPT, seed=5, num_inference_steps=STEPS)]
    shared = histogram_above(shapes_server.metrics_url, "ditserve_step_batch_size", "dit", "1")
    hits = scrape(shapes_server.metrics_url).get(("ditserve_cache_hits_total", "dit"), 0.0)
    results = run_staggered(shapes_server.grpc_url, requests, wait_steps=2)
    assert histogram_above(shapes_server.metrics_url, "ditserve_step_batch_size", "dit", "1") > shared
    assert scrape(shapes_server.metrics_url).get(("ditserve_cache_hits_total", "dit"), 0.0) > hits
    for _, media in (results[1], results[3]):   # as exact as plain step batching (see the in-process test)
        assert_matches(media, solo)


# ---- the other engine modes ----------------------------------------------------------------
@pytest.fixture(scope="module", params=["serial", "request_batch"])
def shapes_mode_server(request, tmp_path_factory):
    """The trained tiny model with its tiers in another engine mode (serial: capacity 1;
    request_batch: capacity 4, whole requests batched by Triton's dynamic batcher)."""
    mode = request.param
    deployment = tmp_path_factory.mktemp(f"shapes-{mode}") / f"shapes-{mode}.toml"
    write_variant(SHAPES, deployment, {"mode": mode, "capacity": 1 if mode == "serial" else 4}, "tests/test_cache.py")
    for server in serve(rendered_server(tmp_path_factory, deployment, TINY_SHAPES, f"shapes-{mode}")):
        yield mode, server


def test_tiers_work_the_same_in_serial_and_request_batch_modes(shapes_mode_server, fast_solo, diffusers_shapes):
    """A `fast` request alone reuses the same steps and gives the same image as in step mode;
    `lossless` sent together with `fast` ones (batched in request_batch mode) still equals
    diffusers, and the `fast` ones still reuse."""
    mode, server = shapes_mode_server
    with DitClient(server.grpc_url, "grpc") as client:
        alone = client.generate(FAST)
    assert alone.cache_hits == fast_solo[0].cache_hits > 0, mode
    assert_matches(alone.media, fast_solo[0].media)
    lossless = GenerationRequest(PROMPT, seed=5, num_inference_steps=STEPS)
    hits = scrape(server.metrics_url).get(("ditserve_cache_hits_total", "dit"), 0.0)
    shared = histogram_above(server.metrics_url, "ditserve_step_batch_size", "dit", "1")
    calls = [StreamCall(server.grpc_url, r).start() for r in (FAST, lossless, FAST)]
    finished = [call.finish() for call in calls]
    batched = histogram_above(server.metrics_url, "ditserve_step_batch_size", "dit", "1") - shared
    # serial never batches; request_batch batched at least the two that queued behind the first
    assert (batched == 0) if mode == "serial" else (batched > 0), (mode, batched)
    assert_matches(finished[1][1], diffusers_image(diffusers_shapes, PROMPT, 5, STEPS, 4.5))
    for progress, _ in (finished[0], finished[2]):
        assert progress == [(i, STEPS) for i in range(1, STEPS + 1)]
    # batched, a fast row's decision may flip where its change sits at the threshold: reuse, not
    # the exact count, is what holds
    assert wait_for_metric(server.metrics_url, "ditserve_cache_hits_total", "dit",
                           hits + 2 * fast_solo[0].cache_hits) > hits
