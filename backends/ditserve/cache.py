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

The transformer's own forward runs unchanged: `first_block_cache` stands its block list in
for the duration of one call with a stand-in that runs the first block, decides per request and
runs the other blocks on the rows that compute (as diffusers' hooks wrap blocks, not forwards).
A family opts in by naming its block list (`FamilyAdapter.cache_blocks`); its blocks must take
the hidden states first and return them alone (PixArt-Sigma's and Wan's do; FLUX.1's and SD3's
joint blocks return the text stream too).

`[cache] back_blocks = n` (cache-dit's DBCache "Bn"): the last n blocks run for every row at every
step, so the cached residual covers only the middle blocks and a reused step still passes
through the back blocks with its own timestep and hidden states. On the trained tiny model that
buys ~3 dB at the same projected speed (docs/cache.md).

`[cache] front_blocks = n` (DBCache "Fn", default 1): the first n blocks run for every row and the
decision reads their residual together, a steadier signal than one block's; a reused step then
costs n + back blocks. "First block" below means these front blocks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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


def plan_reuse(first_in: torch.Tensor, first_out: torch.Tensor,
               caches: list[RowCache | None]) -> tuple[torch.Tensor, list[int], list[int]]:
    """The first block's residual, and the requests that compute this step and those that reuse
    it, by index (one device-to-host read)."""
    rows = first_in.shape[0] // len(caches)
    residual = first_out - first_in
    reuse = [cache is not None and cache.reusable(change) for cache, change in zip(caches, changes(residual, caches, rows))]
    return residual, [i for i, hit in enumerate(reuse) if not hit], [i for i, hit in enumerate(reuse) if hit]


def request_rows(requests: list[int], rows: int, device: torch.device) -> torch.Tensor:
    """The batch rows of `requests` (indices into the batch's requests of `rows` rows each)."""
    return torch.cat([torch.arange(i * rows, (i + 1) * rows) for i in requests]).to(device)


def reused_hidden(first_out: torch.Tensor, caches: list[RowCache | None], reused: list[int], rows: int) -> torch.Tensor:
    """The hidden states after all blocks of the `reused` requests' rows: their first block's
    output plus the residual the other blocks added when they last ran; counts the hits."""
    for i in reused:
        caches[i].hits += 1
    return torch.cat([first_out[rows_of(i, rows)] + caches[i].rest_residual for i in reused])


def remember(caches: list[RowCache | None], compute: list[int], residual: torch.Tensor, first_out: torch.Tensor,
             rest_out: torch.Tensor, rows: int) -> None:
    """Store what this step computed (as diffusers, only on a computed step): per computing request
    with a cache, its first block's residual and what the other blocks added; `rest_out` holds the
    computing requests' rows after the other blocks, in `compute` order."""
    for position, i in enumerate(compute):
        cache = caches[i]
        if cache is not None:
            cache.first_residual = residual[rows_of(i, rows)].clone()
            cache.rest_residual = rest_out[rows_of(position, rows)] - first_out[rows_of(i, rows)]


def apply_first_block_cache(first_in: torch.Tensor, first_out: torch.Tensor, caches: list[RowCache | None],
                            run_rest: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The hidden states after all blocks, for a batch of len(caches) requests of equal row count.

    `first_in` / `first_out`: hidden states before / after the first block, all rows.
    `caches[i]`: request i's cache, None for `lossless`. `run_rest(index, hidden)` runs the
    other blocks on the rows `index` of the batch (hidden holds just those rows; None = all)."""
    rows = first_in.shape[0] // len(caches)
    residual, compute, reused = plan_reuse(first_in, first_out, caches)
    out = first_out.clone()
    if reused:
        out.index_copy_(0, request_rows(reused, rows, out.device), reused_hidden(first_out, caches, reused, rows))
    if not compute:
        return out
    if len(compute) == len(caches):   # nobody reuses: the plain batch, no gather
        out = computed = run_rest(None, first_out)
    else:
        index = request_rows(compute, rows, first_out.device)
        computed = run_rest(index, first_out.index_select(0, index))
        out.index_copy_(0, index, computed)
    remember(caches, compute, residual, first_out, computed, rows)
    return out


def _rows(value: Any, index: torch.Tensor, total: int) -> Any:
    """`value` at batch rows `index` if it is a tensor with one row per batch row, else as is
    (rotary embeddings and other shared inputs have a batch dimension of 1 or none)."""
    if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == total:
        return value.index_select(0, index)
    return value


def front_of(blocks: list, front: int) -> list:
    """The first `front` blocks, which every row runs and whose residual decides (`[cache] front_blocks`)."""
    return blocks[:front]


def middle(blocks: list, front: int, back: int) -> list:
    """The blocks a reusing request skips: all but the first `front` and the last `back`."""
    return blocks[front:len(blocks) - back]


def back_of(blocks: list, back: int) -> list:
    """The last `back` blocks, which every row runs on every step (`[cache] back_blocks`)."""
    return blocks[len(blocks) - back:]


class _CachedBlocks(torch.nn.Module):
    """Stands in for a transformer's block list during one forward: iterating it yields one step
    that runs the `front` first blocks (recording their input), one step that applies the cache to
    the middle blocks, then the `back` last blocks as they are (every row runs them)."""

    def __init__(self, blocks: torch.nn.ModuleList, caches: list[RowCache | None], front: int = 1, back: int = 0):
        super().__init__()
        object.__setattr__(self, "blocks", list(blocks))   # not registered: the transformer keeps owning them
        self.caches, self.front, self.back = caches, front, back
        self.first_in: torch.Tensor | None = None

    def __iter__(self) -> Iterator[Callable]:
        yield self._first
        yield self._rest
        yield from back_of(self.blocks, self.back)

    def _first(self, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        self.first_in = hidden
        for block in front_of(self.blocks, self.front):
            hidden = block(hidden, *args, **kwargs)
        return hidden

    def _rest(self, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        total = hidden.shape[0]

        def run_rest(index: torch.Tensor | None, states: torch.Tensor) -> torch.Tensor:
            a, k = args, kwargs
            if index is not None:
                a = tuple(_rows(v, index, total) for v in args)
                k = {name: _rows(v, index, total) for name, v in kwargs.items()}
            for block in middle(self.blocks, self.front, self.back):
                states = block(states, *a, **k)
            return states

        return apply_first_block_cache(self.first_in, hidden, self.caches, run_rest)


@contextlib.contextmanager
def swapped_blocks(transformer: torch.nn.Module, blocks: str, stand_in: torch.nn.Module) -> Iterator[None]:
    """Inside, `transformer`'s forward iterates `stand_in` where it iterates its block list `blocks`."""
    original = getattr(transformer, blocks)
    setattr(transformer, blocks, stand_in)
    try:
        yield
    finally:
        setattr(transformer, blocks, original)


@contextlib.contextmanager
def first_block_cache(transformer: torch.nn.Module, blocks: str, caches: list[RowCache | None],
                      front: int = 1, back: int = 0) -> Iterator[None]:
    """Inside, `transformer`'s forward applies each request's First-Block Cache to its block
    list `blocks` (requests of equal row count, in batch order); the first `front` and the last
    `back` blocks run for every row."""
    with swapped_blocks(transformer, blocks, _CachedBlocks(getattr(transformer, blocks), caches, front, back)):
        yield
