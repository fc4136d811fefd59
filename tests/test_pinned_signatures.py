"""accel.pin_processor_signatures: diffusers' attention looks its processor's signature up once, not
at every call, with the same forward and nothing for dynamo to break on."""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

import torch
from diffusers import PixArtTransformer2DModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))

from ditserve.accel import pin_processor_signatures, processor_calls  # noqa: E402


def _transformer_and_call():
    model = PixArtTransformer2DModel.from_pretrained(ROOT / "models/tiny-pixart-sigma/transformer").eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=g)
    embeds = torch.randn(2, 300, model.config.caption_channels, generator=g)
    mask, t = torch.ones(2, 300), torch.tensor([999, 500])

    def call(latents):
        return model(latents, encoder_hidden_states=embeds, timestep=t, encoder_attention_mask=mask,
                     added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample
    return model, call, x


def test_pinned_signatures_change_no_result_and_no_compiled_graph():
    model, call, x = _transformer_and_call()
    calls = processor_calls(model)
    assert calls == {type(m.processor).__call__ for m in model.modules() if getattr(m, "processor", None) is not None}
    saved = {c: c.__dict__.pop("__signature__", None) for c in calls}   # another test may have pinned them
    try:
        with torch.no_grad():
            before = call(x)
            signatures = {c: inspect.signature(c) for c in calls}
            assert pin_processor_signatures(model) == len(calls) >= 1
            for c in calls:
                assert c.__dict__["__signature__"] == signatures[c]
                # what Attention.forward asks, on a bound method: the parameters without `self`
                bound = next(m.processor.__call__ for m in model.modules() if type(getattr(m, "processor", None)).__call__ is c)
                assert list(inspect.signature(bound).parameters) == list(signatures[c].parameters)[1:]
            assert pin_processor_signatures(model) == len(calls)   # idempotent
            assert torch.equal(call(x), before)
            # dynamo traces it as one graph (a per-instance stand-in broke at every attention call)
            explained = torch._dynamo.explain(call)(x)
            assert explained.graph_break_count == 0, explained.break_reasons
    finally:
        for c, sig in saved.items():   # as the test found them
            c.__dict__.pop("__signature__", None)
            if sig is not None:
                c.__signature__ = sig
