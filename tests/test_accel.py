"""[accel]: compiled forwards padded to row buckets, warmed at load (ditserve/accel.py).

CPU stands in for the GPU here: the tiny PixArt-Sigma is served with the transformer compiled
by torch.compile's `aot_eager` backend (the same dynamo trace, bucket padding, warm-up and eager
fallback as inductor) and the text encoder's `cuda_graphs` path, which on a CPU runs its static
buffers where a GPU replays the captured graph (CUDA graphs are GPU only, see perf/results for
the H200); the compiled text encoder and VAE decode are checked in process. Served images must still match plain diffusers, alone
and step-batched; progress and cancellation keep working; warm shapes run compiled and other
shapes eager (counted by ditserve_{compiled,eager}_forwards_total).
"""
from __future__ import annotations

import os

import pytest
import torch

from conftest import ROOT, TINY_PIXART, diffusers_image, rendered_server, serve
from ditserve.accel import TransformerRunner, pad_rows
from ditserve.client import DitClient, GenerationRequest
from ditserve.deployment import AccelSection, load_deployment, parse_accel_overrides, write_variant
from helpers import StreamCall, assert_matches, run_staggered, scrape, stage_calls, wait_for_metric
from test_step_batching import assert_each_streamed_and_matches

BASE = ROOT / "configs" / "tiny-pixart-sigma.toml"
# attention = "cudnn" too: on CPU cuDNN cannot take the call and torch falls through to its CPU
# kernels, so the images must still match; the GPU effect is in perf/results
ACCEL = {"transformer": "compile", "compile_backend": "aot_eager", "warm_sizes": ["64x64"],
         "text_encoder": "cuda_graphs", "attention": "cudnn"}


@pytest.fixture(scope="module")
def accel_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accel")
    deployment = tmp / "tiny-pixart-accel.toml"
    write_variant(BASE, deployment, {}, "tests/test_accel.py", accel=ACCEL)
    yield from serve(rendered_server(tmp_path_factory, deployment, TINY_PIXART, "accel-server"))


def _forwards(server) -> tuple[float, float]:
    metrics = scrape(server.metrics_url)
    return (metrics.get(("ditserve_compiled_forwards_total", "dit"), 0.0),
            metrics.get(("ditserve_eager_forwards_total", "dit"), 0.0))


def test_warm_up_ran_at_load(accel_server):
    metrics = scrape(accel_server.metrics_url)
    for model in ("dit", "text_encoder"):
        assert metrics[("ditserve_accel_warmup_seconds", model)] > 0, model
    log = accel_server.log_path.read_text()
    assert "dit: [accel] warmed 1 variant(s)" in log
    # text_encoder's max batch 8 x 2 rows: graphs for 16, 8, 4, 2 and 1 rows
    assert "text_encoder: [accel] warmed 5 variant(s)" in log and "16 texts, 8 texts, 4 texts, 2 texts, 1 texts" in log


@pytest.mark.parametrize("protocol", ["grpc", "grpc-stream"])
def test_warm_shape_runs_compiled_and_matches_diffusers(accel_server, diffusers_pixart, protocol):
    compiled, eager = _forwards(accel_server)
    graphed, eager_text = stage_calls(accel_server, "text_encoder")
    request = GenerationRequest("a photo of a red cat", seed=42, num_inference_steps=8, guidance_scale=4.5)
    with DitClient(accel_server.grpc_url, protocol) as client:
        result = client.generate(request)
    assert_matches(result.media, diffusers_image(diffusers_pixart, request.prompt, 42, 8, 4.5))
    assert _forwards(accel_server) == (compiled + 8, eager)
    assert stage_calls(accel_server, "text_encoder") == (graphed + 1, eager_text)   # the T5 from its graphs


