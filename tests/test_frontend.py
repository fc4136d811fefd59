"""The OpenAI-compatible front end (frontend/): the real `openai` SDK against a real front-end
process and a real tritonserver (tiny pipelines).

Images are served from the trained tiny PixArt-Sigma, the model scripts/web.sh serves, whose
deployment enables the cache tiers `balanced` and `fast` (input `quality`). One front end per
Triton server (images, and the session's Wan servers for videos), plus one pointed at a port
where nothing listens (Triton down). The media store's bounds are tested on a folder, without
a server.
"""
from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import re
import shutil
import sys
import time
from dataclasses import replace

import numpy as np
import openai
import pytest
from PIL import Image
from tritonclient.utils import InferenceServerException

from conftest import ROOT, diffusers_image
from ditserve.client import MEDIA_OUTPUT, DitClient, GenerationRequest
from ditserve.launcher import free_ports
from ditserve.media import decode_mp4
from frontend.__main__ import parser
from frontend.errors import APIError
from frontend.images import Encoding
from frontend.launcher import FrontendProcess
from frontend.media import MediaStore
from frontend.requests import choose_model
from frontend.videos import VIDEO_TASKS
from helpers import assert_cancelled_on_server, assert_matches, delta_of, scrape, settled_scrape, wait_for_metric

sys.path.insert(0, str(ROOT / "perf"))
from accel_bench import psnr  # noqa: E402  (the benchmarks' PSNR of uint8 images)

# The SDK warns that OpenAI's own video models are retired; this server is not OpenAI's.
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")
API_KEY = "test-key-21"
BODY_LIMIT = 65536


def start_frontend(triton_url: str, tmp_path_factory, name: str, *args: str) -> FrontendProcess:
    log = tmp_path_factory.mktemp(name) / "frontend.log"
    return FrontendProcess(triton_url, free_ports(1)[0], list(args), log_path=log).start()


@pytest.fixture(scope="module")
def server(shapes_server):
    """This module's image server: the trained tiny model scripts/web.sh serves, with cache tiers."""
    return shapes_server


@pytest.fixture(scope="module")
def frontend(server, tmp_path_factory):
    fe = start_frontend(server.grpc_url, tmp_path_factory, "frontend", "--api-key", API_KEY,
                        "--max-body-bytes", str(BODY_LIMIT))
    yield fe
    fe.stop()


