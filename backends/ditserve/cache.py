"""Per-request First-Block Cache inside a step batch (the quality tiers of input `quality`).

First-Block Cache (as diffusers' `apply_first_block_cache`): run the transformer's first
block; if its residual (output - input) barely changed since the step at which the other
blocks last ran, reuse those blocks' cached residual instead of running them. diffusers
decides once for the whole batch and keeps one state per module, which fits a pipeline
call, not a step batch of requests at different timesteps and tiers. Here the decision is
per request (its CFG rows decide together, on their mean), its cache lives in its own
`RowCache` in its engine state, and the rows that reuse leave the batch for the other
blocks (`run_rest` gets only the rows that compute). A `lossless` request has no cache and
always computes, so its rows meet exactly the ops of a plain forward.

The family adapter owns the model's pieces (embedding, first block, other blocks, output);
this module owns the decision, the per-request state and the row scatter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class RowCache:
    """One request's cache: bounded to two tensors of its own rows, freed with its state."""

    threshold: float
    first_residual: torch.Tensor | None = None   # the first block's residual at the last computed step
    rest_residual: torch.Tensor | None = None    # what the other blocks added at that step
    hits: int = 0                                # steps that reused instead of computing

    def reusable(self, change: float | None) -> bool:
        """Whether the first block's residual moved less than the threshold since the last
        computed step (None: nothing cached yet)."""
        return change is not None and change < self.threshold


def relative_change(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """mean |new - old| / mean |old|: diffusers' First-Block Cache measure (a 0-dim tensor)."""
    new, old = new.float(), old.float()
    return (new - old).abs().mean() / old.abs().mean().clamp_min(1e-12)


def changes(residual: torch.Tensor, caches: list[RowCache | None], rows: int) -> list[float | None]:
    """Each cached request's relative change, read from the device in one transfer."""
    known = [i for i, cache in enumerate(caches) if cache is not None and cache.first_residual is not None]
    out: list[float | None] = [None] * len(caches)
    if known:
        values = torch.stack([relative_change(residual[rows_of(i, rows)], caches[i].first_residual) for i in known])
        for i, value in zip(known, values.tolist()):
            out[i] = value
    return out


def rows_of(index: int, rows: int) -> slice:
    return slice(index * rows, (index + 1) * rows)


def apply_first_block_cache(first_in: torch.Tensor, first_out: torch.Tensor, caches: list[RowCache | None],
                            run_rest: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The hidden states after all blocks, for a batch of len(caches) requests of equal row count.

    `first_in` / `first_out`: hidden states before / after the first block, all rows.
    `caches[i]`: request i's cache, None for `lossless`. `run_rest(index, hidden)` runs the
    other blocks on the rows `index` of the batch (hidden holds just those rows; None = all)."""
    rows = first_in.shape[0] // len(caches)
    residual = first_out - first_in
    reuse = [cache is not None and cache.reusable(change)
             for cache, change in zip(caches, changes(residual, caches, rows))]
    out = first_out.clone()
    for i, cache in enumerate(caches):
        if reuse[i]:
            out[rows_of(i, rows)] += cache.rest_residual
            cache.hits += 1
    compute = [i for i, hit in enumerate(reuse) if not hit]
    if not compute:
        return out
    if len(compute) == len(caches):   # nobody reuses: the plain batch, no gather
        out = computed = run_rest(None, first_out)
    else:
        index = torch.cat([torch.arange(i * rows, (i + 1) * rows) for i in compute]).to(first_out.device)
        computed = run_rest(index, first_out.index_select(0, index))
        out.index_copy_(0, index, computed)
    for position, i in enumerate(compute):
        cache = caches[i]
        if cache is not None:   # store what this step computed, as diffusers does only on compute
            cache.first_residual = residual[rows_of(i, rows)].clone()
            cache.rest_residual = computed[rows_of(position, rows)] - first_out[rows_of(i, rows)]
    return out