def test_other_shape_runs_eager_and_matches(accel_server, diffusers_pixart):
    compiled, eager = _forwards(accel_server)
    request = GenerationRequest("a dog in the snow", height=96, width=64, num_inference_steps=5,
                                guidance_scale=1.0, seed=7)
    with DitClient(accel_server.grpc_url, "grpc") as client:
        result = client.generate(request)
    assert_matches(result.media, diffusers_image(diffusers_pixart, request.prompt, 7, 5, 1.0, 96, 64))
    assert _forwards(accel_server) == (compiled, eager + 5)


def test_step_batched_requests_are_padded_to_buckets_and_match(accel_server, diffusers_pixart):
    """3 requests at different timesteps share forwards of 2, 4 and 6 rows (buckets 2, 4, 8)."""
    requests = [GenerationRequest("a red cat", seed=11, num_inference_steps=30),
                GenerationRequest("a blue bird flying", seed=22, num_inference_steps=20, guidance_scale=7.0),
                GenerationRequest("a castle at night", seed=33, num_inference_steps=12, negative_prompt="dark")]
    results = run_staggered(accel_server.grpc_url, requests, wait_steps=2)
    assert_each_streamed_and_matches(requests, results, diffusers_pixart)


def test_cancel_mid_generation_with_accel(accel_server):
    call = StreamCall(accel_server.grpc_url, GenerationRequest("a slow one", seed=5, num_inference_steps=100)).start()
    call.wait_progress(3)
    call.cancel()
    assert wait_for_metric(accel_server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    with DitClient(accel_server.grpc_url, "grpc") as client:   # the server goes on
        assert client.generate(GenerationRequest("after", seed=1, num_inference_steps=2)).media.shape == (64, 64, 3)


def test_compiled_vae_decode_equals_eager(tmp_path):
    """In process, with dynamo's `eager` backend (aot_eager trips on the VAE's group norm on CPU)."""
    from ditserve.adapters import adapter_for
    deployment = write_variant(BASE, tmp_path / "vae.toml", {}, "test",
                               accel={"vae_decode": "compile", "compile_backend": "eager", "warm_sizes": ["64x64"]})
    eager = adapter_for(deployment.model.family)(load_deployment(BASE), "vae_decode")
    compiled = adapter_for(deployment.model.family)(deployment, "vae_decode")
    assert compiled.warm_up().variants == ["64x64 x 2", "64x64 x 1"]   # the dynamic batch, and 1
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(compiled.decode(latents)[0], eager.decode(latents)[0])
    assert compiled.stage_runner.calls == {"compiled": 1, "eager": 0}
    compiled.decode(torch.randn(1, 4, 4, 8))                    # not a warm size: eager
    assert compiled.stage_runner.calls == {"compiled": 1, "eager": 1}


def _text_encoders(tmp_path, accel: dict, base=BASE):
    """(the text encoder with `accel`, the eager one) of `base`'s family."""
    from ditserve.adapters import adapter_for
    deployment = write_variant(base, tmp_path / "text.toml", {}, "test", accel=accel)
    eager = write_variant(base, tmp_path / "eager.toml", {}, "test", accel={"text_encoder": "eager"})
    family = adapter_for(deployment.model.family)
    return family(deployment, "text_encoder"), family(eager, "text_encoder")


def test_graphed_text_encoder_equals_eager_and_runs_only_warmed_shapes(tmp_path):
    """text_encoder = "cuda_graphs": one graph per row bucket and token length, warmed at load;
    the embeddings equal the eager encoder's (on a CPU the graphs' buffers run, no capture)."""
    fast, eager = _text_encoders(tmp_path, {"text_encoder": "cuda_graphs"})
    assert fast.warm_up(text_rows=4).variants == ["4 texts", "2 texts", "1 texts"]
    runner = fast.stage_runner
    # every bucket at 32 and 128 tokens; at 300 up to 1024 tokens a batch (GRAPH_TOKENS)
    assert sorted(runner.graphs) == [(1, 32), (1, 128), (1, 300), (2, 32), (2, 128), (2, 300), (4, 32), (4, 128)]
    assert runner.calls == {"compiled": 0, "eager": 0}
    for texts in (["a red cat"], ["", "a blue bird over the sea"], ["one", "two", "three"],
                  ["a long prompt " * 12]):   # 1, 2, 3 (padded to 4) rows; 32 and 128 tokens
        got, want = fast.encode_prompts(texts), eager.encode_prompts(texts)
        assert torch.equal(got.mask, want.mask)
        torch.testing.assert_close(got.embeds, want.embeds, rtol=0, atol=1e-6)
    assert runner.calls == {"compiled": 4, "eager": 0}
    fast.encode_prompts(["five", "rows", "past", "the", "buckets"])   # more rows than warmed: eager
    fast.encode_prompts(["a very long prompt " * 40] * 3)              # 4 x 300 tokens: not captured
    assert runner.calls == {"compiled": 4, "eager": 2}


def test_graphed_umt5_encoder_of_wan_equals_eager(tmp_path):
    """Wan's UMT5 (512 tokens, called positionally with its mask) through the same graphs."""
    fast, eager = _text_encoders(tmp_path, {"text_encoder": "cuda_graphs"}, ROOT / "configs" / "tiny-wan-t2v.toml")
    assert fast.warm_up(text_rows=2).variants == ["2 texts", "1 texts"]
    assert sorted(fast.stage_runner.graphs) == [(1, 32), (1, 128), (1, 512), (2, 32), (2, 128), (2, 512)]
    for texts in (["a red cat walking"], ["", "a blue bird over the sea " * 8]):   # 32 and 128 tokens
        torch.testing.assert_close(fast.encode_prompts(texts).embeds, eager.encode_prompts(texts).embeds,
                                   rtol=0, atol=1e-6)
    assert fast.stage_runner.calls == {"compiled": 2, "eager": 0}


def test_compiled_text_encoder_equals_eager(tmp_path):
    fast, eager = _text_encoders(tmp_path, {"text_encoder": "compile", "compile_backend": "eager"})
    assert fast.warm_up().variants == ["2 texts", "1 texts"]
    texts = ["", "a blue bird over the sea"]
    torch.testing.assert_close(fast.encode_prompts(texts).embeds, eager.encode_prompts(texts).embeds,
                               rtol=0, atol=1e-6)
    assert fast.stage_runner.calls["compiled"] == 1


def test_graphed_text_encoder_needs_a_t5_family_encoder(tmp_path):
    from conftest import FLUX_DEPLOYMENT
    from ditserve.adapters import adapter_for
    deployment = write_variant(FLUX_DEPLOYMENT, tmp_path / "flux.toml", {}, "test", accel={"text_encoder": "cuda_graphs"})
    with pytest.raises(ValueError, match=r'text_encoder = "cuda_graphs" replays a T5 or UMT5 encoder; family '
                                         r"'flux' encodes with CLIPTextModel: use \"compile\" or \"eager\""):
        adapter_for(deployment.model.family)(deployment, "text_encoder")


def _cfg_states(adapter, guidances=(4.5, 4.5, 7.0), **clip):
    """CFG requests at 64x64 (`num_frames` for a video) with their own embeddings, one per guidance
    (3 requests: 6 rows, bucket 8)."""
    from ditserve.schema import GenerationParams
    generator, out = torch.Generator(), []
    for i, guidance in enumerate(guidances):
        params = GenerationParams(f"prompt {i}", "", 64, 64, 5, guidance, i, **clip)
        cond = adapter.example_conditioning(params)
        cond.embeds = torch.randn(2, *cond.embeds.shape[1:], generator=generator.manual_seed(i))
        cond.mask = torch.ones(2, cond.mask.shape[1], dtype=torch.int64)
        out.append(adapter.prepare(str(i), params, cond))
    return out


@pytest.mark.parametrize("transformer", ["compile", "eager_graphs"])
@pytest.mark.parametrize("config", ["tiny-wan-t2v.toml", "tiny-wan-i2v.toml"])
def test_video_families_warm_up_and_match_eager_in_process(tmp_path, config, transformer):
    """Wan T2V and I2V (image conditioning as extra graph inputs): 3 CFG requests at different
    guidance share one compiled (or, with eager_graphs on a CPU, padded eager) forward (6 rows,
    bucket 8) and equal the eager forward."""
    from ditserve.adapters import adapter_for
    base = ROOT / "configs" / config
    accelerated = write_variant(base, tmp_path / config, {}, "test",
                                accel={"transformer": transformer, "compile_backend": "aot_eager", "warm_sizes": ["9x64x64"]})
    family = adapter_for(accelerated.model.family)
    fast, eager = family(accelerated, "dit"), family(load_deployment(base), "dit")
    assert fast.warm_up().variants[0].startswith("9x64x64 (8 rows")
    requests = {"guidances": (5.0, 5.0, 3.0), "num_frames": 9}
    for got, want in zip(fast.denoise(_cfg_states(fast, **requests)), eager.denoise(_cfg_states(eager, **requests))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert fast.run_forward.calls == {"compiled": 1, "eager": 0}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])   # graphs: GPU only
