"""T5 encoders run on the prompts' tokens, not on the pipeline's padding (issue 22).

PixArt-Sigma pads every prompt to 300 tokens and Wan to 512 (`max_sequence_length`), and their
pipelines run the whole T5 / UMT5 encoder on them with an attention mask. A typical prompt is
10-60 tokens, so most of that encoder's work (the largest model of the pipeline: 4.8 B parameters
for PixArt-Sigma's T5-XXL) is padding, paid in the time to first step of every request and in the
text_encoder stage's throughput under load. These encoders are bidirectional with a mask and a
relative position bias, so a token's output does not depend on padding after the last real
token: `TrimPadding` runs the encoder on the batch's tokens up to the shortest of `LENGTHS` that
holds them (a few lengths, so that a compiled encoder warms each once) and pads its output back to
the full length with zeros.

Outputs at the real tokens (and at the padding up to that length) equal the full-length run's (bit
for bit on the CPU, tests/test_text_padding.py). Past it the output holds zeros where the full run
holds the pad tokens' outputs: Wan's pipeline zeroes those itself, and PixArt-Sigma's transformer
masks them out of its cross-attention (a -10000 bias, a softmax weight of exactly 0). Encoders
called without a mask (FLUX.1's and SD3's T5 attend to their padding) run unchanged.
"""
from __future__ import annotations

from typing import Callable

import torch

# Token lengths the encoder runs at, below the pipeline's full length (which is always the last).
LENGTHS = (32, 128)


def trimmed_length(mask: torch.Tensor) -> int:
    """The shortest of LENGTHS (or the full length) holding every row's real tokens (right padding)."""
    full = mask.shape[1]
    real = int(mask.sum(dim=1).max())
    return next((length for length in LENGTHS if real <= length < full), full)


class TrimPadding:
    """A T5-family encoder's forward, run on the tokens up to `trimmed_length` and padded back."""

    def __init__(self, forward: Callable):
        self.forward = forward

    def __call__(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 *args, **kwargs):
        if input_ids is None or attention_mask is None or attention_mask.ndim != 2:
            return self.forward(input_ids, attention_mask, *args, **kwargs)
        host = attention_mask.cpu()   # one wait for the device instead of one per check below
        full, keep = input_ids.shape[1], trimmed_length(host)
        if keep == full or bool(host[:, keep:].any()):   # nothing to trim, or not right-padded
            return self.forward(input_ids, attention_mask, *args, **kwargs)
        out = self.forward(input_ids[:, :keep], attention_mask[:, :keep], *args, **kwargs)
        hidden = torch.nn.functional.pad(out[0], (0, 0, 0, full - keep))
        if isinstance(out, tuple):
            return (hidden, *out[1:])
        out.last_hidden_state = hidden
        return out


def cut_zero_padding(embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`embeds` [rows, L, D] without its tokens past `trimmed_length(mask)` when all of those are
    zeros (what TrimPadding leaves there): a 32-token prompt's PixArt-Sigma embeddings are then 0.5 MB
    instead of 4.9 MB on their way through the stubs and the handoff to dit, which puts the zeros back
    (`pad_to_mask`). Returned whole where its length is not the mask's or a cut token is not zero."""
    full = embeds.shape[1]
    if mask.ndim != 2 or mask.shape[1] != full:
        return embeds
    keep = trimmed_length(mask)
    if keep == full or bool(embeds[:, keep:].any()):
        return embeds
    return embeds[:, :keep]


def pad_to_mask(embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`embeds` [..., L, D] padded with zeros to the mask's length [..., L_mask]: the tensor
    `cut_zero_padding` was given (unchanged when it is already that long)."""
    missing = mask.shape[-1] - embeds.shape[-2]
    return torch.nn.functional.pad(embeds, (0, 0, 0, missing)) if missing > 0 else embeds


def is_t5_encoder(encoder: torch.nn.Module | None) -> bool:
    """A T5 or UMT5 encoder: a masked bidirectional encoder whose padding can be cut."""
    from transformers import T5EncoderModel, UMT5EncoderModel
    return isinstance(encoder, (T5EncoderModel, UMT5EncoderModel))


def trim_encoder_padding(encoder: torch.nn.Module) -> TrimPadding | None:
    """Put TrimPadding in front of `encoder`'s forward if it is a T5 or UMT5 encoder; None otherwise."""
    if not is_t5_encoder(encoder):
        return None
    trim = TrimPadding(encoder.forward)
    encoder.forward = trim
    return trim


@torch.inference_mode()
def warm_lengths(encoder: torch.nn.Module, full: int, rows: int) -> None:
    """Run `encoder` once at every length TrimPadding uses (a compiled forward warms each), as the
    pipelines call it: without autograd."""
    for length in (*(n for n in LENGTHS if n < full), full):
        ids = torch.zeros(rows, full, dtype=torch.long, device=encoder.device)
        mask = torch.zeros(rows, full, dtype=torch.long, device=encoder.device)
        mask[:, :length] = 1
        encoder(ids, attention_mask=mask)
