"""The trained tiny PixArt-Sigma (configs/tiny-pixart-shapes.toml) served end to end: its
pictures show the asked colours, and serving it equals plain diffusers on the same weights.

Quality: every prompt of shapes_dataset.eval_prompts() (15 training combinations and all 9
held-out ones, canonical phrasing) at the deployment's defaults (64x64, 20 steps, guidance
4.5), one fixed seed each. A picture counts when its border has the asked background colour
and the pixels at its shape's centre of mass the asked shape colour (shapes_dataset.measure).
The bar is 90 % over all prompts, as the issue asks, and 7 of the 9 held-out prompts on their
own. Measured here: 24/24, held-out 9/9; random weights score 0. Which shape was drawn
(shapes_dataset.measure: bounding-box fill) is asserted too, at 18/24: the shipped weights
(run 3) draw 21/24 (held-out 7/9); run 2's, which drew blobs, drew 13/24; chance is a third.

Parity tolerance as in tests/test_txt2img.py: max |served - diffusers| <= 1 uint8 level.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import ROOT, diffusers_image
from ditserve.client import DitClient, GenerationRequest
from helpers import assert_matches

sys.path.insert(0, str(ROOT / "scripts"))
import shapes_dataset as shapes  # noqa: E402

STEPS, GUIDANCE = 20, 4.5  # configs/tiny-pixart-shapes.toml [defaults]


@pytest.fixture(scope="module")
def served(shapes_server) -> dict[tuple[str, str, str], np.ndarray]:
    """One picture per evaluation prompt, from the server's defaults; seed = the prompt's index."""
    with DitClient(shapes_server.grpc_url, "grpc") as client:
        return {combo: client.generate(GenerationRequest(shapes.caption(*combo), seed=i)).media
                for i, combo in enumerate(shapes.eval_prompts())}


def test_served_pictures_show_the_asked_colours_and_shapes(served):
    every, unseen = shapes.score_with_held_out(served)
    print(f"colours right: {every.colours:.0%} of {every.n} ({unseen.colours:.0%} of {unseen.n} held-out); "
          f"shape right: {every.shapes:.0%} ({unseen.shapes:.0%} held-out)")
    assert every.n == 24 and unseen.n == 9
    assert every.colours >= 0.9
    assert unseen.colours >= 7 / 9
    assert every.shapes >= 18 / 24


@pytest.mark.parametrize("combo, template", [
    (("red", "circle", "blue"), 0),  # the quickstart's prompt
    (shapes.HELD_OUT[0], 2),  # a combination never trained on, in another phrasing
])
def test_served_equals_diffusers_on_the_trained_weights(shapes_server, diffusers_shapes, combo, template):
    prompt = shapes.caption(*combo, template)
    with DitClient(shapes_server.grpc_url, "grpc-stream") as client:
        result = client.generate(GenerationRequest(prompt, seed=11))
    expected = diffusers_image(diffusers_shapes, prompt, 11, STEPS, GUIDANCE)
    assert expected.shape == (64, 64, 3)
    assert_matches(result.media, expected)