def test_eager_graphs_pad_to_warm_buckets_without_compiling_and_equal_eager(tmp_path, device):
    """`transformer = "eager_graphs"`: diffusers' eager forward captured per row bucket (GPU) with no
    torch.compile; on a CPU the same buckets run eager. Either way the rows equal the eager forward."""
    from ditserve.adapters import adapter_for
    accelerated = write_variant(BASE, tmp_path / "eager-graphs.toml", {}, "test",
                                accel={"transformer": "eager_graphs", "warm_sizes": ["64x64"]})
    family = adapter_for(accelerated.model.family)
    fast, eager = family(accelerated, "dit", device), family(load_deployment(BASE), "dit", device)
    runner = fast.run_forward
    assert runner.compiled.compiled is runner.eager          # nothing compiled
    assert fast.warm_up().variants[0].startswith("64x64 (8 rows")
    assert (runner.graphs is not None) == (device == "cuda") and (not runner.graphs or len(runner.graphs) == 3)
    for got, want in zip(fast.denoise(_cfg_states(fast)), eager.denoise(_cfg_states(eager))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert runner.calls == {"compiled": 1, "eager": 0}


def test_eager_graphs_static_buffers_serve_every_step_as_eager_would(tmp_path, monkeypatch):
    """The GPU path of `eager_graphs` on a CPU, short of the capture itself: each warm bucket gets a
    BucketGraph over static buffers (run on the buffers instead of replayed), and requests of 1-3
    at different steps read their rows back equal to the eager forward's, step after step."""
    from ditserve import accel as accel_module
    from ditserve.adapters import adapter_for
    replays = []

    class Uncaptured(accel_module.BucketGraph):
        def __init__(self, run, inputs, pool):
            super().__init__(run, inputs, pool, capture=False)

        def __call__(self, inputs):
            replays.append(self.static[0].shape[0])
            return super().__call__(inputs)
    monkeypatch.setattr(accel_module, "BucketGraph", Uncaptured)
    accelerated = write_variant(BASE, tmp_path / "eager-graphs.toml", {}, "test",
                                accel={"transformer": "eager_graphs", "warm_sizes": ["64x64"]})
    family = adapter_for(accelerated.model.family)
    fast, eager = family(accelerated, "dit"), family(load_deployment(BASE), "dit")
    runner = fast.run_forward
    runner.graphs = {}   # as on a GPU
    fast.warm_up()
    assert sorted(bucket for _, bucket in runner.graphs) == [2, 4, 8]
    fast_states, eager_states = _cfg_states(fast), _cfg_states(eager)
    for count in (1, 3, 2):   # 2, 6 and 4 rows: buckets 2, 8 and 4, the buffers reused between steps
        got = fast.denoise(fast_states[:count])
        want = eager.denoise(eager_states[:count])
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert replays[-3:] == [2, 8, 4] and runner.calls["eager"] == 0


@pytest.fixture(scope="module")
def eager_graphs_server(tmp_path_factory):
    deployment = tmp_path_factory.mktemp("eager-graphs") / "tiny-pixart-eager-graphs.toml"
    write_variant(BASE, deployment, {}, "tests/test_accel.py", accel={"transformer": "eager_graphs", "warm_sizes": ["64x64"]})
    yield from serve(rendered_server(tmp_path_factory, deployment, TINY_PIXART, "eager-graphs-server"))


def test_eager_graphs_served_through_the_buckets_match_diffusers(eager_graphs_server, diffusers_pixart):
    """Served with `eager_graphs` (on a CPU its buckets run eager): the warm shape goes through the
    buckets, never the eager fallback, and the image equals plain diffusers'."""
    request = GenerationRequest("a photo of a red cat", seed=42, num_inference_steps=8, guidance_scale=4.5)
    with DitClient(eager_graphs_server.grpc_url, "grpc-stream") as client:
        result = client.generate(request)
    assert_matches(result.media, diffusers_image(diffusers_pixart, request.prompt, 42, 8, 4.5))
    assert _forwards(eager_graphs_server) == (8.0, 0.0)
    assert "dit: [accel] warmed 1 variant(s)" in eager_graphs_server.log_path.read_text()


# ---- pure logic -----------------------------------------------------------------------------
def test_default_buckets_cover_a_full_cfg_batch():
    assert AccelSection().buckets(4) == (2, 4, 8)
    assert AccelSection().buckets(3) == (2, 4, 8)
    assert AccelSection().buckets(1) == (2,)
    assert AccelSection(row_buckets=(8, 2, 16)).buckets(8) == (2, 8, 16)


def test_padding_repeats_the_last_row():
    t = torch.arange(6.0).reshape(3, 2)
    padded = pad_rows(t, 5)
    assert padded.shape == (5, 2) and torch.equal(padded[3], t[2]) and torch.equal(padded[4], t[2])
    assert pad_rows(t, 3) is t


def test_runner_pads_to_the_bucket_and_returns_the_real_rows():
    seen = []

    def forward(latents, timesteps, cond):
        seen.append(latents.shape[0])
        return latents * 2

    from ditserve.state import TextConditioning
    accel = AccelSection(transformer="compile", compile_backend="eager", row_buckets=(2, 4))
    runner = TransformerRunner(forward, accel, capacity=2, device=torch.device("cpu"))
    cond = lambda n: TextConditioning(torch.zeros(n, 3, 5), torch.ones(n, 3, dtype=torch.int64))  # noqa: E731
    from ditserve.accel import WarmupReport
    report = WarmupReport()
    with runner.warming(report, "4x4"):
        runner(torch.ones(1, 4, 2, 2), torch.zeros(1), cond(1))
    assert sorted(seen) == [2, 4]                                   # every bucket, compiled at warm-up
    assert report.variants[0].startswith("4x4 (4 rows ") and ", 2 rows " in report.variants[0]
    seen.clear()
    out = runner(torch.ones(3, 4, 2, 2), torch.zeros(3), cond(3))
    assert seen == [4] and out.shape == (3, 4, 2, 2) and torch.equal(out, torch.full_like(out, 2))
    runner(torch.ones(3, 4, 4, 4), torch.zeros(3), cond(3))        # a shape not warmed: eager, unpadded
    assert seen[-1] == 3 and runner.calls == {"compiled": 1, "eager": 1}


def test_a_forward_that_cannot_be_captured_fails_the_load_naming_the_mode_and_the_way_out(monkeypatch):
    from ditserve import accel as accel_module
    from ditserve.state import TextConditioning

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(accel_module, "BucketGraph", refuse)
    runner = TransformerRunner(lambda latents, timesteps, cond: latents, AccelSection(transformer="eager_graphs"),
                               capacity=1, device=torch.device("cpu"))
    runner.graphs = {}   # as on a GPU
    with pytest.raises(RuntimeError) as err, runner.warming(accel_module.WarmupReport(), "4x4"):
        runner(torch.ones(1, 4, 2, 2), torch.zeros(1), TextConditioning(torch.zeros(1, 3, 5), torch.ones(1, 3)))
    assert ('[accel] transformer = "eager_graphs": capturing the forward of 2 rows in a CUDA graph failed '
            "(RuntimeError: operation not permitted when stream is capturing)") in str(err.value)
    assert 'transformer = "compile" or "eager"' in str(err.value)


def test_cudnn_attention_goes_first_in_the_sdpa_priority_and_compiles_apart(monkeypatch, tmp_path):
    from torch.nn.attention import SDPBackend
    from ditserve import accel as accel_module
    before = torch._C._get_sdp_priority_order()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    section = AccelSection(attention="cudnn", compile_cache=str(tmp_path / "cache"))
    try:
        accel_module.prefer_attention(section)
        assert torch._C._get_sdp_priority_order()[0] == int(SDPBackend.CUDNN_ATTENTION)
        accel_module.configure_compiler(section)   # its own inductor cache: the AOT key omits the choice
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "attention-cudnn")
    finally:
        accel_module._HELD.close()
    assert torch._C._get_sdp_priority_order() == before