@pytest.fixture
def client(frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def call(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
         key: str | None = API_KEY) -> tuple[int, dict, bytes]:
    """A plain HTTP request (for what the SDK does not send): (status, headers, body)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    result = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    conn.close()
    return result


def png(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def triton_media(server, task: str, request: GenerationRequest):
    with DitClient(server.grpc_url, "grpc", task=task) as triton:
        return triton.generate(request)


def test_image_equals_the_triton_image_and_diffusers(client, server, diffusers_shapes):
    response = client.images.generate(model="txt2img", prompt="a red cat on a blue sofa", size="96x64",
                                      response_format="b64_json",
                                      extra_body={"seed": 3, "num_inference_steps": 8, "guidance_scale": 4.5})
    [data] = response.data
    image = png(data.b64_json)
    assert image.shape == (64, 96, 3), "size is WIDTHxHEIGHT"
    assert data.model_extra["seed"] == 3
    same = triton_media(server, "txt2img", GenerationRequest("a red cat on a blue sofa", height=64, width=96,
                                                             num_inference_steps=8, guidance_scale=4.5, seed=3))
    assert np.array_equal(image, same.media), "the PNG carries exactly the pixels Triton's txt2img returns"
    assert_matches(image, diffusers_image(diffusers_shapes, "a red cat on a blue sofa", 3, 8, 4.5, 64, 96))


def test_n_images_are_n_requests_batched_stepwise(client, server):
    before = scrape(server.metrics_url)
    response = client.images.generate(prompt="a lighthouse", size="64x64", n=3,
                                      extra_body={"seed": 10, "num_inference_steps": 12})
    after = scrape(server.metrics_url)
    images = [png(d.b64_json) for d in response.data]
    assert [d.model_extra["seed"] for d in response.data] == [10, 11, 12]
    assert not np.array_equal(images[0], images[1])
    forwards, rows = (after[(name, "dit")] - before.get((name, "dit"), 0)
                      for name in ("ditserve_step_batch_size_count", "ditserve_step_batch_size_sum"))
    assert rows == 3 * 12 and forwards < rows, f"{rows} denoise rows in {forwards} forwards: no step was shared"
    solo = client.images.generate(prompt="a lighthouse", size="64x64", extra_body={"seed": 11, "num_inference_steps": 12})
    assert_matches(images[1], png(solo.data[0].b64_json))   # batched vs solo: the step-batching tolerance


def test_stream_sends_one_event_per_step_then_the_image(client):
    args = dict(prompt="a small boat", size="64x64", extra_body={"seed": 4, "num_inference_steps": 5})
    events = list(client.images.generate(stream=True, **args))
    assert [(e.type, e.step, e.total_steps) for e in events[:-1]] == \
        [("image_generation.progress", k, 5) for k in range(1, 6)]
    assert events[-1].type == "image_generation.completed" and events[-1].size == "64x64"
    assert np.array_equal(png(events[-1].b64_json), png(client.images.generate(**args).data[0].b64_json))


def test_stream_of_n_images_reports_each_by_index(client):
    events = list(client.images.generate(prompt="a tree", size="64x64", n=2, stream=True,
                                         extra_body={"seed": 1, "num_inference_steps": 3}))
    for index in (0, 1):
        mine = [e for e in events if e.model_extra.get("index", getattr(e, "index", None)) == index]
        assert [e.type for e in mine] == ["image_generation.progress"] * 3 + ["image_generation.completed"]


def server_message(server, task: str = "txt2img", **inputs) -> str:
    """The message Triton itself answers a request with these inputs."""
    with pytest.raises(InferenceServerException) as exc:
        triton_media(server, task, GenerationRequest("a cat", **inputs))
    return exc.value.message()


@pytest.mark.parametrize("stream", [False, True])
def test_server_validation_message_is_passed_through_as_a_400(client, server, stream):
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.generate(prompt="a cat", size="65x64", stream=stream)
    assert exc.value.status_code == 400
    assert exc.value.body["message"] == server_message(server, height=64, width=65)
    assert exc.value.body["param"] == "width" and exc.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.generate(prompt="a cat", extra_body={"num_inference_steps": 0})
    assert exc.value.body["message"] == server_message(server, num_inference_steps=0)


def test_a_quality_tier_reaches_triton_and_equals_its_result(client, server):
    prompt = "a red circle on a blue background"
    lossless, fast = (triton_media(server, "txt2img", GenerationRequest(prompt, height=64, width=64, seed=5,
                                                                       quality=tier)) for tier in (None, "fast"))
    assert fast.cache_hits > 0 and not np.array_equal(fast.media, lossless.media), "the tier changes the work"
    for quality, same in (("fast", fast), ("auto", lossless)):   # OpenAI's `auto`: the deployment's default
        [data] = client.images.generate(prompt=prompt, size="64x64", extra_body={"quality": quality, "seed": 5}).data
        assert np.array_equal(png(data.b64_json), same.media), quality
        assert data.model_extra["cache_hits"] == same.cache_hits, quality


@pytest.mark.parametrize("stream", [False, True])
def test_a_tier_the_deployment_lacks_is_a_400_naming_quality_and_the_tiers(client, server, stream):
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.generate(prompt="a cat", stream=stream, extra_body={"quality": "turbo"})
    assert exc.value.body["message"] == server_message(server, quality="turbo")
    assert exc.value.body["param"] == "quality" and "['lossless', 'balanced', 'fast']" in exc.value.body["message"]


def test_url_responses_download_the_b64_json_png(client, frontend):
    # Solo requests (n=1), so that both runs take the same steps: batched rows may differ by a level.
    args = dict(prompt="a green square on a white background", size="64x64",
                extra_body={"seed": 8, "num_inference_steps": 6})
    [item], [inline] = client.images.generate(response_format="url", **args).data, client.images.generate(**args).data
    assert item.b64_json is None and item.url.startswith(frontend.url + "/v1/media/"), item.url
    path = item.url.removeprefix(frontend.url)
    status, headers, body = call(frontend.url, "GET", path)
    assert status == 200 and headers["content-type"] == "image/png"
    assert body == base64.b64decode(inline.b64_json), "the stored file is the b64_json PNG"
    assert call(frontend.url, "GET", path, key=None)[0] == 401, "the files need the API key too"
    # The URL is built from the request's own address (a proxy's Host header included).
    _, _, body = call(frontend.url, "POST", "/v1/images/generations", json.dumps(
        {"prompt": "a cat", "size": "32x32", "num_inference_steps": 2, "response_format": "url"}).encode(),
        {"Content-Type": "application/json", "Host": "images.example:9999"})
    assert json.loads(body)["data"][0]["url"].startswith("http://images.example:9999/v1/media/")
    # Streamed, the completed event carries the PNG (as OpenAI's does) and the link to it.
    *_, done = client.images.generate(stream=True, response_format="url", **args)
    assert call(frontend.url, "GET", done.url.removeprefix(frontend.url))[2] == base64.b64decode(done.b64_json)
    assert done.b64_json == inline.b64_json and done.url != item.url


def test_jpeg_and_webp_carry_the_image_at_their_quality(client, frontend):
    """`output_format` jpeg / webp (OpenAI's formats besides PNG): the file decodes to the PNG's
    pixels within its format's loss, `output_compression` is its quality (a lower one, a smaller
    file), the response says which format it holds, and a stored one is served with its media type."""
    args = dict(prompt="a green square on a white background", size="64x64",
                extra_body={"seed": 8, "num_inference_steps": 6})
    exact = png(client.images.generate(**args).data[0].b64_json)
    for fmt, media_type in (("jpeg", "image/jpeg"), ("webp", "image/webp")):
        best = client.images.generate(output_format=fmt, **args)
        low = client.images.generate(output_format=fmt, output_compression=20, **args)
        assert best.output_format == low.output_format == fmt
        data, small = (base64.b64decode(r.data[0].b64_json) for r in (best, low))
        decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert Image.open(io.BytesIO(data)).format == fmt.upper() and decoded.shape == exact.shape
        assert psnr(decoded, exact) > 30, f"{fmt} at quality 100: {psnr(decoded, exact):.1f} dB"
        assert len(small) < len(data), f"{fmt}: quality 20 gave {len(small)} bytes, 100 gave {len(data)}"
        [item] = client.images.generate(output_format=fmt, response_format="url", **args).data
        status, headers, _ = call(frontend.url, "GET", item.url.removeprefix(frontend.url))
        assert status == 200 and headers["content-type"] == media_type
    *_, done = client.images.generate(stream=True, output_format="jpeg", **args)
    assert done.output_format == "jpeg" and Image.open(io.BytesIO(base64.b64decode(done.b64_json))).format == "JPEG"


def test_jpeg_keeps_full_colour_from_quality_90():
    """4:2:0 chroma caps a detailed picture near 13 dB at any quality, so quality >= 90 writes 4:4:4
    (perf/results/2026-12-05-cpu-frontend-encode.md); below 90 the smaller 4:2:0 file."""
    picture = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)

    def decoded(quality: int) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(Encoding("jpeg", quality).encode(picture))).convert("RGB"))

    assert psnr(decoded(100), picture) > 45 and psnr(decoded(90), picture) > 28
    assert psnr(decoded(89), picture) < 15


def test_the_media_store_keeps_the_newest_files_within_its_bounds(tmp_path):
    store = MediaStore(tmp_path, max_files=2, max_bytes=10)
    a, b, c = (store.put(data, ".png") for data in (b"aa", b"bbb", b"cccc"))
    assert store.names() == [b, c] and sorted(p.name for p in tmp_path.iterdir()) == sorted([b, c])
    with pytest.raises(APIError) as exc:
        store.path(a)
    assert exc.value.status == 404 and "expired" in exc.value.message
    d = store.put(b"d" * 6, ".mp4")      # 4 + 6 bytes fit; with b, 13 would not
    assert store.names() == [c, d] and store.total_bytes == 10 and store.path(d).read_bytes() == b"d" * 6
    with pytest.raises(APIError) as exc:
        store.put(b"e" * 11, ".png")
    assert exc.value.status == 507 and store.names() == [c, d]
    # A restart over the same folder counts what is there, oldest first, under its own bounds.
    assert MediaStore(tmp_path, max_files=1, max_bytes=100).names() == [d] and not (tmp_path / c).exists()
    for name in ("../secret.png", "x.png", d.replace(".mp4", ".txt")):
        with pytest.raises(APIError):
            store.path(name)


def test_a_model_triton_has_but_not_ready_is_a_503_and_one_it_lacks_a_404():
    states = {"txt2img": "LOADING", "txt2vid": "READY"}   # as TritonGateway.task_states reads the index
    with pytest.raises(APIError) as exc:
        choose_model(None, states, ("txt2img",), "txt2img")
    assert exc.value.status == 503 and "state LOADING" in exc.value.message
    with pytest.raises(APIError) as exc:
        choose_model("img2vid", states, VIDEO_TASKS, "txt2vid")
    assert exc.value.status == 404 and exc.value.param == "model" and "models: txt2vid" in exc.value.message
    assert choose_model(None, states, VIDEO_TASKS, "txt2vid") == "txt2vid"


def test_the_command_line_defaults_face_no_one(monkeypatch):
    monkeypatch.delenv("DITSERVE_API_KEY", raising=False)
    args = parser().parse_args([])
    assert args.host == "127.0.0.1" and args.cors_origins == [] and args.api_key is None
    assert (args.max_n, args.max_body_bytes) == (4, 16 * 2**20) and args.media_dir is None


@pytest.mark.parametrize("kwargs, status, param", [
    ({"n": 9}, 400, "n"),
    ({"size": "large"}, 400, "size"),
    ({"style": "vivid"}, 400, "style"),
    ({"response_format": "jpeg"}, 400, "response_format"),
    ({"output_format": "gif"}, 400, "output_format"),
    ({"output_compression": 80}, 400, "output_compression"),                # PNG is lossless
    ({"output_format": "jpeg", "output_compression": 101}, 400, "output_compression"),
    ({"extra_body": {"num_inference_steps": "many"}}, 400, "num_inference_steps"),
    ({"extra_body": {"guidance_scale_2": 2.0}}, 400, "guidance_scale_2"),   # a video-only input (Wan2.2 A14B)
    ({"model": "dall-e-3"}, 404, "model"),
])
def test_front_end_checks_get_openai_error_bodies(client, kwargs, status, param):
    with pytest.raises(openai.APIStatusError) as exc:
        client.images.generate(prompt="a cat", **kwargs)
    assert exc.value.status_code == status
    assert exc.value.body["param"] == param and param in exc.value.body["message"]


def test_a_missing_prompt_names_it(frontend):
    status, _, body = call(frontend.url, "POST", "/v1/images/generations", b"{}", {"Content-Type": "application/json"})
    assert status == 400 and json.loads(body)["error"]["param"] == "prompt"


def test_api_key_is_required_on_the_api_but_not_for_the_page(frontend):
    with pytest.raises(openai.AuthenticationError) as exc:
        openai.OpenAI(base_url=frontend.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert exc.value.status_code == 401 and exc.value.body["code"] == "invalid_api_key"
    status, headers, body = call(frontend.url, "POST", "/v1/images/generations", b'{"prompt": "x"}', key=None)
    assert status == 401 and headers["www-authenticate"] == "Bearer" and json.loads(body)["error"]["message"]
    assert call(frontend.url, "GET", "/", key=None)[0] == 200


def test_request_bodies_over_the_limit_are_refused(frontend):
    big = json.dumps({"prompt": "x" * BODY_LIMIT}).encode()
    status, _, body = call(frontend.url, "POST", "/v1/images/generations", big, {"Content-Type": "application/json"})
    assert status == 413 and "limit" in json.loads(body)["error"]["message"]
    chunks = (big[i:i + 8192] for i in range(0, len(big), 8192))   # no Content-Length: counted as it arrives
    host, port = frontend.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/images/generations", body=chunks, encode_chunked=True,
                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert conn.getresponse().status == 413
    conn.close()


def test_no_cross_origin_access_by_default(frontend):
    status, headers, _ = call(frontend.url, "OPTIONS", "/v1/images/generations", headers={
        "Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in headers
    _, headers, _ = call(frontend.url, "GET", "/v1/models", headers={"Origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in headers


def test_models_lists_what_triton_serves(client, server):
    import tritonclient.http as httpclient

    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    ready = {m["name"] for m in index if m.get("state") == "READY"}
    expected = [task for task in MEDIA_OUTPUT if task in ready]
    assert [m.id for m in client.models.list().data] == expected == ["txt2img"]


def test_a_client_disconnect_cancels_the_generation_on_the_server(client, server, frontend):
    before = settled_scrape(server.metrics_url)
    stream = client.images.generate(prompt="a slow cat", size="64x64", stream=True,
                                    extra_body={"num_inference_steps": 100})
    for event in stream:
        if event.step == 3:
            stream.close()   # closes the connection mid-denoise
            break
    assert_cancelled_on_server(server, before, "txt2img")

    before = settled_scrape(server.metrics_url)   # the same without streaming: the connection just goes away
    host, port = frontend.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/images/generations", body=json.dumps({"prompt": "a slow cat", "size": "64x64",
                 "num_inference_steps": 100}), headers={"Authorization": f"Bearer {API_KEY}",
                                                        "Content-Type": "application/json"})
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 1.0) == 1.0
    conn.close()
    assert_cancelled_on_server(server, before, "txt2img")
    cancels = ("nv_inference_count", "cancel")   # by request id, not by cancelling the gRPC call
    assert scrape(server.metrics_url).get(cancels, 0) == before.get(cancels, 0) + 1


def test_a_client_that_leaves_in_the_last_steps_ends_its_generation_once(client, server, frontend):
    """With 2 steps to go the cancel meets the final response, where a cancelled gRPC call can
    crash Triton 2.51 (docs/reliability.md); the front end cancels by request id instead. The
    generation ends once: cancelled, or completed when the cancel came after its last step."""
    before = settled_scrape(server.metrics_url)
    stream = client.images.generate(prompt="an almost finished cat", size="64x64", stream=True,
                                    extra_body={"num_inference_steps": 6})
    for event in stream:
        if event.step == 4:
            stream.close()   # 2 steps to go
            break
    cancels = ("nv_inference_count", "cancel")
    assert wait_for_metric(server.metrics_url, *cancels, before.get(cancels, 0) + 1) == before.get(cancels, 0) + 1
    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0
    delta = delta_of(before, settled_scrape(server.metrics_url), "txt2img_stream")
    assert delta("ditserve_requests_completed_total") + delta("ditserve_requests_cancelled_total") == 1
    assert delta("ditserve_requests_failed_total") == 0


def test_the_page_is_served_and_its_endpoints_exist(frontend):
    status, headers, body = call(frontend.url, "GET", "/", key=None)
    page = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in headers["content-security-policy"]
    for element in ('id="prompt"', 'id="size"', 'id="steps"', 'id="seed"', "<progress", 'id="cancel"'):
        assert element in page
    paths = set(re.findall(r'"(/v1/[a-z/]+)"', page))
    assert paths == {"/v1/models", "/v1/images/generations", "/v1/videos/sync"}
    for path in paths:   # each answers as an API route (an OpenAI error body at worst), not "no such route"
        status, _, body = call(frontend.url, "GET" if path == "/v1/models" else "POST", path, b"",
                               {"Content-Type": "application/json"})
        assert status not in (404, 405) or "error" in json.loads(body), (path, status, body)


def test_503_while_triton_is_down_and_cors_only_for_configured_origins(tmp_path_factory):
    port = free_ports(1)[0]   # nothing listens there
    with FrontendProcess(f"127.0.0.1:{port}", free_ports(1)[0], ["--cors-origin", "https://app.example"]) as fe:
        for origin, allowed in (("https://app.example", True), ("https://elsewhere.example", False)):
            _, headers, _ = call(fe.url, "OPTIONS", "/v1/images/generations", key=None, headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type"})
            assert (headers.get("access-control-allow-origin") == origin) == allowed, (origin, headers)
        sdk = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0)
        for request in (sdk.models.list, lambda: sdk.images.generate(prompt="a cat"),
                        lambda: sdk.images.generate(prompt="a cat", stream=True)):
            with pytest.raises(openai.InternalServerError) as exc:
                request()
            assert exc.value.status_code == 503 and exc.value.body["type"] == "service_unavailable"
        assert call(fe.url, "GET", "/health", key=None)[0] == 503


# Videos: /v1/videos jobs (OpenAI's video API, as vLLM-Omni serves it) and /v1/videos/sync.

@pytest.fixture(scope="module")
def video_frontend(wan_server, tmp_path_factory):
    fe = start_frontend(wan_server.grpc_url, tmp_path_factory, "video-frontend")
    yield fe
    fe.stop()


@pytest.fixture
def video_client(video_frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=video_frontend.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def wait_for_job(sdk: openai.OpenAI, video_id: str, status: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while (job := sdk.videos.retrieve(video_id)).status != status:
        assert job.status not in ("failed", "completed"), job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def test_video_job_gives_the_mp4_triton_gives(video_client, wan_server):
    job = video_client.videos.create(prompt="waves at dusk", model="txt2vid", size="64x64",
                                     extra_body={"num_frames": 9, "fps": 8, "seed": 2, "num_inference_steps": 4})
    assert job.object == "video" and job.status in ("queued", "in_progress") and job.seconds == "1.125"
    done = wait_for_job(video_client, job.id, "completed")
    assert done.progress == 100 and done.model_extra["seed"] == 2
    mp4 = video_client.videos.download_content(job.id).read()
    frames, fps = decode_mp4(mp4)
    assert frames.shape == (9, 64, 64, 3) and fps == 8
    same = triton_media(wan_server, "txt2vid", GenerationRequest("waves at dusk", height=64, width=64, num_frames=9,
                                                                 fps=8, seed=2, num_inference_steps=4,
                                                                 output_format="mp4"))
    assert mp4 == same.video_mp4
    assert job.id in [v.id for v in video_client.videos.list().data]
    video_client.videos.delete(job.id)
    with pytest.raises(openai.NotFoundError):
        video_client.videos.retrieve(job.id)


def test_deleting_a_running_video_job_cancels_it_on_the_server(video_client, wan_server):
    before = settled_scrape(wan_server.metrics_url)
    job = video_client.videos.create(prompt="a long video", extra_body={"num_inference_steps": 100, "num_frames": 9})
    wait_for_job(video_client, job.id, "in_progress")
    assert video_client.videos.delete(job.id).deleted
    assert_cancelled_on_server(wan_server, before, "txt2vid")


FORM = {"Content-Type": "multipart/form-data; boundary=b"}


def form_body(fields: dict[str, str]) -> bytes:
    """A multipart form of text fields (boundary `b`), as `curl -F` sends."""
    parts = "".join(f'--b\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items())
    return (parts + "--b--\r\n").encode()


def test_video_sync_streams_progress_then_the_mp4(video_frontend):
    fields = {"prompt": "rain", "size": "64x64", "num_frames": "5", "num_inference_steps": "3", "seed": "1",
              "stream": "true"}
    status, headers, raw = call(video_frontend.url, "POST", "/v1/videos/sync", form_body(fields), FORM, key=None)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert [(e["type"], e.get("step")) for e in events] == \
        [("video_generation.progress", k) for k in (1, 2, 3)] + [("video_generation.completed", None)]
    mp4 = base64.b64decode(events[-1]["b64_json"])
    assert decode_mp4(mp4)[0].shape == (5, 64, 64, 3)
    status, _, raw = call(video_frontend.url, "POST", "/v1/videos/sync", form_body(
        {**fields, "stream": "false", "response_format": "url"}), FORM, key=None)
    url = json.loads(raw)["url"]
    assert status == 200 and url.startswith(video_frontend.url + "/v1/media/") and url.endswith(".mp4")
    status, headers, stored = call(video_frontend.url, "GET", url.removeprefix(video_frontend.url), key=None)
    assert status == 200 and headers["content-type"] == "video/mp4"
    # Two generations of one seed: equal unless another test's job shared their step batches,
    # which moves the floats by a few ulps and so the H.264 bytes (seen under load); compare frames.
    streamed_frames, stored_frames = decode_mp4(mp4)[0].astype(int), decode_mp4(stored)[0].astype(int)
    assert stored == mp4 or np.abs(streamed_frames - stored_frames).mean() < 1.0


def test_video_errors_are_openai_errors(video_client, video_frontend):
    # A job is accepted at once; the server's rejection then fails it, as OpenAI reports job errors.
    job = video_client.videos.create(prompt="waves", extra_body={"num_frames": 8})
    deadline = time.monotonic() + 60
    while (job := video_client.videos.retrieve(job.id)).status != "failed":
        assert job.status != "completed" and time.monotonic() < deadline, job
        time.sleep(0.1)
    assert "num_frames" in job.error.message
    with pytest.raises(openai.APIStatusError) as exc:   # it has no content
        video_client.videos.download_content(job.id)
    assert exc.value.status_code == 422
    status, _, body = call(video_frontend.url, "POST", "/v1/videos/sync", form_body({"prompt": "waves",
                           "num_frames": "8"}), FORM, key=None)
    assert status == 400 and json.loads(body)["error"]["param"] == "num_frames"   # the sync call answers it
    # `quality` reaches the video server too, which names the tiers it enables.
    status, _, body = call(video_frontend.url, "POST", "/v1/videos/sync", form_body({"prompt": "waves",
                           "quality": "turbo"}), FORM, key=None)
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "quality"
    assert error["message"].endswith("allowed: ['lossless', 'balanced', 'fast']")
    # Wan2.1 has one transformer, so its models do not declare `guidance_scale_2`: Triton refuses it by name.
    status, _, body = call(video_frontend.url, "POST", "/v1/videos/sync", form_body({"prompt": "waves",
                           "guidance_scale_2": "2"}), FORM, key=None)
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "guidance_scale_2", error
    assert error["message"].startswith("unexpected inference input 'guidance_scale_2' for model 'txt2vid_stream'")
    with pytest.raises(openai.BadRequestError) as exc:   # txt2vid takes no image: checked before the job starts
        video_client.videos.create(prompt="waves", model="txt2vid",
                                   input_reference=("in.png", _png_bytes(), "image/png"))
    assert exc.value.body["param"] == "input_reference"
    with pytest.raises(openai.NotFoundError):
        video_client.videos.retrieve("video_nonexistent")


@pytest.fixture(scope="module")
def wan22_frontend(wan22_server, tmp_path_factory):
    fe = start_frontend(wan22_server.grpc_url, tmp_path_factory, "wan22-frontend")
    yield fe
    fe.stop()


def test_guidance_scale_2_reaches_the_low_noise_expert(wan22_frontend, wan22_server):
    """Wan2.2 A14B's `guidance_scale_2` goes to Triton as sent: the job's MP4 is the one Triton makes
    with it (and not the one without it, where `guidance_scale` guides both experts)."""
    sdk = openai.OpenAI(base_url=wan22_frontend.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    request = GenerationRequest("a red kite", height=64, width=64, num_frames=5, seed=5, num_inference_steps=6,
                                guidance_scale=4.0, output_format="mp4")
    job = sdk.videos.create(prompt=request.prompt, size="64x64", extra_body={
        "num_frames": 5, "seed": 5, "num_inference_steps": 6, "guidance_scale": 4.0, "guidance_scale_2": 1.5})
    wait_for_job(sdk, job.id, "completed")
    mp4 = sdk.videos.download_content(job.id).read()
    assert mp4 == triton_media(wan22_server, "txt2vid", replace(request, guidance_scale_2=1.5)).video_mp4
    assert mp4 != triton_media(wan22_server, "txt2vid", request).video_mp4, "guidance_scale_2 changed nothing"


@pytest.mark.parametrize("fields, words", [
    ({"guidance_scale_2": "31"}, ["allowed [0.0, 30.0]"]),
    ({"guidance_scale": "1", "guidance_scale_2": "3"}, ["guidance_scale > 1"]),
    ({"guidance_scale_2": "nan"}, ["finite", "[0, 30.0]"]),
])
def test_a_bad_guidance_scale_2_is_the_servers_400_naming_it(wan22_frontend, wan22_server, fields, words):
    status, _, body = call(wan22_frontend.url, "POST", "/v1/videos/sync", form_body({"prompt": "a cat", **fields}),
                           FORM, key=None)
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "guidance_scale_2", error
    inputs = {name: float(value) for name, value in fields.items()}
    assert error["message"] == server_message(wan22_server, "txt2vid", **inputs)
    assert all(word in error["message"] for word in words), error["message"]


def _png_bytes(width: int = 40, height: int = 56) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_img2vid_from_an_uploaded_image(i2v_server, tmp_path_factory):
    fe = start_frontend(i2v_server.grpc_url, tmp_path_factory, "i2v-frontend")
    try:
        sdk = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        job = sdk.videos.create(prompt="the scene moves", input_reference=("in.png", _png_bytes(), "image/png"),
                                size="64x64", extra_body={"num_frames": 5, "seed": 3, "num_inference_steps": 3})
        assert job.model == "img2vid"
        wait_for_job(sdk, job.id, "completed")
        mp4 = sdk.videos.download_content(job.id).read()
        image = np.asarray(Image.open(io.BytesIO(_png_bytes())).convert("RGB"))
        same = triton_media(i2v_server, "img2vid", GenerationRequest("the scene moves", height=64, width=64,
                                                                     num_frames=5, seed=3, num_inference_steps=3,
                                                                     output_format="mp4", image=image))
        assert mp4 == same.video_mp4
    finally:
        fe.stop()


# The page, in a real headless browser: Debian's chromium (scripts/setup.sh installs it;
# Playwright's own browser download cannot reach its servers from here) driven by Playwright.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: scripts/setup.sh installs Debian's package when run as root")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@contextlib.contextmanager
def browser_page(browser, url: str, model: str, key: str | None = None):
    """The page at `url` in a new tab, its model list loaded (with `key` typed in)."""
    tab = browser.new_page()
    try:
        tab.goto(url + "/")
        if key:
            tab.wait_for_function("() => document.getElementById('status').textContent.includes('API key')")
            tab.fill("#key", key)    # the API needs it; the page itself does not
            tab.dispatch_event("#key", "change")
        tab.wait_for_function(f"() => document.getElementById('model').value === '{model}'")
        # Every value the progress bar takes: each change's old value (changes can arrive batched).
        tab.evaluate("""() => { const bar = document.getElementById('progress'); window.seen = [];
            new MutationObserver((changes) => { for (const c of changes) window.seen.push(Number(c.oldValue)); })
                .observe(bar, {attributeFilter: ['value'], attributeOldValue: true}); }""")
        yield tab
    finally:
        tab.close()


@pytest.fixture(scope="module")
def page(browser, frontend):
    with browser_page(browser, frontend.url, "txt2img", API_KEY) as tab:
        yield tab


def bar_values(tab) -> list[int]:
    return tab.evaluate("window.seen") + [tab.evaluate("() => document.getElementById('progress').value")]


def test_the_page_shows_progress_then_the_image(page, server):
    page.fill("#prompt", "a blue house by a lake")
    page.fill("#size", "96x64")
    page.fill("#steps", "10")
    page.fill("#seed", "7")
    page.click("#generate")
    page.wait_for_selector("#output", timeout=60000)
    seen = bar_values(page)
    assert seen == sorted(seen) and set(seen) == set(range(11)), f"the bar moved step by step: {seen}"
    assert page.get_attribute("#output", "src").startswith("blob:")
    same = triton_media(server, "txt2img", GenerationRequest("a blue house by a lake", height=64, width=96,
                                                             num_inference_steps=10, seed=7))
    assert np.array_equal(shown_pixels(page), same.media), "the page shows the pixels Triton made"
    assert page.text_content("#status") == "done (seed 7)"
    # A cache tier, on a prompt the trained model knows: the page shows it and how many steps it reused.
    for field, value in (("#prompt", "a red circle on a blue background"), ("#size", "64x64"), ("#steps", "20"),
                         ("#quality", "fast")):
        page.fill(field, value)
    page.click("#generate")
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('done')")
    fast = triton_media(server, "txt2img", GenerationRequest("a red circle on a blue background", height=64, width=64,
                                                             num_inference_steps=20, seed=7, quality="fast"))
    assert np.array_equal(shown_pixels(page), fast.media) and fast.cache_hits > 0
    assert page.text_content("#status") == f"done (seed 7, {fast.cache_hits} of 20 steps reused)"
    page.fill("#quality", "")


def shown_pixels(tab) -> np.ndarray:
    """The RGB pixels of the page's image, read back through a canvas."""
    size, rgba = tab.eval_on_selector("#output", """(img) => { const c = document.createElement('canvas');
        c.width = img.naturalWidth; c.height = img.naturalHeight; const g = c.getContext('2d');
        g.drawImage(img, 0, 0);
        return [[c.height, c.width], Array.from(g.getImageData(0, 0, c.width, c.height).data)]; }""")
    return np.array(rgba, dtype=np.uint8).reshape(*size, 4)[..., :3]


def test_the_page_cancel_button_cancels_on_the_server(page, server):
    before = settled_scrape(server.metrics_url)
    page.fill("#steps", "100")
    page.fill("#size", "256x256")
    page.click("#generate")
    page.wait_for_function("() => document.getElementById('progress').value >= 2")
    page.click("#cancel")
    page.wait_for_function("() => document.getElementById('status').textContent === 'cancelled'")
    assert_cancelled_on_server(server, before, "txt2img")
    assert page.is_enabled("#generate") and not page.is_enabled("#cancel")


def test_the_page_plays_the_video(browser, video_frontend):
    with browser_page(browser, video_frontend.url, "txt2vid") as tab:
        assert tab.is_visible("#frames") and not tab.is_visible("#image")   # img2vid's field only
        tab.fill("#steps", "4")
        tab.click("#generate")
        tab.wait_for_selector("video#output", timeout=60000)
        tab.wait_for_function("() => document.getElementById('output').readyState >= 1")   # metadata decoded
        assert tab.evaluate("() => [output.videoWidth, output.videoHeight, output.duration]") == [64, 64, 9 / 16]
        assert set(bar_values(tab)) == set(range(5))
