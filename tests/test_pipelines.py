"""One repository, three pipelines: tiny PixArt-Sigma (`pixart_*`), tiny FLUX.1 (`flux_*`) and the
tiny Wan2.2 TI2V-5B text-to-video (`ti2v_*`) rendered side by side and served by one real
tritonserver with explicit model control. The image pipelines load at start; `ti2v` is loaded
by its own test, through the repository API, and unloaded after it (its stubs cost the other
tests' start nothing).

The server test unloads and reloads the whole `pixart` pipeline through Triton's repository API
(ditserve.pipelines.RepositoryControl, i.e. tritonclient's unload_model / load_model) while two
clients keep streaming `flux` generations, and checks that every one of those finished and equals
what the same request gave alone before. FLUX.1 runs one row per request, so a request sharing a
forward with another may move a last float bit: 1 uint8 level (tests/test_flux.py).
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from diffusers import FluxPipeline, WanPipeline
from tritonclient.utils import InferenceServerException

from conftest import ROOT, TINY_FLUX, TINY_PIXART, diffusers_image, diffusers_video, serve, start_server
from ditserve.client import DitClient, GenerationRequest
from ditserve.deployment import load_deployment, write_variant
from ditserve.handoff import ConditioningStore, HostTensor
from ditserve.pipelines import PipelineNames, RepositoryControl, split_model_name
from ditserve.scratch import pipeline_dir
from mmdit_helpers import FLUX_DEPLOYMENT, diffusers_flux_image
from helpers import assert_matches, histogram_above
from test_loadgen import loadgen
from wan_helpers import oracle

RENDER = [sys.executable, str(ROOT / "scripts" / "render_repository.py")]
STAGES = ("text_encoder", "dit", "vae_decode", "cancel")   # cancel: the pipeline's own (stages/cancel.py)
PUBLIC = ("txt2img", "txt2img_stream")
VIDEO = ("txt2vid", "txt2vid_stream")
TI2V = ROOT / "configs" / "tiny-wan22-ti2v.toml"
# Every model of the rendered repository, by pipeline; the image pipelines load at start.
SERVED = {"pixart": STAGES + PUBLIC, "flux": STAGES + PUBLIC, "ti2v": STAGES + VIDEO}
AT_START = ("pixart", "flux")


def render(out, *deployments: str, check: bool = True) -> subprocess.CompletedProcess:
    args = [arg for d in deployments for arg in ("--deployment", d)]
    return subprocess.run([*RENDER, *args, "--out", str(out)], check=check, capture_output=True, text=True)


# ---- names and rendering (no server) ------------------------------------------------------

def test_pipeline_names_prefix_every_model_and_split_back():
    flux, plain = PipelineNames("flux"), PipelineNames()
    assert [flux.model(m) for m in STAGES] == ["flux_text_encoder", "flux_dit", "flux_vae_decode", "flux_cancel"]
    assert (flux.public("txt2vid"), flux.public("txt2vid", streaming=True)) == ("flux_txt2vid", "flux_txt2vid_stream")
    assert (plain.public("txt2img"), plain.model("dit")) == ("txt2img", "dit")   # single-deployment names
    assert split_model_name("flux_txt2img_stream") == ("flux", "txt2img_stream")
    assert split_model_name("text_encoder") == (None, "text_encoder")           # not pipeline "text"
    assert split_model_name("wan-22_vae_encode") == ("wan-22", "vae_encode")
    assert split_model_name("flux_unknown") == (None, None)
    for bad in ("Flux", "pix_art", "", "-x", "a" * 33):
        with pytest.raises(ValueError, match="pipeline name"):
            PipelineNames(bad)


def test_render_prefixes_each_deployment_and_names_it_in_every_model(tmp_path):
    out = tmp_path / "multi"
    render(out, "pixart=configs/tiny-pixart-sigma.toml", "wan=configs/tiny-wan-i2v.toml")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"pixart_{m}" for m in STAGES + PUBLIC] + [f"wan_{m}" for m in STAGES + ("vae_encode", "img2vid",
                                                                                  "img2vid_stream")])
    for model in out.iterdir():
        pipeline, _ = split_model_name(model.name)
        config = (model / "config.pbtxt").read_text()
        assert f'key: "pipeline" value: {{ string_value: "{pipeline}" }}' in config, model
        # The default deployment is named too: a named pipeline never depends on $DITSERVE_DEPLOYMENT.
        deployment = {"pixart": "configs/tiny-pixart-sigma.toml", "wan": "configs/tiny-wan-i2v.toml"}[pipeline]
        assert f'key: "deployment" value: {{ string_value: "{deployment}" }}' in config, model


@pytest.mark.parametrize("deployments, words", [
    (["configs/tiny-flux.toml", "configs/tiny-pixart-sigma.toml"], ["name each one", "NAME=PATH"]),
    (["a=configs/tiny-flux.toml", "configs/tiny-pixart-sigma.toml"], ["name each one"]),
    (["a=configs/tiny-flux.toml", "a=configs/tiny-pixart-sigma.toml"], ["'a' is given twice"]),
    (["pix_art=configs/tiny-pixart-sigma.toml"], ["pipeline name 'pix_art'", "no '_'"]),
])
def test_render_rejects_ambiguous_names_with_a_clear_error(tmp_path, deployments, words):
    done = render(tmp_path / "out", *deployments, check=False)
    assert done.returncode == 2 and all(word in done.stderr for word in words), done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, words", [
    (["--deployment", "configs/tiny-flux.toml", "--deployment", "configs/tiny-sd3.toml"], ["name each one"]),
    (["--deployment", "flux=configs/tiny-flux.toml", "--load-pipeline", "flux"], ["--model-control-mode explicit"]),
    (["--deployment", "flux=configs/tiny-flux.toml", "--model-control-mode", "explicit", "--load-pipeline", "sd3"],
     ["--load-pipeline sd3", "named: flux"]),
])
def test_serve_refuses_unclear_pipelines_before_starting(tmp_path, args, words):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py"), *args, "--render-dir",
                           str(tmp_path / "repo")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and all(word in done.stderr for word in words), done.stderr
    assert not (tmp_path / "repo").exists()


def test_unloading_one_pipeline_keeps_the_scratch_files_of_another(tmp_path):
    """dit removes its pipeline's scratch folder at unload; another pipeline's in-flight handoffs stay."""
    pixart, flux = (ConditioningStore(pipeline_dir(tmp_path, "handoff", name, server_pid=1))
                    for name in ("pixart", "flux"))
    flux.put("gen-1", {"embeds": HostTensor.from_numpy(np.zeros(1, np.float32))})
    pixart.remove_all()
    assert not pixart.root.exists() and list(flux.root.iterdir()) == [flux.root / "gen-1"]
    flux.remove_all()
    assert not (tmp_path / "ditserve_server-1").exists()   # the server's folder goes with the last pipeline


# ---- one server, two pipelines, explicit model control ------------------------------------

@pytest.fixture(scope="module")
def pipelines_server(tmp_path_factory):
    """Capacities 1 (pixart: 5 stubs) and 2 (flux and ti2v: 7 stubs each, two streams batch
    step-wise) instead of 4 keep the start and the reload short on CI."""
    for model in (TINY_PIXART, TINY_FLUX, ROOT / load_deployment(TI2V).model.path):
        if not model.exists():
            pytest.fail(f"{model} is missing: run `bash scripts/setup.sh` (it builds the tiny pipelines)")
    tmp = tmp_path_factory.mktemp("pipelines")
    for name, base, capacity in (("pixart", "tiny-pixart-sigma", 1), ("flux", "tiny-flux", 2),
                                 ("ti2v", "tiny-wan22-ti2v", 2)):
        write_variant(ROOT / "configs" / f"{base}.toml", tmp / f"{name}.toml", {"capacity": capacity},
                      "tests/test_pipelines.py")
    render(tmp / "repo", *(f"{name}={tmp / name}.toml" for name in SERVED))
    at_start = [f"--load-model={p}_{m}" for p in AT_START for m in SERVED[p]]
    yield from serve(start_server(tmp, "pipelines", model_repository=tmp / "repo",
                                  extra_args=["--model-control-mode=explicit", *at_start]))


def generate(url: str, pipeline: str, request: GenerationRequest, protocol: str = "grpc"):
    with DitClient(url, protocol, pipeline=pipeline) as client:
        return client.generate(request, timeout_s=120)


def test_both_pipelines_serve_their_own_deployment(pipelines_server, diffusers_pixart):
    url = pipelines_server.grpc_url
    with grpcclient.InferenceServerClient(url) as client:
        index = {m["name"]: m.get("state", "") for m in client.get_model_repository_index(as_json=True)["models"]}
        assert sorted(index) == sorted(f"{p}_{m}" for p, models in SERVED.items() for m in models)
        assert {name for name, state in index.items() if state == "READY"} == {f"{p}_{m}" for p in AT_START
                                                                               for m in SERVED[p]}
        with pytest.raises(InferenceServerException, match="txt2img"):   # no unprefixed model here
            client.infer("txt2img", GenerationRequest("a cat").infer_inputs(grpcclient))
    cat = GenerationRequest("a photo of a red cat", seed=42, num_inference_steps=6, guidance_scale=4.5)
    assert_matches(generate(url, "pixart", cat).media, diffusers_image(diffusers_pixart, cat.prompt, 42, 6, 4.5))
    flux = oracle(FluxPipeline, FLUX_DEPLOYMENT)
    np.testing.assert_array_equal(generate(url, "flux", cat, "grpc-stream").media,
                                  diffusers_flux_image(flux, cat.prompt, 42, 6, 4.5))
    with DitClient(pipelines_server.http_url, "http", pipeline="flux") as client:   # HTTP: the same names
        np.testing.assert_array_equal(client.generate(cat).media, diffusers_flux_image(flux, cat.prompt, 42, 6, 4.5))


def test_the_openai_front_end_lists_and_serves_each_pipeline(pipelines_server, tmp_path_factory):
    """frontend/: a named pipeline's task is the model id (`flux_txt2img`), as Triton names it."""
    import base64
    import io

    import openai
    from PIL import Image

    from ditserve.launcher import free_ports
    from frontend.launcher import FrontendProcess

    log = tmp_path_factory.mktemp("pipelines-frontend") / "frontend.log"
    frontend = FrontendProcess(pipelines_server.grpc_url, free_ports(1)[0], [], log_path=log).start()
    try:
        client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert sorted(m.id for m in client.models.list().data) == ["flux_txt2img", "pixart_txt2img"]
        cat = GenerationRequest("a photo of a red cat", seed=42, num_inference_steps=6, guidance_scale=4.5)
        [data] = client.images.generate(model="flux_txt2img", prompt=cat.prompt, size="64x64",
                                        extra_body={"seed": 42, "num_inference_steps": 6, "guidance_scale": 4.5}).data
        served = np.asarray(Image.open(io.BytesIO(base64.b64decode(data.b64_json))).convert("RGB"))
        np.testing.assert_array_equal(served, generate(pipelines_server.grpc_url, "flux", cat).media)
        with pytest.raises(openai.NotFoundError, match="flux_txt2img, pixart_txt2img"):   # no default here
            client.images.generate(prompt=cat.prompt, size="64x64")
    finally:
        frontend.stop()