@pytest.mark.parametrize("accel, message", [
    ({"transformer": "fast"}, "[accel] transformer='fast'; allowed: eager, compile, cuda_graphs, eager_graphs"),
    ({"vae_decode": "graphs"}, "[accel] vae_decode='graphs'; allowed: eager, compile"),
    ({"text_encoder": 1}, "[accel] text_encoder=1; allowed: eager, compile, cuda_graphs"),
    ({"fp8": "yes"}, "[accel] fp8='yes'; allowed: true, false"),
    ({"scheduler_step": "vectorised"}, "[accel] scheduler_step='vectorised'; allowed: batched, per_request"),
    ({"attention": "flash3"}, "[accel] attention='flash3'; allowed: default, cudnn"),
    ({"row_buckets": [1, 2]}, "must reach 8 rows"),
    ({"row_buckets": [0, 8]}, "allowed: a list of integers >= 1"),
    ({"warm_sizes": ["64"]}, "warm_sizes entry '64' is not HxW"),
    ({"turbo": True}, "[accel] has unknown keys ['turbo']"),
])
def test_bad_accel_values_fail_at_load_naming_key_and_allowed_values(tmp_path, accel, message):
    with pytest.raises(ValueError) as err:
        write_variant(BASE, tmp_path / "bad.toml", {}, "test", accel=accel)
    assert message in str(err.value)


