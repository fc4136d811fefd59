"""The quality tiers' cached forward in CUDA graphs, beside the lossless ones (issue 20).

A CUDA graph replays kernels without the host, so it cannot hold First-Block Cache's
decision, which reads each request's change on the host. The cached forward is therefore cut
where it decides, into three segments, each diffusers' own forward over a stand-in block list
(as `cache.first_block_cache` does eagerly; no family code), captured per row bucket:

- head: every row, the first block only (the first `[cache] front_blocks`); gives the first
  block's input and output (the rest of the forward then runs on that output: a few kernels,
  unused);
- rest: the rows that compute; the head's first-block output stands in for the first block,
  then the other blocks; gives the model output and the hidden states after the middle blocks
  (all but the front and the `[cache] back_blocks` last: cache.middle);
- tail: the rows that reuse; their first-block output plus the residual cached when their
  middle blocks last ran stands in for the first and middle blocks, then the back blocks run;
  gives the model output.

Rest and tail recompute the embeddings (patch, timestep, caption: a few percent of a block's
work at 1024px) rather than carry them between graphs. Rows that reuse so leave the batch for
the blocks they skip, and every row stays in a graph: eager, a graph-captured deployment paid
1.13-1.15x solo for a lossy tier that reused nothing (perf/results/2026-12-02-h200-cache-served.md).
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from .accel import BucketGraph, flat_inputs, pad_rows, row_bucket, unflat_inputs
from .cache import RowCache, back_of, front_of, middle, plan_reuse, remember, request_rows, reused_hidden, swapped_blocks
from .state import TextConditioning

class _Parts(torch.nn.Module):
    """A stand-in block list: iterating it yields one segment's callables."""

    def __init__(self, *parts: Callable):
        super().__init__()
        self.parts = parts

    def __iter__(self) -> Iterator[Callable]:
        return iter(self.parts)


