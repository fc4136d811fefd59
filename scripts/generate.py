#!/usr/bin/env python
"""Generate one image or video through a running server and write it, with a progress bar.

    python scripts/generate.py "a red cat on a sofa" --seed 1 --output cat.png
    python scripts/generate.py "waves at dusk" --task txt2vid --frames 17 --output waves.mp4
    python scripts/generate.py "the cat turns its head" --task img2vid --image cat.png --output cat.mp4
    python scripts/generate.py "a red cat" --pipeline flux --output cat.png   # a server of several pipelines

Images are written as PNG. Videos are written as the server's MP4 (H.264) when --output
ends in .mp4, else as the raw uint8 frames [F, H, W, 3] in a .npy file. Ctrl-C cancels the
generation on the server (by its request id, through the `cancel` model) and exits with 130.
"""
from __future__ import annotations

import _thread
import argparse
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np

from PIL import Image
from tqdm import tqdm
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from ditserve.client import MEDIA_OUTPUT, PROTOCOLS, DitClient, GenerationRequest  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt")
    p.add_argument("--task", choices=sorted(MEDIA_OUTPUT), default="txt2img",
                   help="what the server's deployment makes (default: %(default)s)")
    p.add_argument("--pipeline", help="on a repository of several deployments: the pipeline to call "
                                       "(its models are PIPELINE_<task>; see docs/pipelines.md)")
    p.add_argument("--frames", type=int, dest="num_frames", help="txt2vid/img2vid: number of frames (4k+1)")
    p.add_argument("--fps", type=int, help="txt2vid/img2vid: frame rate of the MP4")
    p.add_argument("--image", type=Path, help="img2vid: the conditioning image (any format PIL reads)")
    p.add_argument("--negative-prompt")
    p.add_argument("--height", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--steps", type=int, dest="num_inference_steps")
    p.add_argument("--guidance", type=float, dest="guidance_scale")
    p.add_argument("--guidance-2", type=float, dest="guidance_scale_2",
                   help="Wan2.2 A14B (family wan22-t2v): the low-noise expert's guidance scale (default: --guidance)")
    p.add_argument("--seed", type=int)
    p.add_argument("--quality", help="cache tier: lossless (default) or one the deployment's [cache] enables")
    p.add_argument("--output", help="PNG for images; .mp4 or .npy for videos "
                                     "(default: outputs/image.png or outputs/video.mp4)")
    p.add_argument("--url", help="server address (default 127.0.0.1:8001 for gRPC, :8000 for HTTP)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="grpc-stream",
                   help="grpc-stream shows per-step progress (default); grpc/http call the unary model")
    p.add_argument("--shm", choices=("system", "cuda"),
                   help="receive the media in a shared-memory region (needs --height, --width and, for video, "
                        "--frames)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    args = p.parse_args(argv)

    video = args.task != "txt2img"
    out = Path(args.output or ("outputs/video.mp4" if video else "outputs/image.png"))
    if not video and (args.num_frames or args.fps):
        p.error("--frames and --fps are for video tasks (--task txt2vid or img2vid)")
    if (args.task == "img2vid") != (args.image is not None):
        p.error("--image is needed by --task img2vid, and only by it")
    image = np.asarray(Image.open(args.image).convert("RGB")) if args.image else None
    url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")
    request = GenerationRequest(args.prompt, args.negative_prompt, args.height, args.width,
                                args.num_inference_steps, args.guidance_scale, args.seed, args.num_frames, args.fps,
                                "mp4" if video and out.suffix == ".mp4" else None, image, args.quality,
                                args.guidance_scale_2)
    bar = tqdm(desc="denoising", unit="step", disable=args.protocol != "grpc-stream")

    def on_progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    request_id = uuid.uuid4().hex
    interrupted = []

    def cancel() -> None:
        try:
            with DitClient(url, "http" if args.protocol == "http" else "grpc", task=args.task,
                           pipeline=args.pipeline) as canceller:
                canceller.cancel(request_id)
        except Exception as exc:   # e.g. a repository rendered without the `cancel` model
            print(f"could not cancel it on the server ({exc}); it may run on there", file=sys.stderr)
            _thread.interrupt_main()   # stop waiting for it

    def cancel_on_interrupt(signum, frame) -> None:
        """Ctrl-C: cancel on the server; the generation's call then ends with its CANCELLED error.
        From a thread of its own: the HTTP client's event loop, where a handler may run, cannot block."""
        signal.signal(signal.SIGINT, signal.default_int_handler)   # a second Ctrl-C stops waiting
        interrupted.append(True)
        print("\ninterrupted: cancelling the generation on the server (Ctrl-C again to stop waiting)",
              file=sys.stderr, flush=True)
        threading.Thread(target=cancel, daemon=True).start()

    start = time.monotonic()
    signal.signal(signal.SIGINT, cancel_on_interrupt)
    try:
        with DitClient(url, args.protocol, task=args.task, shm=args.shm, pipeline=args.pipeline) as client:
            result = client.generate(request, on_progress, timeout_s=args.timeout, request_id=request_id)
    except InferenceServerException as exc:
        if interrupted and exc.message() == "request cancelled":
            print("cancelled on the server", file=sys.stderr)
            return 130
        print(f"error: the server rejected the request: {exc.message()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopped waiting", file=sys.stderr)
        return 130
    except ValueError as exc:  # e.g. --shm without --height/--width/--frames
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # connection refused, timeout: say what to check
        print(f"error: could not reach the server at {url} ({exc}); is `python scripts/serve.py` running?",
              file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        bar.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    if result.video_mp4 is not None:
        out.write_bytes(result.video_mp4)
    elif video:
        np.save(out, result.media)
    else:
        Image.fromarray(result.media).save(out)
    *frames, height, width, _ = result.media.shape
    what = f"{frames[0]} frames of " if frames else ""
    print(f"wrote {out} ({what}{width}x{height}, seed {result.seed}, {result.cache_hits} cached steps) in {time.monotonic() - start:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