def test_perf_tools_target_one_pipeline(pipelines_server, perf_analyzer, tmp_path):
    """perf/loadgen.py --pipeline flux sends to `flux_txt2img_stream` and reads the server's side
    from flux's series (its dit's step batches too); perf/sweep.py --pipeline pixart drives
    perf_analyzer `-m pixart_txt2img` against the running server (`--url`)."""
    report_path = tmp_path / "loadgen.json"
    rc = loadgen.main(["--url", pipelines_server.grpc_url, "--metrics-url", pipelines_server.metrics_url,
                       "--pipeline", "flux", "--rate", "20", "--num-requests", "3", "--sizes", "64", "--steps", "4",
                       "--warmup", "0", "--slo-scale", "0", "--quiet", "--out", str(report_path)])
    report = json.loads(report_path.read_text())
    assert rc == 0 and report["model"] == "flux_txt2img_stream" and report["completed_requests"] == 3, report
    assert report["server_completed"] == 3 and report["server_counts_consistent"], report
    assert report["step_batches"] > 0 and report["mean_step_batch_size"] >= 1 and report["stage_mean_ms"]["denoise"]

    sweep = subprocess.run(
        [sys.executable, str(ROOT / "perf" / "sweep.py"), "--sweep", "cpu-txt2img-unary", "--pipeline", "pixart",
         "--url", pipelines_server.grpc_url, "--concurrency", "1", "--requests-per-level", "3",
         "--warmup-requests", "1", "--baseline-runs", "0", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    (md,) = tmp_path.glob("*-cpu-txt2img-unary.md")
    assert "`pixart_txt2img`" in md.read_text() and " -m pixart_txt2img " in md.read_text()
    [row] = list(csv.DictReader(md.with_suffix(".csv").open()))
    assert float(row["Inferences/Second"]) > 0


@dataclass
class Streamed:
    """One generation streamed during the unload/reload: when it ran and what it gave."""

    variant: int = 0
    start: float = 0.0
    end: float = 0.0
    progress: list = field(default_factory=list)
    media: np.ndarray | None = None
    error: Exception | None = None

    def overlaps(self, interval: tuple[float, float]) -> bool:
        return self.start < interval[1] and self.end > interval[0]


def wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def stream_one(client: DitClient, request: GenerationRequest, item: Streamed) -> Streamed:
    """Run one streamed generation, recording into `item` as it goes."""
    item.start = time.monotonic()
    try:
        item.media = client.generate(request, lambda done, total: item.progress.append(done), timeout_s=120).media
    except Exception as exc:  # recorded, and failed by the test with the others
        item.error = exc
    item.end = time.monotonic()
    return item


def stream_until(url: str, variants: list[GenerationRequest], first: int, stop: threading.Event,
                 out: list[Streamed]) -> None:
    """Stream flux generations (variants first, first + 2, ...) until `stop`, pausing 0.2 s
    between them so the clients keep flux busy without starving the reload of CPU."""
    with DitClient(url, "grpc-stream", pipeline="flux") as client:
        k = first
        while not stop.is_set():
            out.append(stream_one(client, variants[k % len(variants)], Streamed(k % len(variants))))
            k += 2
            stop.wait(0.2)


def test_unloading_and_reloading_one_pipeline_leaves_the_other_streaming(pipelines_server, diffusers_pixart):
    url = pipelines_server.grpc_url
    variants = [GenerationRequest(f"flux request {k}", seed=100 + k, num_inference_steps=12, guidance_scale=3.5,
                                  height=64, width=64 + 32 * k) for k in range(3)]
    solo = [generate(url, "flux", request).media for request in variants]
    cat = GenerationRequest("a red cat", seed=7, num_inference_steps=4)
    before = generate(url, "pixart", cat).media
    long_cat = GenerationRequest("a slow red cat", seed=8, num_inference_steps=60)

    streamed: list[Streamed] = []
    stop = threading.Event()
    workers = [threading.Thread(target=stream_until, args=(url, variants, first, stop, streamed)) for first in (0, 1)]
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: len(streamed) >= 2, "flux streams before pixart goes")
        with RepositoryControl(url) as control, grpcclient.InferenceServerClient(url) as client, \
                DitClient(url, "grpc-stream", pipeline="pixart") as pixart:
            # pixart's own generation, in flight when the unload starts, finishes first
            own = Streamed()
            last = threading.Thread(target=stream_one, args=(pixart, long_cat, own))
            last.start()
            wait_for(lambda: own.progress, "pixart's own generation is under way")
            start = time.monotonic()
            unloaded = control.unload("pixart")
            unload = (start, time.monotonic())
            last.join(timeout=120)
            assert unloaded[:2] == ["pixart_txt2img", "pixart_txt2img_stream"]   # public models first
            assert set(control.models("pixart").values()) == {"UNAVAILABLE"}
            for model in PUBLIC:
                assert not client.is_model_ready(f"pixart_{model}")
                with pytest.raises(InferenceServerException, match=f"pixart_{model}"):
                    client.infer(f"pixart_{model}", cat.infer_inputs(grpcclient))
            assert all(client.is_model_ready(f"flux_{m}") for m in STAGES + PUBLIC)
            start = time.monotonic()
            loaded = control.load("pixart")
            load = (start, time.monotonic())
            assert loaded[-2:] == ["pixart_txt2img", "pixart_txt2img_stream"]    # stages first
        after = generate(url, "pixart", cat).media
        seen = len(streamed)
        wait_for(lambda: len(streamed) >= seen + 2, "flux still streams after pixart is back")
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=120)
    np.testing.assert_array_equal(after, before)
    assert own.error is None and own.progress == list(range(1, 61)) and own.end > unload[0], own
    assert_matches(own.media, diffusers_image(diffusers_pixart, long_cat.prompt, 8, 60, 4.5))
    listed = subprocess.run([sys.executable, str(ROOT / "scripts" / "pipeline.py"), "list", "--url", url],
                            check=True, capture_output=True, text=True).stdout.splitlines()
    lines = dict(line.split(": ", 1) for line in listed)
    assert sorted(lines) == sorted(SERVED) and "READY" not in lines["ti2v"]   # ti2v: its own test loads it
    assert all(lines[p] == ", ".join(f"{p}_{m} READY" for m in sorted(SERVED[p])) for p in AT_START)
    assert [item.error for item in streamed if item.error] == []
    assert any(item.overlaps(unload) for item in streamed), "no flux generation was in flight during the unload"
    assert any(item.overlaps(load) for item in streamed), "no flux generation was in flight during the reload"
    for item in streamed:
        assert item.progress == list(range(1, 13))
        assert_matches(item.media, solo[item.variant])