class CachedGraphs:
    """One transformer's cached forward as captured segments, per (call signature, row bucket).

    `forward(latents, timesteps, cond)` is the family's forward; its transformer `owner` iterates
    the block list named `blocks`. `capture=False` runs each segment directly on the same static
    buffers instead of replaying a graph (CPU, where no CUDA graph exists: the tests).

    `compile_backend` (the deployment's `[accel] compile_backend`) compiles each block on its own
    before capture, as the lossless graphs capture the compiled forward: fused kernels for the
    blocks, the segments' glue eager. The blocks share one code object, so one compile (per
    dynamic shape) serves them all. On the H200 a tier that reused nothing cost 1.08-1.10x lossless
    with eager blocks in the segments, 0.99x with compiled ones (perf/results/2026-12-03-h200-cache-graphs.md)."""

    def __init__(self, forward: Callable, owner: torch.nn.Module, blocks: str, buckets: list[int],
                 pool=None, capture: bool = True, compile_backend: str | None = None, front: int = 1,
                 back: int = 0):
        self.forward, self.owner, self.blocks, self.front, self.back = forward, owner, blocks, front, back
        self.buckets, self.pool, self.capture = buckets, pool, capture
        self.block_calls: list[Callable] = list(getattr(owner, blocks))   # the blocks the segments run
        if compile_backend is not None:
            self.block_calls = [torch.compile(block, backend=compile_backend) for block in self.block_calls]
        self.segments: dict[tuple, BucketGraph] = {}   # (signature, segment, bucket) -> its graph
        self.warm: set[tuple] = set()

    def fits(self, sig: tuple, rows: int) -> bool:
        """Whether a cached forward of `rows` rows with this signature has its segments."""
        return sig in self.warm and row_bucket(self.buckets, rows) is not None

    def capture_all(self, sig: tuple, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> None:
        """Capture every segment for every bucket (the largest first: its memory pool then serves
        the smaller graphs), at load; the rows that compute or reuse are any subset of a batch."""
        names, inputs = sorted(cond.extra), flat_inputs(latents, timesteps, cond)
        for size in reversed(self.buckets):
            padded = [pad_rows(t[:size], size) for t in inputs]
            head = self._graph(self._head(names), padded)
            _, _, first_out = head(padded)
            self.segments[(sig, "head", size)] = head
            self.segments[(sig, "rest", size)] = self._graph(self._rest(names), padded + [first_out])
            self.segments[(sig, "tail", size)] = self._graph(self._tail(names), padded + [first_out])
        self.warm.add(sig)

    def __call__(self, sig: tuple, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning,
                 caches: list[RowCache | None]) -> torch.Tensor:
        """The model output of a batch of len(caches) requests of equal row count (cache.py's rule)."""
        rows_total = latents.shape[0]
        rows = rows_total // len(caches)
        inputs = flat_inputs(latents, timesteps, cond)
        _, first_in, first_out = self._run(sig, "head", inputs)
        residual, compute, reused = plan_reuse(first_in, first_out, caches)
        if not reused:   # nobody reuses: the whole batch computes, no gather
            out, rest_out = self._run(sig, "rest", inputs + [first_out])
            remember(caches, compute, residual, first_out, rest_out, rows)
            return out
        parts = []
        if compute:
            index = request_rows(compute, rows, latents.device)
            out, rest_out = self._run(sig, "rest", [t.index_select(0, index) for t in inputs + [first_out]])
            remember(caches, compute, residual, first_out, rest_out, rows)
            parts.append((index, out))
        index = request_rows(reused, rows, latents.device)
        (out,) = self._run(sig, "tail", [t.index_select(0, index) for t in inputs]
                           + [reused_hidden(first_out, caches, reused, rows)])
        parts.append((index, out))
        if not compute:
            return out
        result = torch.empty((rows_total, *parts[0][1].shape[1:]), dtype=parts[0][1].dtype, device=parts[0][1].device)
        for index, out in parts:
            result.index_copy_(0, index, out)
        return result

    # ---- the segments -------------------------------------------------------------------
    def _run(self, sig: tuple, segment: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.segments[(sig, segment, row_bucket(self.buckets, inputs[0].shape[0]))](inputs)

    def _graph(self, run: Callable[[list[torch.Tensor]], tuple], inputs: list[torch.Tensor]) -> BucketGraph:
        return BucketGraph(run, inputs, self.pool, capture=self.capture)

    def _call(self, static: list[torch.Tensor], names: list[str], stand_in: _Parts) -> torch.Tensor:
        with swapped_blocks(self.owner, self.blocks, stand_in):
            return self.forward(*unflat_inputs(static, names))

    def _head(self, names: list[str]) -> Callable:
        blocks = self.block_calls

        def run(static: list[torch.Tensor]) -> tuple:
            seen = {}

            def first(hidden, *args, **kwargs):
                seen["in"] = hidden
                for block in front_of(blocks, self.front):
                    hidden = block(hidden, *args, **kwargs)
                seen["out"] = hidden
                return hidden
            out = self._call(static, names, _Parts(first))
            return out, seen["in"], seen["out"]
        return run

    def _rest(self, names: list[str]) -> Callable:
        blocks = self.block_calls

        def run(static: list[torch.Tensor]) -> tuple:
            *inputs, first_out = static
            seen = {}

            def rest(hidden, *args, **kwargs):
                for block in middle(blocks, self.front, self.back):
                    hidden = block(hidden, *args, **kwargs)
                seen["out"] = hidden
                return hidden
            out = self._call(inputs, names, _Parts(lambda hidden, *args, **kwargs: first_out, rest,
                                                   *back_of(blocks, self.back)))
            return out, seen["out"]
        return run

    def _tail(self, names: list[str]) -> Callable:
        back = back_of(self.block_calls, self.back)

        def run(static: list[torch.Tensor]) -> tuple:
            *inputs, hidden_after = static
            return (self._call(inputs, names, _Parts(lambda hidden, *args, **kwargs: hidden_after, *back)),)
        return run

