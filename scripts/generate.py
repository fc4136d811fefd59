#!/usr/bin/env python
"""Generate one image through a running server and write it as PNG, with a progress bar.

    python scripts/generate.py "a red cat on a sofa" --seed 1 --output cat.png
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from PIL import Image
from tqdm import tqdm
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from ditserve.client import PROTOCOLS, DitClient, GenerationRequest  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt")
    p.add_argument("--negative-prompt")
    p.add_argument("--height", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--steps", type=int, dest="num_inference_steps")
    p.add_argument("--guidance", type=float, dest="guidance_scale")
    p.add_argument("--seed", type=int)
    p.add_argument("--output", default="outputs/image.png", help="PNG path (default: %(default)s)")
    p.add_argument("--url", help="server address (default 127.0.0.1:8001 for gRPC, :8000 for HTTP)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="grpc-stream",
                   help="grpc-stream shows per-step progress (default); grpc/http call the unary model")
    p.add_argument("--shm", choices=("system", "cuda"),
                   help="receive the image in a shared-memory region (needs --height and --width)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    args = p.parse_args(argv)

    url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")
    request = GenerationRequest(args.prompt, args.negative_prompt, args.height, args.width,
                                args.num_inference_steps, args.guidance_scale, args.seed)
    bar = tqdm(desc="denoising", unit="step", disable=args.protocol != "grpc-stream")

    def on_progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    start = time.monotonic()
    try:
        with DitClient(url, args.protocol, shm=args.shm) as client:
            result = client.generate(request, on_progress, timeout_s=args.timeout)
    except InferenceServerException as exc:
        print(f"error: the server rejected the request: {exc.message()}", file=sys.stderr)
        return 1
    except ValueError as exc:  # e.g. --shm without --height/--width
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # connection refused, timeout: say what to check
        print(f"error: could not reach the server at {url} ({exc}); is `python scripts/serve.py` running?",
              file=sys.stderr)
        return 2
    finally:
        bar.close()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(result.image).save(out)
    print(f"wrote {out} ({result.image.shape[1]}x{result.image.shape[0]}, seed {result.seed}) "
          f"in {time.monotonic() - start:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
