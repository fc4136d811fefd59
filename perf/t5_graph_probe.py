"""Does a CUDA graph of the eager T5 encoder pay, and can it be captured? (GPU; issue 22's TTFS)

    python perf/t5_graph_probe.py --out FILE [--iters 20] [--encoder t5|umt5] [--rows 1,2,4,8] [--tokens 32,128,300]

Full-size T5-v1.1-XXL encoder (PixArt-Sigma's; `--encoder umt5`: Wan's UMT5-XXL), random weights,
bf16, built directly on the GPU.
For each (rows, tokens) the text_encoder stage meets (tokens: text_padding.LENGTHS and the full
300): the eager forward's median ms, the same forward replayed from a CUDA graph captured over
static buffers, the largest difference between the two outputs, and for a batch padded to the
next row bucket the largest difference of its real rows against the unpadded eager run.
Writes FILE (JSON) after every row, so that a cut run still reports.
`--served` checks the served path instead: the stage's own `accel.GraphedEncoder`, warmed as the
text_encoder stage warms it (row buckets up to the largest of --rows, each length of --tokens),
called through the encoder as the pipeline calls it; per (rows, tokens) whether the graph took
the call, its median ms against eager's, and its largest difference from eager (0: to the bit).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "backends")]
from build_full_size_random import T5_CONFIG, UMT5_CONFIG, build_context  # noqa: E402
from ditserve.accel import BucketGraph, graph_encoder  # noqa: E402

from accel_probe import timed  # noqa: E402  (perf/ is this script's own folder)


def inputs(rows: int, tokens: int, real: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids with `real` tokens per row, right-padded to `tokens` (as the tokenizer pads)."""
    gen = torch.Generator().manual_seed(rows * 1000 + tokens)
    ids = torch.randint(2, 32000, (rows, tokens), generator=gen)
    mask = torch.zeros(rows, tokens, dtype=torch.long)
    mask[:, :real] = 1
    ids[mask == 0] = 0
    return ids.to(device), mask.to(device)


def capture(forward, ids: torch.Tensor, mask: torch.Tensor):
    """`forward(ids, mask)` replayed from one CUDA graph over static buffers (the served
    `accel.BucketGraph`: fewer rows than captured are padded by repeating the last)."""
    graph = BucketGraph(lambda static: forward(*static), [ids, mask], pool=None)
    return lambda new_ids, new_mask: graph([new_ids, new_mask])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--encoder", choices=("t5", "umt5"), default="t5")
    parser.add_argument("--rows", default="1,2,4,8", help="comma-separated row counts")
    parser.add_argument("--tokens", default="32,128,300", help="comma-separated token lengths (the last is full)")
    parser.add_argument("--served", action="store_true", help="check accel.GraphedEncoder (the served path)")
    args = parser.parse_args()
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel
    config, model = (T5Config(**T5_CONFIG), T5EncoderModel) if args.encoder == "t5" else \
        (UMT5Config(**UMT5_CONFIG), UMT5EncoderModel)
    all_rows = [int(n) for n in args.rows.split(",")]
    all_tokens = [int(n) for n in args.tokens.split(",")]
    device = torch.device("cuda")
    torch.manual_seed(0)
    start = time.perf_counter()
    with build_context(device, torch.bfloat16):
        encoder = model(config).eval()
    report = {"command": " ".join(sys.argv), "encoder": args.encoder, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "attn_implementation": getattr(encoder.config, "_attn_implementation", None),
              "build_s": round(time.perf_counter() - start, 1), "rows": []}

    if args.served:
        served(encoder, all_rows, all_tokens, device, args, report)
        return

    def forward(ids, mask):
        return encoder(ids, attention_mask=mask)[0]

    from transformers.masking_utils import create_bidirectional_mask

    def forward_4d(ids, mask):
        """The mask expanded by transformers' own function, without its all-ones check (a host
        sync, which a capture cannot hold); a 4D mask passes through the encoder as it is."""
        meta = torch.empty(*ids.shape, 1, dtype=encoder.dtype, device=ids.device)
        full = create_bidirectional_mask(encoder.config, meta, mask, allow_is_bidirectional_skip=False)
        return encoder(ids, attention_mask=full)[0]

    with torch.inference_mode():
        for tokens in all_tokens:
            for rows in all_rows:
                row = {"rows": rows, "tokens": tokens}
                ids, mask = inputs(rows, tokens, real=min(tokens, 20), device=device)
                eager_out = forward(ids, mask).clone()
                row["eager_ms"] = timed(lambda: forward(ids, mask), args.iters)
                row["eager_4d_vs_eager_max_abs"] = float((forward_4d(ids, mask) - eager_out).abs().max())
                # the plain forward is captured only once, last: a failed capture may spoil the rest
                last = tokens == all_tokens[-1] and rows == all_rows[-1]
                for name, fn in (("graph_4d", forward_4d), *((("graph", forward),) if last else ())):
                    try:
                        replay = capture(fn, ids, mask)
                        row[f"{name}_ms"] = timed(lambda: replay(ids, mask), args.iters)
                        row[f"{name}_vs_eager_max_abs"] = float((replay(ids, mask) - eager_out).abs().max())
                        if rows > 1:   # rows - 1 real rows padded to `rows` by repeating the last
                            few_ids, few_mask = ids[:rows - 1], mask[:rows - 1]
                            few_eager = forward(few_ids, few_mask)
                            padded = replay(few_ids, few_mask)   # padded to the captured rows by the graph
                            row[f"{name}_padded_vs_eager_max_abs"] = float((padded - few_eager).abs().max())
                    except Exception as exc:   # what stops a capture is the finding
                        row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:600]
                        row[f"{name}_trace"] = traceback.format_exc()[-1500:]
                        torch.cuda.synchronize()
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps(report, indent=2) + "\n")


def served(encoder, all_rows: list[int], all_tokens: list[int], device: torch.device, args, report: dict) -> None:
    """The text_encoder stage's path: graph_encoder in front of the forward, warmed, then called."""
    runner = graph_encoder(encoder, device)
    start = time.perf_counter()
    with torch.inference_mode():
        with runner.warming():
            for rows in runner.warm_rows(max(all_rows)):
                for tokens in all_tokens:
                    encoder(*inputs(rows, tokens, real=min(tokens, 20), device=device))
        torch.cuda.synchronize()
        report["warm_s"] = round(time.perf_counter() - start, 1)
        report["graphs"] = sorted(runner.graphs)
        for tokens in all_tokens:
            for rows in all_rows:
                ids, mask = inputs(rows, tokens, real=min(tokens, 20), device=device)
                eager_out = runner.eager(ids, attention_mask=mask)[0].clone()
                before = dict(runner.calls)
                out = encoder(ids, attention_mask=mask)[0]
                row = {"rows": rows, "tokens": tokens, "graph_took_it": runner.calls["compiled"] > before["compiled"],
                       "served_vs_eager_max_abs": float((out - eager_out).abs().max()),
                       "eager_ms": timed(lambda: runner.eager(ids, attention_mask=mask), args.iters),
                       "served_ms": timed(lambda: encoder(ids, attention_mask=mask), args.iters)}
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