def test_a_video_pipeline_beside_them_serves_wan22_ti2v_as_diffusers(pipelines_server):
    """Wan2.2 TI2V-5B text-to-video (a timestep per latent token, the 48-channel 16x Wan2.2 VAE)
    loaded as pipeline `ti2v` into the running server beside the two image pipelines: a solo
    request equals diffusers' WanPipeline; then a second request joins a 300-step one mid-denoise
    (their rows at different timesteps in `ti2v_dit`'s forwards) and each still equals diffusers
    (1 level, as Wan2.1). Unloaded at the end: the image pipelines never stopped serving."""
    url = pipelines_server.grpc_url
    pipe = oracle(WanPipeline, load_deployment(TI2V))
    with RepositoryControl(url) as control:
        control.load("ti2v")
        try:
            assert set(control.models("ti2v").values()) == {"READY"}
            run_ti2v(pipelines_server, pipe)
        finally:
            control.unload("ti2v")
        assert all(set(control.models(p).values()) == {"READY"} for p in AT_START)


def run_ti2v(pipelines_server, pipe) -> None:
    url = pipelines_server.grpc_url

    def expected(request: GenerationRequest) -> np.ndarray:
        return diffusers_video(pipe, request.prompt, request.seed, request.num_inference_steps,
                               request.guidance_scale, request.num_frames, negative_prompt=request.negative_prompt)

    solo = GenerationRequest("waves rolling onto a beach", negative_prompt="blurry", seed=7, num_inference_steps=10,
                             guidance_scale=5.0, num_frames=9, height=64, width=64)
    with DitClient(url, "grpc-stream", task="txt2vid", pipeline="ti2v") as client:
        result = client.generate(solo, timeout_s=120)
    assert result.media.shape == (9, 64, 64, 3) and result.steps_reported == 10
    assert_matches(result.media, expected(solo))

    long, late = (GenerationRequest(prompt, negative_prompt="", seed=seed, num_inference_steps=steps,
                                    guidance_scale=guidance, num_frames=9, height=64, width=64)
                  for prompt, seed, steps, guidance in (("a red car", 11, 300, 4.0), ("a blue sea", 22, 12, 3.0)))
    shared_before = histogram_above(pipelines_server.metrics_url, "ditserve_step_batch_size", "ti2v_dit", "1")
    with DitClient(url, "grpc-stream", task="txt2vid", pipeline="ti2v") as first, \
            DitClient(url, "grpc-stream", task="txt2vid", pipeline="ti2v") as second:
        running = Streamed()
        worker = threading.Thread(target=stream_one, args=(first, long, running))
        worker.start()
        wait_for(lambda: running.progress or running.error, "the 300-step ti2v generation is under way")
        joined = stream_one(second, late, Streamed())
        worker.join(timeout=300)
    assert histogram_above(pipelines_server.metrics_url, "ditserve_step_batch_size", "ti2v_dit", "1") > shared_before
    for request, item in ((long, running), (late, joined)):
        assert item.error is None and item.progress == list(range(1, request.num_inference_steps + 1)), item.error
        assert_matches(item.media, expected(request))