def test_command_line_accel_overrides_become_a_checked_section(tmp_path):
    """The perf tools' `--accel KEY=VALUE ...`: lists and booleans typed, the rest checked by the load."""
    accel = parse_accel_overrides(["transformer=compile", "row_buckets=2,8", "warm_sizes=64x64,96x64", "fp8=false"])
    assert accel == {"transformer": "compile", "row_buckets": [2, 8], "warm_sizes": ["64x64", "96x64"], "fp8": False}
    section = write_variant(BASE, tmp_path / "ok.toml", {}, "test", accel=accel).accel
    assert (section.transformer, section.row_buckets, section.warm_sizes) == ("compile", (2, 8), ("64x64", "96x64"))
    with pytest.raises(ValueError, match="allowed: eager, compile"):
        write_variant(BASE, tmp_path / "bad.toml", {}, "test", accel=parse_accel_overrides(["text_encoder=graphs"]))


def test_warm_size_outside_the_limits_fails_at_load(tmp_path):
    from ditserve.adapters import adapter_for
    deployment = write_variant(BASE, tmp_path / "big.toml", {}, "test",
                               accel={"transformer": "compile", "compile_backend": "eager", "warm_sizes": ["512x512"]})
    adapter = adapter_for(deployment.model.family)(deployment, "dit")
    with pytest.raises(ValueError, match=r"\[accel\] warm_sizes: .*height"):
        adapter.warm_up()

