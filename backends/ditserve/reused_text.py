"""A text encoded once and put in place of that text's rows in later text-encoder batches.

With CFG every request sends its negative prompt as a text row, and most keep the deployment's
default one: encoded once at load (text_encoder stage), it spares T5 half of its rows. diffusers
encodes a negative prompt apart from the prompt too, so the reused row is what its pipeline has.
"""
from __future__ import annotations

from typing import Callable

import torch

from .state import TextConditioning


class ReusedRow:
    """`text`'s encoding (one row), reused wherever a batch holds `text` again."""

    def __init__(self, text: str, cond: TextConditioning):
        if cond.embeds.shape[0] != 1:
            raise ValueError(f"expected the encoding of one text, got {cond.embeds.shape[0]} rows")
        self.text, self.cond = text, cond

    def encode(self, texts: list[str], encode: Callable[[list[str]], TextConditioning]) -> tuple[TextConditioning, int]:
        """`encode(texts)` with the rows equal to our text taken from the stored encoding instead;
        returns it and how many rows were reused. A family whose rows differ in length from ours
        gets every text encoded (nothing reused)."""
        fresh_texts = [t for t in texts if t != self.text]
        if len(fresh_texts) == len(texts):
            return encode(texts), 0
        fresh = encode(fresh_texts) if fresh_texts else None
        if fresh is not None and fresh.embeds.shape[1:] != self.cond.embeds.shape[1:]:
            return encode(texts), 0
        rows, j = [], 0
        for text in texts:
            if text == self.text:
                rows.append((self.cond, 0))
            else:
                rows.append((fresh, j))
                j += 1
        return select_rows(rows), len(texts) - len(fresh_texts)


def select_rows(rows: list[tuple[TextConditioning, int]]) -> TextConditioning:
    """The conditioning made of row `i` of each `cond`, in order (embeds, mask and per-row extras)."""
    def stack(get) -> torch.Tensor:
        return torch.cat([get(cond)[i:i + 1] for cond, i in rows])

    return TextConditioning(stack(lambda c: c.embeds), stack(lambda c: c.mask),
                            {name: stack(lambda c, n=name: c.extra[n]) for name in rows[0][0].extra})
