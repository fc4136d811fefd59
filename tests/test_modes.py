"""The four execution modes keep parity with diffusers (they are each other's controls).

`step` with capacity 4 is the default deployment (covered by test_step_batching.py);
here each other mode gets its own server from a rendered repository.
"""
from __future__ import annotations

import pytest

from conftest import ROOT, diffusers_image, render_repository, serve, start_server
from ditserve.client import GenerationRequest
from helpers import StreamCall, assert_matches, scrape

MODES = [("serial", 1), ("request_batch", 4), ("step", 1)]


def write_deployment(tmp_path, mode: str, capacity: int):
    """The default deployment with another engine mode, and a repository rendered for it."""
    base = (ROOT / "configs" / "tiny-pixart-sigma.toml").read_text()
    text = base.replace('mode = "step"', f'mode = "{mode}"').replace("capacity = 4", f"capacity = {capacity}")
    deployment = tmp_path / f"{mode}-{capacity}.toml"
    deployment.write_text(text)
    return deployment, render_repository(deployment, tmp_path / f"repo-{mode}-{capacity}")


@pytest.fixture(scope="module", params=MODES, ids=[f"{m}-cap{c}" for m, c in MODES])
def mode_server(request, tmp_path_factory):
    mode, capacity = request.param
    tmp = tmp_path_factory.mktemp(f"{mode}{capacity}")
    deployment, repo = write_deployment(tmp, mode, capacity)
    for server in serve(start_server(tmp, "server", model_repository=repo, deployment=str(deployment))):
        yield mode, capacity, server


def test_each_mode_matches_diffusers_under_concurrency(mode_server, diffusers_pixart):
    mode, capacity, server = mode_server
    requests = [GenerationRequest("a red cat", seed=1, num_inference_steps=12),
                GenerationRequest("a dog", seed=2, num_inference_steps=7, guidance_scale=1.0),
                GenerationRequest("a house", seed=3, num_inference_steps=9, height=96)]
    before = scrape(server.metrics_url)
    calls = [StreamCall(server.grpc_url, r).start() for r in requests]
    for request, call in zip(requests, calls):
        progress, image = call.finish()
        steps = request.num_inference_steps
        assert progress == [(i, steps) for i in range(1, steps + 1)], "one progress response per step"
        expected = diffusers_image(diffusers_pixart, request.prompt, request.seed, steps,
                                   request.guidance_scale or 4.5, request.height or 64, 64)
        assert_matches(image, expected)
    after = scrape(server.metrics_url)
    forwards = after[("ditserve_step_batch_size_count", "dit")] - before.get(("ditserve_step_batch_size_count", "dit"), 0)
    rows = after[("ditserve_step_batch_size_sum", "dit")] - before.get(("ditserve_step_batch_size_sum", "dit"), 0)
    assert rows == sum(r.num_inference_steps for r in requests)
    if capacity == 1:
        assert rows == forwards, f"{mode} with capacity 1 must never batch"
