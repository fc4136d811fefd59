"""text_padding.py: T5-family encoders run on the prompts' tokens and pad their output back.

The trimmed run equals the full-length run at every position it computes (bit for bit on this
CPU); past it the output is zero, which Wan's pipeline does itself and PixArt-Sigma's
transformer masks out of its cross-attention, so both families' transformer outputs are unchanged.
"""
from __future__ import annotations

import pytest
import torch
from transformers import T5EncoderModel

from conftest import ROOT, TINY_PIXART
from ditserve.adapters import adapter_for
from ditserve.deployment import load_deployment
from ditserve.text_padding import LENGTHS, TrimPadding, cut_zero_padding, pad_to_mask, trimmed_length


def _mask(lengths: list[int], full: int) -> torch.Tensor:
    mask = torch.zeros(len(lengths), full, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return mask


def test_the_batch_runs_at_the_shortest_length_holding_its_longest_prompt():
    assert LENGTHS == (32, 128)
    assert trimmed_length(_mask([5, 12], 300)) == 32
    assert trimmed_length(_mask([5, 33], 300)) == 128
    assert trimmed_length(_mask([129], 300)) == 300
    assert trimmed_length(_mask([20], 32)) == 32    # a pipeline whose full length is a bucket: nothing to trim


def test_trimmed_encoder_equals_the_full_run_where_it_computes_and_is_zero_past_it():
    encoder = T5EncoderModel.from_pretrained(TINY_PIXART / "text_encoder").eval()
    ids = torch.randint(5, 90, (2, 300))
    mask = _mask([7, 19], 300)
    ids[mask == 0] = 0
    with torch.inference_mode():
        full = encoder(ids, attention_mask=mask).last_hidden_state
        calls = []
        trim = TrimPadding(lambda i, m, *a, **k: calls.append(i.shape[1]) or encoder.forward(i, m, *a, **k))
        trimmed = trim(ids, attention_mask=mask)
    assert calls == [32]
    assert trimmed[0].shape == full.shape and torch.equal(trimmed.last_hidden_state, trimmed[0])
    assert torch.equal(trimmed[0][:, :32], full[:, :32])
    assert not trimmed[0][:, 32:].any()
    # Without a mask, or with padding that is not on the right, the encoder runs as called.
    with torch.inference_mode():
        assert torch.equal(trim(ids)[0], encoder(ids)[0])
        left = mask.flip(1)
        assert torch.equal(trim(ids, attention_mask=left)[0], encoder(ids, attention_mask=left)[0])
    assert calls[1:] == [300, 300]


def test_pixart_transformer_output_is_unchanged_by_the_trimmed_text():
    """The text_encoder stage's (trimmed) conditioning and diffusers' own (full) give dit the same output."""
    deployment = load_deployment(ROOT / "configs" / "tiny-pixart-sigma.toml")
    encode = adapter_for(deployment.model.family)(deployment, "text_encoder")
    dit = adapter_for(deployment.model.family)(deployment, "dit")
    assert encode.text_trim is not None and dit.text_trim is None
    texts = ["", "a photo of a red cat"]
    with torch.inference_mode():
        trimmed = encode.encode_prompts(texts)
        encode.pipe.text_encoder.forward = encode.text_trim.forward   # the encoder as diffusers calls it
        full_embeds, full_mask, _, _ = encode.pipe.encode_prompt(
            texts, do_classifier_free_guidance=False, device=encode.device, clean_caption=False,
            max_sequence_length=deployment.model.max_sequence_length)
    assert torch.equal(trimmed.mask, full_mask)
    assert not torch.equal(trimmed.embeds, full_embeds), "past 32 tokens the trimmed rows are zero"
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    timesteps = torch.tensor([500, 500])
    with torch.inference_mode():
        out_trimmed = dit.forward(latents, timesteps, trimmed)
        out_full = dit.forward(latents, timesteps, type(trimmed)(full_embeds, full_mask, {}))
    assert torch.equal(out_trimmed, out_full)


@pytest.mark.parametrize("config", ["tiny-wan-t2v.toml"])
def test_wan_text_conditioning_equals_the_pipelines_own(config):
    """Wan's pipeline zeroes the padding's embeddings itself: trimmed or not, the same tensor."""
    deployment = load_deployment(ROOT / "configs" / config)
    encode = adapter_for(deployment.model.family)(deployment, "text_encoder")
    assert encode.text_trim is not None
    texts = ["", "a cat walks on the grass"]
    with torch.inference_mode():
        trimmed = encode.encode_prompts(texts).embeds
        encode.pipe.text_encoder.forward = encode.text_trim.forward   # the encoder as diffusers calls it
        full = encode.encode_prompts(texts).embeds
    assert torch.equal(trimmed, full)


def test_zero_padding_is_cut_for_the_trip_to_dit_and_put_back_exactly():
    """text_encoder sends embeddings without the zeros past the trimmed length; dit pads them back
    to the mask's length: the very tensor, and nothing cut that is not zero."""
    mask = _mask([5, 12], 300)
    embeds = torch.randn(2, 300, 8).to(torch.bfloat16)
    embeds[:, 32:] = 0
    cut = cut_zero_padding(embeds, mask)
    assert cut.shape == (2, 32, 8)
    assert torch.equal(pad_to_mask(cut, mask), embeds)
    assert pad_to_mask(embeds, mask) is embeds
    # A non-zero value past the length (T5 run on its padding, as FLUX.1 and SD3 do), a prompt that
    # fills the full length, or embeddings whose length is not the mask's: sent whole.
    embeds[1, 200, 3] = 1
    assert cut_zero_padding(embeds, mask) is embeds
    assert cut_zero_padding(torch.zeros(1, 300, 8), _mask([290], 300)).shape == (1, 300, 8)
    assert cut_zero_padding(torch.zeros(2, 77, 8), mask).shape == (2, 77, 8)
