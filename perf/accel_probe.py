"""Which acceleration pays, component by component, on full-size PixArt-Sigma (GPU; issue 23).

    python perf/accel_probe.py --model models/pixart-sigma-1024-random --out FILE [--deadline-s 420]

In one process, each measurement against eager in the same run (median ms of `--iters`
synchronised calls), written to FILE after every row so that a cut run still reports:
  pipeline       eager diffusers' pieces per request: text encode, one transformer forward
                 (CFG, 2 rows), one scheduler.step, VAE decode, at 512 and 1024
  forward        the transformer at (size, rows): eager; eager kernels in a CUDA graph;
                 torch.compile with static shapes; that in a CUDA graph; torch.compile mode
                 reduce-overhead with a dynamic batch dim (what [accel] cuda_graphs did on
                 2026-12-01); FP8 (ditserve/fp8.py) eager, compiled and compiled in a graph
                 (`--only forward1024x2,compile1024x2,fp8_1024x2,forward1024x8,compile1024x8,fp8_1024x8`
                 for the bf16-vs-FP8 rows alone, ~4 min)
  attn           the forward in a CUDA graph with each SDPA backend first (flash, efficient,
                 cudnn), and one block's bare self-/cross-attention per backend
                 (`--only forward1024x2,attn1024x2,forward1024x8,attn1024x8`, ~1 min);
                 compile_cudnn: compiled and graphed with cuDNN attention first
  vae / text     the VAE decode and the T5 encoder, eager vs compiled
Rows run in priority order and stop at the deadline (compiles take 10-70 s each).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))


def timed(fn: Callable, iters: int, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(out), 3)


def graphed(fn: Callable, inputs: list[torch.Tensor]) -> Callable:
    """`fn(*inputs)` replayed from a CUDA graph, captured as dit captures its buckets
    (ditserve.accel.BucketGraph: one run outside the capture first; each replay clones the output)."""
    from ditserve.accel import BucketGraph
    graph = BucketGraph(lambda static: fn(*static), inputs, pool=None)
    return lambda: graph(inputs)


def compiled_and_graphed(fn: Callable, x: list[torch.Tensor], reference: torch.Tensor, base_ms: float,
                        iters: int) -> dict:
    """First call (the compile) time, then `fn` timed plain and in a CUDA graph, against eager."""
    with torch.no_grad():
        t0 = time.monotonic()
        fn(*x)
        torch.cuda.synchronize()
        compile_s = round(time.monotonic() - t0, 1)
        ms = timed(lambda: fn(*x), iters)
        replay = graphed(fn, x)
        graph_ms = timed(replay, iters)
        err = rel_rms(replay(), reference)
    return {"compile_s": compile_s, "eager_ms": base_ms, "compiled_ms": ms, "compiled_graph_ms": graph_ms,
            "compiled_speedup": round(base_ms / ms, 3), "compiled_graph_speedup": round(base_ms / graph_ms, 3),
            "rel_rms": err}


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return round(((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item(), 5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=420)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated row names to run (default: all)")
    args = ap.parse_args()
    start = time.monotonic()
    from diffusers import PixArtSigmaPipeline
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 64
    pipe = PixArtSigmaPipeline.from_pretrained(args.model, torch_dtype=torch.bfloat16).to("cuda")
    transformer = pipe.transformer
    report = {"command": " ".join(sys.argv), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "rows": []}
    out = Path(args.out)

    def record(**row) -> None:
        row["t_s"] = round(time.monotonic() - start, 1)
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(report, indent=2) + "\n")

    def inputs(size: int, rows: int) -> list[torch.Tensor]:
        g = torch.Generator("cuda").manual_seed(0)
        lat = torch.randn(rows, 4, size // 8, size // 8, device="cuda", dtype=torch.bfloat16, generator=g)
        emb = torch.randn(rows, 300, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
        mask = torch.ones(rows, 300, device="cuda", dtype=torch.int64)
        mask[:, 20:] = 0
        t = torch.full((rows,), 500.0, device="cuda")
        return [lat, emb, mask, t]

    def forward(lat, emb, mask, t):
        return transformer(lat, encoder_hidden_states=emb, encoder_attention_mask=mask, timestep=t,
                           added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)[0]

    def left() -> float:
        return args.deadline_s - (time.monotonic() - start)

    only = set(filter(None, args.only.split(",")))

    def wanted(name: str, need_s: float) -> bool:
        if only and name not in only:
            return False
        if left() < need_s:
            record(name=name, skipped=f"deadline: {left():.0f} s left, needs ~{need_s:.0f} s")
            return False
        return True

    # 1. eager pieces of one request, as the pipeline runs them
    with torch.no_grad():
        for size in (512, 1024):
            if not wanted(f"pipeline{size}", 20):
                continue
            enc = timed(lambda: pipe.encode_prompt(["a red fox in the snow"], do_classifier_free_guidance=True,
                                                   device="cuda", clean_caption=False, max_sequence_length=300),
                        args.iters)
            x = inputs(size, 2)
            fwd = timed(lambda: forward(*x), args.iters)
            sched = pipe.scheduler.__class__.from_config(pipe.scheduler.config)
            sched.set_timesteps(20, device="cuda")
            lat, model_out = x[0][:1].clone(), x[0][:1].clone()

            def one_step():
                s = sched.__class__.from_config(sched.config)
                s.set_timesteps(20, device="cuda")
                for k in range(3):
                    s.step(model_out, s.timesteps[k], lat, return_dict=False)
            step3 = timed(one_step, args.iters)
            latents = torch.randn(1, 4, size // 8, size // 8, device="cuda", dtype=torch.bfloat16)
            dec = timed(lambda: pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0],
                        args.iters)
            record(name=f"pipeline{size}", encode_ms=enc, forward_2rows_ms=fwd, scheduler_3steps_ms=step3,
                   vae_decode_ms=dec, estimate_20_steps_ms=round(enc + 20 * fwd + dec, 1))

    # 2. the transformer forward, eager and eager-in-a-graph (capture takes ~1 s)
    shapes = [(512, 2), (1024, 2), (512, 16), (1024, 8)]
    eager_ms, references = {}, {}
    with torch.no_grad():
        for size, rows in shapes:
            if not wanted(f"forward{size}x{rows}", 10):
                continue
            x = inputs(size, rows)
            references[(size, rows)] = forward(*x).clone()
            eager_ms[(size, rows)] = timed(lambda: forward(*x), args.iters)
            replay = graphed(forward, x)
            graph_ms = timed(replay, args.iters)
            record(name=f"forward{size}x{rows}", eager_ms=eager_ms[(size, rows)], eager_graph_ms=graph_ms,
                   eager_graph_speedup=round(eager_ms[(size, rows)] / graph_ms, 3),
                   eager_graph_rel_rms=rel_rms(replay(), references[(size, rows)]))

    # 2b. which scaled-dot-product-attention kernel: each backend first in torch's priority order
    #     (the others behind it, so a call it cannot take still runs), the forward in a CUDA graph;
    #     plus the bare self- and cross-attention calls of one block with that backend alone.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}
    heads, head_dim = transformer.config.num_attention_heads, transformer.config.attention_head_dim

    def first(backend: SDPBackend) -> list[SDPBackend]:
        """`backend` first, the others behind it (cuDNN first: ditserve.accel.prefer_attention's order)."""
        return [backend] + [b for b in backends.values() if b != backend] + [SDPBackend.MATH]
    for size, rows in [(1024, 2), (1024, 8), (512, 16)]:
        name = f"attn{size}x{rows}"
        if (size, rows) not in eager_ms or not wanted(name, 20):
            continue
        x = inputs(size, rows)
        tokens = (size // 16) ** 2
        g = torch.Generator("cuda").manual_seed(1)
        q = torch.randn(rows, heads, tokens, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
        kv = torch.randn(rows, heads, 300, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
        bias = torch.zeros(rows, heads, 1, 300, device="cuda", dtype=torch.bfloat16)
        bias[..., 20:] = -10000.0
        sdpa = torch.nn.functional.scaled_dot_product_attention
        row = {"name": name, "tokens": tokens, "heads": heads, "head_dim": head_dim}
        for label, backend in backends.items():
            with torch.no_grad():
                for kind, call in (("self", lambda: sdpa(q, q, q)), ("cross", lambda: sdpa(q, kv, kv, attn_mask=bias))):
                    try:
                        with sdpa_kernel([backend]):
                            row[f"{label}_{kind}_ms"] = timed(call, args.iters)
                    except RuntimeError as exc:
                        row[f"{label}_{kind}_ms"] = f"unsupported: {str(exc).splitlines()[0][:120]}"
                with sdpa_kernel(first(backend), set_priority=True):
                    replay = graphed(forward, x)
                    row[f"{label}_forward_graph_ms"] = timed(replay, args.iters)
                    row[f"{label}_rel_rms"] = rel_rms(replay(), references[(size, rows)])
                del replay
        record(**row)

    # 3. compiled with static shapes (one compile per shape), then that in a CUDA graph
    compiled = torch.compile(forward, dynamic=False)
    for size, rows in [(1024, 2), (512, 2), (512, 16), (1024, 8)]:
        name = f"compile{size}x{rows}"
        if (size, rows) not in eager_ms or not wanted(name, 90):
            continue
        record(name=name, **compiled_and_graphed(compiled, inputs(size, rows), references[(size, rows)],
                                                 eager_ms[(size, rows)], args.iters))

    # 3b. compiled and graphed with cuDNN attention first: the SDPA kernel is chosen while dynamo
    #     traces, so dynamo is reset, the AOT-autograd cache is off (a cuDNN compile hit the flash
    #     entry of section 3 on 2026-12-02) and the compile runs inside the priority context.
    for size, rows in [(1024, 2), (1024, 8)]:
        name = f"compile_cudnn{size}x{rows}"
        if (size, rows) not in eager_ms or not wanted(name, 90):
            continue
        torch._dynamo.reset()
        torch._functorch.config.enable_autograd_cache = False   # its key leaves out the SDPA choice
        with sdpa_kernel(first(SDPBackend.CUDNN_ATTENTION), set_priority=True):
            record(name=name, **compiled_and_graphed(torch.compile(forward, dynamic=False), inputs(size, rows),
                                                     references[(size, rows)], eager_ms[(size, rows)], args.iters))

    # 4. the VAE decode compiled (static), at both sizes
    decode = torch.compile(lambda z: pipe.vae.decode(z, return_dict=False)[0], dynamic=False)
    for size in (1024, 512):
        if not wanted(f"vae{size}", 90):
            continue
        z = torch.randn(1, 4, size // 8, size // 8, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            eager = timed(lambda: pipe.vae.decode(z, return_dict=False)[0], 5)
            t0 = time.monotonic()
            decode(z)
            compile_s = round(time.monotonic() - t0, 1)
            fast = timed(lambda: decode(z), 5)
        record(name=f"vae{size}", compile_s=compile_s, eager_ms=eager, compiled_ms=fast,
               speedup=round(eager / fast, 3))

    # 5. what [accel] cuda_graphs did on 2026-12-01: reduce-overhead, batch dim marked dynamic
    if (1024, 2) in eager_ms and wanted("reduce_overhead_dynamic1024x2", 90):
        ro = torch.compile(forward, mode="reduce-overhead")
        x = inputs(1024, 2)

        def call():
            for t in x:
                torch._dynamo.maybe_mark_dynamic(t, 0)
            torch.compiler.cudagraph_mark_step_begin()
            return ro(*x)
        with torch.no_grad():
            t0 = time.monotonic()
            for _ in range(3):
                call()
            compile_s = round(time.monotonic() - t0, 1)
            ms = timed(call, args.iters)
        record(name="reduce_overhead_dynamic1024x2", compile_s=compile_s, eager_ms=eager_ms[(1024, 2)],
               ms=ms, speedup=round(eager_ms[(1024, 2)] / ms, 3))

    # 6. the T5 encoder compiled
    if wanted("text_encoder", 120):
        ids = torch.randint(0, 1000, (2, 300), device="cuda")
        mask = torch.ones(2, 300, device="cuda", dtype=torch.int64)
        enc = torch.compile(lambda i, m: pipe.text_encoder(i, attention_mask=m)[0], dynamic=False)
        with torch.no_grad():
            eager = timed(lambda: pipe.text_encoder(ids, attention_mask=mask)[0], 5)
            t0 = time.monotonic()
            enc(ids, mask)
            compile_s = round(time.monotonic() - t0, 1)
            fast = timed(lambda: enc(ids, mask), 5)
        record(name="text_encoder", compile_s=compile_s, eager_ms=eager, compiled_ms=fast,
               speedup=round(eager / fast, 3))

    # 7. FP8 ([accel] fp8 = true, ditserve/fp8.py: e4m3 weights and activations with per-row
    #    scales, torch._scaled_mm): eager, then compiled with static shapes and in a CUDA graph.
    #    Last, because it replaces the transformer's linear layers in place.
    from ditserve.fp8 import apply_fp8
    fp8_compiled, replaced = torch.compile(forward, dynamic=False), 0
    for size, rows in [(1024, 2), (1024, 8), (512, 16)]:
        name = f"fp8_{size}x{rows}"
        if (size, rows) not in eager_ms or not wanted(name, 120):
            continue
        replaced = replaced or apply_fp8(transformer)
        x = inputs(size, rows)
        with torch.no_grad():
            fp8_eager_ms = timed(lambda: forward(*x), args.iters)
            fp8_eager_err = rel_rms(forward(*x), references[(size, rows)])
        record(name=name, linears_fp8=replaced, fp8_eager_ms=fp8_eager_ms, fp8_eager_rel_rms=fp8_eager_err,
               **compiled_and_graphed(fp8_compiled, x, references[(size, rows)], eager_ms[(size, rows)], args.iters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
