"""Each stage runs its request path once before READY (ditserve/stages/warm_path.py), and that
warm-up changes no output. On the default server of the suite (conftest's `server`)."""
from __future__ import annotations

import re

from conftest import diffusers_image
from ditserve.client import DitClient, GenerationRequest
from helpers import assert_matches, scrape

READY = "Started GRPCInferenceService"


def test_every_stage_warms_its_request_path_before_ready(server):
    log = server.log_path.read_text()
    ready = log.index(READY)
    for model in ("dit", "vae_decode", "txt2img", "txt2img_stream"):
        warmed = re.search(rf"{model}: warmed its request path in [\d.]+ ms", log)
        assert warmed and warmed.start() < ready, model
    # Triton's model_warmup (text_encoder/config.pbtxt) ran the real execute twice per instance.
    executes = [m.start() for m in re.finditer(r"text_encoder_0_0: execute \d took [\d.]+ ms \(1 request", log)]
    assert len(executes) >= 2 and executes[1] < ready


def test_requests_after_the_warm_up_match_diffusers_and_log_their_execute_times(server, diffusers_pixart):
    before = scrape(server.metrics_url)
    request = GenerationRequest("a warm blue fox", seed=11, num_inference_steps=4, guidance_scale=4.5)
    with DitClient(server.grpc_url, "grpc") as client:
        result = client.generate(request)
    assert_matches(result.media, diffusers_image(diffusers_pixart, request.prompt, 11, 4, 4.5))
    after = scrape(server.metrics_url)
    # The warm-up's forwards are not counted as served ones: this request ran exactly its 4.
    eager = ("ditserve_eager_forwards_total", "dit")
    assert after[eager] - before.get(eager, 0.0) == 4
    assert after[("ditserve_state_table_size", "dit")] == 0   # the warm-up left no state behind
    log = server.log_path.read_text()
    for model in ("txt2img", "dit", "vae_decode"):   # one line per instance that has run (4 txt2img instances)
        assert re.search(rf"{model}_0_\d+: execute 1 took [\d.]+ ms", log), model
