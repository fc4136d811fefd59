"""A bfloat16 deployment: the embeddings cross from text_encoder in BF16, the model's dtype.

The oracle is plain diffusers with `torch_dtype=torch.bfloat16` on the same tiny checkpoint,
with the tolerance of the fp32 parity tests (1 uint8 level); measured: max diff 0.
"""
from __future__ import annotations

import tomllib

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from conftest import ROOT, TINY_PIXART, diffusers_image, rendered_server, serve
from ditserve.client import DitClient, GenerationRequest
from ditserve.deployment import dump_toml
from helpers import assert_matches



@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory):
    data = tomllib.loads((ROOT / "configs" / "tiny-pixart-sigma.toml").read_text())
    data["model"]["dtype"] = "bfloat16"
    data["engine"]["capacity"] = 1   # one request at a time here: 5 stub processes to start, not 11
    deployment = tmp_path_factory.mktemp("bf16") / "tiny-pixart-sigma-bf16.toml"
    deployment.write_text("# tiny-pixart-sigma.toml in bfloat16, capacity 1 (tests/test_bf16.py)\n" + dump_toml(data))
    yield from serve(rendered_server(tmp_path_factory, deployment, TINY_PIXART, "bf16"))


def test_text_encoder_returns_bf16_embeddings(bf16_server):
    with grpcclient.InferenceServerClient(bf16_server.grpc_url) as client:
        outputs = {o["name"]: o["datatype"] for o in client.get_model_metadata("text_encoder", as_json=True)["outputs"]}
        assert outputs == {"embeds": "BF16", "mask": "INT64"}
        text = grpcclient.InferInput("text", [1, 2], "BYTES")
        text.set_data_from_numpy(np.array([[b"", b"a red cat"]], dtype=np.object_))
        result = client.infer("text_encoder", [text])
        assert result.get_output("embeds").datatype == "BF16"
        # T5 ran on 32 tokens, and the zeros past them stay here: dit pads them back (text_padding.py)
        assert result.as_numpy("embeds").shape[:3] == (1, 2, 32)
        assert result.as_numpy("mask").shape == (1, 2, 300)


def test_bf16_generation_matches_diffusers_in_bf16(bf16_server):
    from diffusers import PixArtSigmaPipeline

    pipe = PixArtSigmaPipeline.from_pretrained(str(TINY_PIXART), torch_dtype=torch.bfloat16)
    request = GenerationRequest("a photo of a red cat", seed=42, num_inference_steps=6, guidance_scale=4.5)
    with DitClient(bf16_server.grpc_url, "grpc") as client:
        served = client.generate(request).media
    expected = diffusers_image(pipe, request.prompt, 42, 6, 4.5)
    assert_matches(served, expected)
