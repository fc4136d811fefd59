"""Faster forwards: torch.compile, CUDA graphs per row bucket (the deployment's [accel]; FP8 in fp8.py).

A step batch holds 1..capacity requests of 1-2 rows each (CFG), so the transformer meets
many batch sizes. Compiling or capturing each size would stall requests, so, as LLM servers
do, a batch of n rows runs padded to the smallest *row bucket* >= n, and every bucket of
every *warm* shape (deployment `warm_sizes`) is compiled and captured while the model loads,
before Triton reports READY. A shape that was not warmed runs eager: the request path never
compiles. Padding repeats the last real row, so padded rows are finite and are dropped.

`WarmCompiled` is the one compile mechanism; `TransformerRunner` adds the buckets for dit (and,
with `cuda_graphs` or `eager_graphs`, one captured CUDA graph per bucket, `BucketGraph`), and `warm_attribute`
puts it in front of the text encoder's forward and the VAE's decode. `GraphedEncoder` replays a
T5-family text encoder's eager forward from CUDA graphs, per row bucket and token length.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .deployment import AccelSection, doublings
from .state import TextConditioning

# Enough compiled variants for every bucket and warm shape of a deployment; past dynamo's
# default limit (8) it would silently fall back to eager.
RECOMPILE_LIMIT = 64


# Process-wide settings entered once and held until the process exits.
_HELD = contextlib.ExitStack()


def configure_compiler(accel: AccelSection) -> None:
    """Process-wide compiler settings, set before the first compile."""
    cache = accel.compile_cache
    if accel.attention != "default":
        # The SDPA kernel is picked while dynamo traces, but inductor's AOT-autograd cache key
        # leaves the choice out (on the H200 a cuDNN compile hit the flash entry of an earlier
        # compile): each attention choice gets its own cache directory.
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        cache = os.path.join(cache or cache_dir(), f"attention-{accel.attention}")
    if cache:
        os.makedirs(cache, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch releases
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT))


def prefer_attention(accel: AccelSection) -> None:
    """dit's process: [accel] attention = "cudnn" puts cuDNN's fused attention first in torch's
    SDPA priority, before anything is compiled or captured; calls cuDNN cannot take (a head dim
    it lacks, a CPU tensor) fall through to flash, memory-efficient, then math."""
    if accel.attention == "default":
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
             SDPBackend.MATH]
    _HELD.enter_context(sdpa_kernel(order, set_priority=True))


def processor_calls(model: torch.nn.Module) -> set[Callable]:
    """The `__call__` functions of `model`'s attention processors' classes (processors that are
    modules are left: their `__call__` is every module's)."""
    calls = set()
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is None or isinstance(processor, torch.nn.Module):
            continue
        call = getattr(type(processor), "__call__", None)
        if inspect.isfunction(call):
            calls.add(call)
    return calls


def pin_processor_signatures(model: torch.nn.Module) -> int:
    """Compute each attention processor's call signature once; returns the `__call__`s pinned.

    diffusers' `Attention.forward` (PixArt-Sigma, SD3, Qwen-Image, the VAE; FLUX.1's own attention
    too) filters its keyword arguments by `inspect.signature(self.processor.__call__)` at every
    call: ~30 us of host time on the CPU host, 56 times per PixArt-Sigma forward, which a
    launch-bound forward pays in full. With `__signature__` set on the class's `__call__`, inspect
    returns it at once (what is left is binding it: ~12 us). The processor and its arguments are
    unchanged, so results are too, and dynamo traces it as before (no graph break; a per-instance
    stand-in broke every attention call). Process-wide per class, idempotent.
    """
    calls = processor_calls(model)
    for call in calls:
        if "__signature__" not in call.__dict__:
            call.__signature__ = inspect.signature(call)
    return len(calls)


def _tensors(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    named = [(str(i), a) for i, a in enumerate(args)] + sorted(kwargs.items())
    out = []
    for name, value in named:
        if isinstance(value, torch.Tensor):
            out.append((name, value))
        elif isinstance(value, TextConditioning):
            out += [(f"{name}.embeds", value.embeds), (f"{name}.mask", value.mask)]
            out += [(f"{name}.{k}", t) for k, t in sorted(value.extra.items())]
    return out


def signature(args: tuple, kwargs: dict) -> tuple:
    """What a compiled variant is specialised on, batch size aside: each tensor's other dims and dtype."""
    return tuple((name, tuple(t.shape[1:]), t.dtype, t.device.type) for name, t in _tensors(args, kwargs))


@dataclass
class WarmupReport:
    """What warming cost: for the load-time log line and the ditserve_accel_* gauges."""

    seconds: float = 0.0
    variants: list[str] = field(default_factory=list)
    device_bytes: int = 0   # device memory reserved by the warm-up (compiled kernels' and graphs' pools)


class Warmable:
    """A forward that compiles or captures only inside `warming` (at load), never on a request."""

    _warming = False

    @contextlib.contextmanager
    def warming(self) -> Iterator[None]:
        """Calls inside compile (or capture) their shape and mark it warm."""
        self._warming = True
        try:
            yield
        finally:
            self._warming = False


class WarmCompiled(Warmable):
    """`fn` compiled, used only for call signatures warmed at load; any other call runs `fn` eager.

    The batch dimension (dim 0 of every tensor argument) is marked dynamic so that one compile
    may serve every batch size of a shape (it does on CPU; on the H200 inductor still compiled
    each bucket apart, perf/results/2026-12-01-h200-accel.md). `use_compile=False` keeps `fn` as it
    is and only tracks the warm signatures (dit's `eager_graphs`: the runner captures `fn` itself).
    """

    def __init__(self, fn: Callable, accel: AccelSection, use_compile: bool = True):
        self.eager = fn
        self.compiles = use_compile
        if use_compile:
            configure_compiler(accel)
        self.compiled = torch.compile(fn, backend=accel.compile_backend) if use_compile else fn
        self.warm: set[tuple] = set()
        self.calls = {"compiled": 0, "eager": 0}

    def __call__(self, *args, **kwargs):
        sig = signature(args, kwargs)
        if not self._warming and sig not in self.warm:
            self.calls["eager"] += 1
            return self.eager(*args, **kwargs)
        if self.compiles:
            for _, t in _tensors(args, kwargs):
                if t.ndim:
                    torch._dynamo.maybe_mark_dynamic(t, 0)
        out = self.compiled(*args, **kwargs)
        if self._warming:
            self.warm.add(sig)
        else:
            self.calls["compiled"] += 1
        return out


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with its last row repeated up to `rows` rows (finite, like a real row)."""
    extra = rows - t.shape[0]
    return t if extra == 0 else torch.cat([t, t[-1:].expand(extra, *t.shape[1:])])


def row_bucket(buckets: list[int], rows: int) -> int | None:
    """The smallest of `buckets` (ascending) holding `rows` rows; None past the largest."""
    return next((b for b in buckets if b >= rows), None)


def flat_inputs(latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> list[torch.Tensor]:
    """A forward's inputs as the flat tensor list a graph's static buffers hold (extras by name)."""
    return [latents, timesteps, cond.embeds, cond.mask, *(cond.extra[k] for k in sorted(cond.extra))]


def unflat_inputs(tensors: list[torch.Tensor], names: list[str]) -> tuple:
    """The forward's arguments back from `flat_inputs`' list (`names`: the extras' sorted names)."""
    latents, timesteps, embeds, mask, *extra = tensors
    return latents, timesteps, TextConditioning(embeds, mask, dict(zip(names, extra)))


class BucketGraph:
    """One row bucket's forward captured in a CUDA graph, over static input buffers.

    Replaying skips everything on the host that a compiled call still does per step (dynamo's
    guards, the wrapper code, one launch per kernel): what a launch-bound step costs. A call
    copies its rows into the buffers (padding rows repeat the last real one), replays, and
    clones its rows of the output(s): the next replay overwrites them. Graphs share one memory
    pool; the largest bucket is captured first, so its pool serves the smaller ones.
    `run(static)` returns a tensor or a tuple of them; `capture=False` calls it on the buffers
    instead of replaying (a CPU device has no graphs: cache_graphs' tests).
    """

    def __init__(self, run: Callable[[list[torch.Tensor]], Any], inputs: list[torch.Tensor], pool: Any,
                 capture: bool = True):
        self.static = [t.clone() for t in inputs]
        self.run, self.graph = run, None
        if not capture:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run(self.static)   # compiled (if it compiles) and run once outside the capture
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = run(self.static)

    def __call__(self, inputs: list[torch.Tensor]) -> Any:
        rows = inputs[0].shape[0]
        for buffer, t in zip(self.static, inputs):
            buffer.copy_(pad_rows(t, buffer.shape[0]))
        if self.graph is None:
            out = self.run(self.static)
        else:
            self.graph.replay()
            out = self.out
        if isinstance(out, torch.Tensor):
            return out[:rows].clone()
        return [t[:rows].clone() for t in out]


class TransformerRunner:
    """dit's transformer forward over a step batch: eager, or compiled per row bucket, or either
    captured per row bucket (`cuda_graphs`: compiled; `eager_graphs`: diffusers' eager kernels)."""

    def __init__(self, forward: Callable, accel: AccelSection, capacity: int, device: torch.device):
        self.buckets = accel.buckets(capacity)
        self.mode = accel.transformer
        self.compiled = None if accel.transformer == "eager" else (
            WarmCompiled(forward, accel, use_compile=accel.transformer != "eager_graphs"))
        # CUDA graphs: (signature, bucket) -> its captured graph; on a CPU device the buckets run
        # compiled (cuda_graphs) or eager (eager_graphs), padded as the graphs would be.
        self.graphs: dict[tuple, BucketGraph] | None = (
            {} if accel.transformer in ("cuda_graphs", "eager_graphs") and device.type == "cuda" else None)
        self.pool = torch.cuda.graph_pool_handle() if self.graphs is not None else None
        self.eager = forward
        self._warming = False
        self.eager_only = False   # inside `eager_forwards`
        self._notes: list[str] = []
        self._eager_calls = 0
        self._graph_calls = 0
        self.warm_seconds: dict[int, float] = {}   # bucket -> seconds its last warm-up took

    def __call__(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: TextConditioning) -> torch.Tensor:
        rows, sig = latents.shape[0], signature((latents, timesteps, cond), {})
        bucket = row_bucket(self.buckets, rows)
        warm = self.compiled is not None and sig in self.compiled.warm
        if bucket is None or self.eager_only or not (warm or self._warming):
            self._eager_calls += 1
            return self.eager(latents, timesteps, cond)
        # Warming compiles and captures every bucket (the largest first: its memory pool then
        # serves the smaller graphs); serving runs the one bucket that fits.
        names, inputs = sorted(cond.extra), flat_inputs(latents, timesteps, cond)
        if self.graphs is not None and not self._warming:
            self._graph_calls += 1
            return self.graphs[(sig, bucket)](inputs)
        for size in (reversed([b for b in self.buckets if b >= rows]) if self._warming else [bucket]):
            start = time.monotonic()
            padded = [pad_rows(t, size) for t in inputs]
            if self.graphs is not None:   # warming: compile (unless eager_graphs), then capture this bucket
                run = lambda static, names=names: self.compiled(*unflat_inputs(static, names))  # noqa: E731
                try:
                    self.graphs[(sig, size)] = BucketGraph(run, padded, self.pool)
                except RuntimeError as exc:   # e.g. a host-device copy inside the forward: not capturable
                    what = "compiling and capturing" if self.compiled.compiles else "capturing"
                    raise RuntimeError(f"deployment [accel] transformer = \"{self.mode}\": {what} the forward of "
                                       f"{size} rows in a CUDA graph failed ({type(exc).__name__}: {exc}); serve "
                                       "this model with transformer = \"compile\" or \"eager\"") from exc
                out = self.graphs[(sig, size)](inputs)
            else:
                out = self.compiled(*unflat_inputs(padded, names))[:rows]
            if self._warming:   # where warm-up time goes, per bucket
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.warm_seconds[size] = round(time.monotonic() - start, 1)
        return out

    @contextlib.contextmanager
    def warming(self, report: WarmupReport, variant: str) -> Iterator[None]:
        """Forwards inside compile and capture every bucket from their row count up."""
        if self.compiled is None:
            yield
            return
        self._warming = True
        try:
            with _measure(report), self.compiled.warming():
                yield
        finally:
            self._warming = False
            buckets = ", ".join(f"{b} rows {s} s" for b, s in self.warm_seconds.items())
            report.variants.append(f"{variant} ({buckets})")
            report.variants += self._notes
            self._notes = []

    @contextlib.contextmanager
    def eager_forwards(self) -> Iterator[None]:
        """Forwards inside run diffusers' eager kernels, unpadded, never a captured graph: a
        forward beside a replay of the graphs (engine.StepEngine.overtake) must not share their
        static buffers and memory pool. With `eager_graphs` the result is the graphs' own."""
        self.eager_only = True
        try:
            yield
        finally:
            self.eager_only = False

    def count_eager(self) -> None:
        """One forward that ran eager outside the runner: a batch holding a lossy quality tier
        (the adapter's cached forward)."""
        self._eager_calls += 1

    def count_graph(self) -> None:
        """One forward replayed from graphs outside the runner (cache_graphs.CachedGraphs)."""
        self._graph_calls += 1

    @property
    def is_warming(self) -> bool:
        """Inside `warming`: forwards compile and capture."""
        return self._warming

    def note(self, line: str) -> None:
        """A line for the warm-up report of the current `warming` (the load-time log)."""
        self._notes.append(line)

    @property
    def calls(self) -> dict[str, int]:
        """Forwards run so far by path (warm-up excluded)."""
        compiled = self.compiled.calls["compiled"] if self.compiled is not None else 0
        return {"compiled": compiled + self._graph_calls, "eager": self._eager_calls}


@contextlib.contextmanager
def _measure(report: WarmupReport) -> Iterator[None]:
    cuda = torch.cuda.is_available()
    before = torch.cuda.memory_reserved() if cuda else 0
    start = time.monotonic()
    yield
    if cuda:
        torch.cuda.synchronize()
    report.seconds += time.monotonic() - start
    report.device_bytes += (torch.cuda.memory_reserved() - before) if cuda else 0


# The largest text batch (row bucket x tokens) GraphedEncoder captures.
GRAPH_TOKENS = 1024


class GraphedEncoder(Warmable):
    """A T5-family text encoder's eager forward replayed from CUDA graphs ([accel] text_encoder =
    "cuda_graphs"), one per row bucket and token length, captured at load.

    At a prompt's length the encoder is launch-bound: on the H200 full-size T5-XXL over one
    32-token row takes 24 ms eager and 6 ms replayed (perf/results/2026-12-04-h200-t5-graph-probe.md),
    and that encode is part of every request's time to first step. Nothing is compiled, so the
    whole warm-up takes seconds. The 2D mask is expanded by transformers' own function without
    its all-ones shortcut (a host sync, which a capture cannot hold) into the values the encoder
    would build itself: a replay equals the eager forward at the same rows to the bit. A batch is
    padded to its row bucket as dit's is (its real rows may then differ from an unpadded run in
    bf16 rounding, as dynamic batching's batches already do). Only batches of up to
    GRAPH_TOKENS tokens (row bucket x length) are captured: past that the encoder is
    compute-bound (8 x 128 tokens: 27 ms replayed, 30 eager; 4 x 300: 41 and 44) and a graph's
    memory pool grows to gigabytes (5.3 GiB with 32 x 300), so those run eager, as do calls of
    another form and lengths not warmed. On a CPU device the buffers are run instead of a
    graph: the same path without the capture (the tests').
    """

    def __init__(self, encoder: torch.nn.Module, device: torch.device):
        try:
            from transformers.masking_utils import create_bidirectional_mask
        except ImportError as exc:
            raise ValueError("deployment [accel] text_encoder = \"cuda_graphs\" needs transformers >= 4.53 "
                             f"(transformers.masking_utils): {exc}; upgrade it or use \"compile\"") from exc
        self.expand_mask = create_bidirectional_mask
        self.encoder, self.eager = encoder, encoder.forward
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[tuple[int, int], BucketGraph] = {}   # (row bucket, tokens) -> graph
        self.buckets: tuple[int, ...] = ()
        self.calls = {"compiled": 0, "eager": 0}

    def warm_rows(self, max_rows: int) -> list[int]:
        """Set the row buckets (powers of two up to `max_rows`, the most rows an execute encodes)
        and return them largest first, the order to warm them in (its pool then serves the rest)."""
        self.buckets = doublings(1, max_rows)
        return list(self.buckets[::-1])

    def __call__(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 *args, **kwargs):
        from transformers.modeling_outputs import BaseModelOutput
        key = None   # (row bucket, tokens) of a call a graph can take
        if not args and not kwargs and input_ids is not None and attention_mask is not None \
                and attention_mask.ndim == 2:
            rows, tokens = input_ids.shape
            bucket = row_bucket(self.buckets, rows)
            if bucket is not None and bucket * tokens <= GRAPH_TOKENS:
                key = (bucket, tokens)
        if self._warming and key is not None and key not in self.graphs:
            padded = [pad_rows(input_ids, key[0]), pad_rows(attention_mask, key[0])]
            self.graphs[key] = BucketGraph(self._run, padded, self.pool, capture=self.pool is not None)
        if not self._warming:
            self.calls["compiled" if key in self.graphs else "eager"] += 1
        if key not in self.graphs:
            return self.eager(input_ids, attention_mask, *args, **kwargs)
        return BaseModelOutput(last_hidden_state=self.graphs[key]([input_ids, attention_mask]))

    def _run(self, static: list[torch.Tensor]) -> torch.Tensor:
        ids, mask = static
        meta = torch.empty(*ids.shape, 1, dtype=self.encoder.dtype, device=ids.device)  # shape, dtype, device only
        full = self.expand_mask(self.encoder.config, meta, mask, allow_is_bidirectional_skip=False)
        return self.eager(ids, attention_mask=full)[0]


def graph_encoder(encoder: torch.nn.Module, device: torch.device) -> GraphedEncoder:
    """Put a GraphedEncoder in front of `encoder`'s forward (before TrimPadding goes in front of it)."""
    runner = GraphedEncoder(encoder, device)
    encoder.forward = runner
    return runner


def warm_attribute(owner: Any, name: str, accel: AccelSection) -> WarmCompiled:
    """Put a WarmCompiled in front of `owner.name` (the text encoder's forward, the VAE's decode)."""
    runner = WarmCompiled(getattr(owner, name), accel)
    setattr(owner, name, runner)
    return runner


@contextlib.contextmanager
def warming(runner: WarmCompiled | GraphedEncoder | None, report: WarmupReport, variant: str) -> Iterator[None]:
    """Inside, calls through `runner` are compiled and marked warm; a no-op without a runner."""
    if runner is None:
        yield
        return
    report.variants.append(variant)
    with _measure(report), runner.warming():
        yield
