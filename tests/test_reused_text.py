"""The default negative prompt's encoding reused in text-encoder batches (ditserve/reused_text.py),
on a fake encoder whose rows say which text they came from, and on a real server."""
from __future__ import annotations

import pytest
import torch

from ditserve.client import DitClient, GenerationRequest
from ditserve.reused_text import ReusedRow
from ditserve.state import TextConditioning
from helpers import scrape

WIDTH = 3


def fake_encoder(calls: list, length: int = 4):
    """Row of text t: embeds filled with len(t), mask of ones, a per-row pooled extra of -len(t)."""
    def encode(texts: list[str]) -> TextConditioning:
        calls.append(list(texts))
        sizes = torch.tensor([float(len(t)) for t in texts])
        return TextConditioning(sizes[:, None, None].expand(-1, length, WIDTH).clone(),
                                torch.ones(len(texts), length, dtype=torch.int64), {"pooled": -sizes[:, None]})
    return encode


def test_rows_of_the_reused_text_come_from_its_stored_encoding_and_keep_their_places():
    calls: list = []
    reused = ReusedRow("", fake_encoder([])([""]))
    texts = ["", "a cat", "", "a large dog"]
    cond, count = reused.encode(texts, fake_encoder(calls))
    assert calls == [["a cat", "a large dog"]], "only the other texts are encoded"
    assert count == 2
    assert cond.embeds[:, 0, 0].tolist() == [0.0, 5.0, 0.0, 11.0]
    assert cond.extra["pooled"][:, 0].tolist() == [0.0, -5.0, 0.0, -11.0]
    assert cond.mask.shape == (4, 4)


def test_a_batch_of_only_the_reused_text_encodes_nothing():
    calls: list = []
    reused = ReusedRow("ugly", fake_encoder([])(["ugly"]))
    cond, count = reused.encode(["ugly", "ugly"], fake_encoder(calls))
    assert calls == [] and count == 2
    assert cond.embeds[:, 0, 0].tolist() == [4.0, 4.0]


def test_without_the_reused_text_or_with_rows_of_another_length_everything_is_encoded():
    calls: list = []
    reused = ReusedRow("", fake_encoder([])([""]))
    _, count = reused.encode(["a", "b"], fake_encoder(calls))
    assert (calls, count) == ([["a", "b"]], 0)
    calls.clear()
    cond, count = reused.encode(["", "a"], fake_encoder(calls, length=7))
    assert count == 0 and calls[-1] == ["", "a"] and cond.embeds.shape == (2, 7, WIDTH)


def test_only_one_text_can_be_stored():
    with pytest.raises(ValueError, match="one text"):
        ReusedRow("", fake_encoder([])(["", "x"]))


def test_served_requests_reuse_the_default_negative_and_match_diffusers(server, diffusers_pixart):
    """With CFG and the default negative prompt ("" in the tiny deployment) the text encoder takes
    that row from its load-time encoding (one reused row per request, counted); a request with its
    own negative prompt reuses nothing. Both images equal diffusers'."""
    from conftest import diffusers_image
    from helpers import assert_matches

    def reused_rows() -> float:
        return scrape(server.metrics_url).get(("ditserve_text_rows_reused_total", "text_encoder"), 0.0)

    cases = [(GenerationRequest("a red cat", seed=3, num_inference_steps=4), 1),
             (GenerationRequest("a red cat", seed=3, num_inference_steps=4, negative_prompt="blurry"), 0)]
    with DitClient(server.grpc_url, "grpc") as client:
        for request, expected in cases:
            before = reused_rows()
            image = client.generate(request).media
            assert reused_rows() - before == expected
            assert_matches(image, diffusers_image(diffusers_pixart, request.prompt, request.seed, 4, 4.5,
                                                  negative_prompt=request.negative_prompt or ""))
