"""Served with [accel] vs plain eager diffusers, in one run: issue 23's targets, one row per call.

    python perf/accel_bench.py --deployment configs/pixart-sigma-1024-random.toml --size 512x512 \
        --steps 20 --capacity 16 --raw-batches 8,16 --accel transformer=cuda_graphs --name pixart512 --out DIR

1. Raw: perf/raw_diffusers_baseline.py on the deployment's model (eager diffusers, same seed,
   size, steps, guidance): serial p50, and generations/s at each of `--raw-batches` (the best counts); it
   saves its seed-1 media as the PSNR reference.
2. Served: a variant of the deployment (written by deployment.write_variant: [engine] step mode
   with `--capacity`, [accel] from `--accel key=value ...`, warm_sizes = the size), rendered and
   started on tritonserver. Recorded: seconds to READY (the warm-up included), the first
   request after READY (after one rejected request that warms this client process, not the
   server), `--solo` more solo requests (p50), PSNR of the seed-1 media against raw's, then
   `--concurrency` closed-loop clients for `--per-client` requests each (generations/s), and
   the dit/txt2img_stream metrics (compiled vs eager forwards, warm-up seconds and device
   memory per model, step time).
3. Cache tiers (issue 20), with `--tiers lossless,fast,...` and the variant's [cache] thresholds from
   `--cache-tiers fast=0.07 ...`: after the lossless measurements above, each lossy tier on the same
   server: `--solo` solo requests (p50) and the closed loop again, with the steps each request
   reused (`cache_hits`) and the PSNR of its seed-1 media against the served lossless one. Ratios:
   the tier's throughput and solo p50 against lossless's.
4. Front end (images, `--frontend`): `python -m frontend` (the OpenAI-compatible HTTP API, its own
   process) on the same server, `--solo` requests of seed 1 through POST /v1/images/generations
   (b64_json) in PNG and in JPEG: their p50 against the direct client's, and the file against the
   image the direct client got (PNG: equal; JPEG: PSNR).
Writes DIR/accel_<name>.json; the rows of perf/results/<date>-h200-accel.json are taken from these files.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import math
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf"), str(ROOT)]   # ROOT: frontend/ (--frontend)

from ditserve.client import DitClient, GenerationRequest  # noqa: E402
from ditserve.deployment import LOSSLESS, load_deployment, parse_accel_overrides, write_variant  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from frontend.launcher import FrontendProcess  # noqa: E402
import loadgen  # noqa: E402

PROMPT = "a red fox sitting in the snow, watercolor"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def parse_tiers(items: list[str]) -> dict:
    """`fast=0.07 balanced=0.05` -> {"fast": 0.07, "balanced": 0.05} ([cache] tiers)."""
    tiers = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            tiers[name] = float(value)
        except ValueError:
            raise SystemExit(f"--cache-tiers {item!r}: expected name=threshold, e.g. fast=0.07") from None
    return tiers


def raw_baseline(args, work: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "perf" / "raw_diffusers_baseline.py"), "--deployment", args.deployment,
           "--height", str(args.height), "--width", str(args.width), "--steps", str(args.steps),
           "--guidance-scale", str(args.guidance), "--runs", str(args.raw_runs), "--warmup", "1",
           "--batch-sizes", args.raw_batches, "--batch-runs", "2",
           "--seed", "1", "--save-media", str(work / "raw_seed1.npy"), "--prompt", args.prompt]
    if args.frames:
        cmd += ["--frames", str(args.frames)]
    print("[accel] raw:", " ".join(cmd), flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"raw baseline failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


def request(args, seed: int, quality: str | None = None) -> GenerationRequest:
    extra = {"num_frames": args.frames} if args.frames else {}
    return GenerationRequest(args.prompt, seed=seed, height=args.height, width=args.width, num_inference_steps=args.steps,
                             guidance_scale=args.guidance, quality=quality, **extra)


def warm_client_process(url: str, args) -> None:
    """Pay this benchmark process's own first-stream costs (gRPC stream threads, protobuf
    set-up: 60-80 ms on CPU, 70-150 ms on the H200 runs) with a request the server rejects at
    validation, so `first_request_ms` measures the server's first request, not the client's.
    The rejection touches only the public model, whose request path was already warmed at load."""
    bad = GenerationRequest(args.prompt, seed=1, height=args.height, width=args.width, num_inference_steps=0,
                            guidance_scale=args.guidance)
    try:
        with DitClient(url, protocol="grpc-stream", task=args.task) as client:
            client.generate(bad, timeout_s=60)
    except Exception as exc:  # the expected rejection; anything else would show in the timed request
        print(f"[accel] client warm-up (rejected as intended): {str(exc)[:80]}", flush=True)


def start_ready(args, repo: Path, variant: Path, log_path: Path) -> tuple[TritonServer, float]:
    """A server on `repo` for `variant`, started and READY; with the seconds that took. One that
    does not get READY is stopped, and its log's tail goes into the error (the report keeps it)."""
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                                        deployment=str(variant)), log_path=log_path)
    t0 = time.perf_counter()
    server.start()
    try:
        server.wait_ready(timeout_s=args.ready_timeout)
    except BaseException as exc:
        server.stop()
        if isinstance(exc, Exception):
            raise RuntimeError(f"server not READY: {exc}\nlast log lines:\n{server.log_tail(40)}") from exc
        raise
    return server, round(time.perf_counter() - t0, 1)


@dataclass
class Timed:
    """One streamed generation as the client saw it."""

    ms: float              # request sent to media received
    media: np.ndarray
    cache_hits: int        # steps its tier reused
    first_step_ms: float   # request sent to its first progress response (time to first step)


def timed_generation(url: str, args, seed: int, quality: str | None = None) -> Timed:
    """One streamed generation, timed to its first step and to its media."""
    steps: list[float] = []   # when each progress response arrived
    start = time.perf_counter()
    with DitClient(url, protocol="grpc-stream", task=args.task) as client:
        result = client.generate(request(args, seed, quality), timeout_s=600,
                                 on_progress=lambda done, total: steps.append(time.perf_counter()))
    end = time.perf_counter()
    return Timed((end - start) * 1000, result.media, result.cache_hits, ((steps or [end])[0] - start) * 1000)


def closed_loop(url: str, args, quality: str | None = None) -> dict:
    """`--concurrency` clients, `--per-client` streamed generations each, one after another."""
    done, hits, first_steps, errors = [], [], [], []

    def client(i: int) -> None:
        for k in range(args.per_client):
            try:
                timed = timed_generation(url, args, 100 + i * args.per_client + k, quality)
                done.append(timed.ms)
                hits.append(timed.cache_hits)
                first_steps.append(timed.first_step_ms)
            except Exception as exc:  # noqa: BLE001  (recorded, the run goes on)
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"clients": args.concurrency, "requests": len(done), "errors": errors, "wall_s": round(wall, 2),
            "generations_per_s": round(len(done) / wall, 3), "p50_ms": round(statistics.median(done), 1) if done else None,
            "first_step_p50_ms": round(statistics.median(first_steps), 1) if first_steps else None,
            "cache_hits_mean": round(statistics.mean(hits), 2) if hits else None}


def accel_metrics(scrape: dict) -> dict:
    """The acceleration and cache series of a scrape, as `name{model}: value`."""
    return {f"{name}{{{model}}}": value for (name, model), value in scrape.items()
            if name.startswith(("ditserve_accel", "ditserve_compiled", "ditserve_eager", "ditserve_cache"))}


def lossy_tier(url: str, args, tier: str, lossless: dict, lossless_media: np.ndarray) -> dict:
    """Solo p50, closed-loop throughput, steps reused and PSNR against lossless of one cache tier."""
    out: dict = {}
    solo = [timed_generation(url, args, 1, tier) for _ in range(args.solo)]
    out["solo_ms"] = [round(timed.ms, 1) for timed in solo]
    out["solo_p50_ms"] = round(statistics.median(out["solo_ms"]), 1)
    out["cache_hits_seed1"] = solo[0].cache_hits
    out["psnr_vs_lossless_db"] = round(psnr(solo[0].media, lossless_media), 2)
    out["ratios"] = {"solo_p50_vs_lossless": round(out["solo_p50_ms"] / lossless["solo_p50_ms"], 3)}
    if args.concurrency > 1:
        out["concurrent"] = closed_loop(url, args, tier)
        out["ratios"]["throughput_vs_lossless"] = round(
            out["concurrent"]["generations_per_s"] / lossless["concurrent"]["generations_per_s"], 3)
    print(f"[accel] tier {tier}: solo p50 {out['solo_p50_ms']} ms, {out['cache_hits_seed1']} of {args.steps} steps "
          f"reused, PSNR vs lossless {out['psnr_vs_lossless_db']} dB, {out['ratios']}", flush=True)
    return out


def through_frontend(args, server: TritonServer, work: Path, direct: Timed) -> dict:
    """`--solo` seed-1 images through the front end's POST /v1/images/generations in each output
    format (PNG, and JPEG at quality 100): p50 against the direct client's solo p50 (`direct` is one
    of its seed-1 generations), and the file against the direct image: equal for PNG (same server,
    seed and shape: bit for bit), PSNR for JPEG."""
    from PIL import Image   # only here: the front end's files
    frontend = FrontendProcess(server.grpc_url, free_ports(1)[0], log_path=work / f"frontend-{args.name}.log").start()
    out = {}
    try:
        for output_format in ("png", "jpeg"):
            body = json.dumps({"prompt": args.prompt, "size": f"{args.width}x{args.height}", "seed": 1,
                               "num_inference_steps": args.steps, "guidance_scale": args.guidance,
                               "response_format": "b64_json", "output_format": output_format}).encode()
            times, answer = [], {}
            for _ in range(args.solo):
                post = urllib.request.Request(frontend.url + "/v1/images/generations", data=body,
                                              headers={"Content-Type": "application/json"})
                start = time.perf_counter()
                with urllib.request.urlopen(post, timeout=600) as response:
                    answer = json.loads(response.read())
                times.append((time.perf_counter() - start) * 1000)
            data = base64.b64decode(answer["data"][0]["b64_json"])
            image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            equal = bool(np.array_equal(image, direct.media))
            out[output_format] = {"solo_ms": [round(t, 1) for t in times], "solo_p50_ms": round(statistics.median(times), 1),
                                  "bytes": len(data), "equals_direct": equal,
                                  "psnr_vs_direct_db": None if equal else round(psnr(image, direct.media), 2)}
            print(f"[accel] front end, {output_format}: solo p50 {out[output_format]['solo_p50_ms']} ms, "
                  f"{len(data)} bytes, equals the direct image: {out[output_format]['equals_direct']} "
                  f"(PSNR {out[output_format]['psnr_vs_direct_db']} dB)", flush=True)
    finally:
        frontend.stop()
    return out


def served(args, work: Path, report: dict) -> None:
    size = f"{args.frames}x" * bool(args.frames) + f"{args.height}x{args.width}"
    accel = {"warm_sizes": [size], **parse_accel_overrides(args.accel)}
    if args.restart:   # a compile cache of its own: cold for the first server, warm for the restart
        accel.setdefault("compile_cache", str(work / "inductor-cache"))
        shutil.rmtree(accel["compile_cache"], ignore_errors=True)
    variant = work / f"{args.name}.toml"
    cache = None
    if args.cache_tiers:
        cache = {"tiers": parse_tiers(args.cache_tiers)}
        if args.cache_back_blocks is not None:
            cache["back_blocks"] = args.cache_back_blocks
        if args.cache_front_blocks is not None:
            cache["front_blocks"] = args.cache_front_blocks
    engine = {"mode": "step", "capacity": args.capacity, "in_flight": args.in_flight}
    if args.steps_per_execute:
        engine["steps_per_execute"] = args.steps_per_execute
    if args.stage_instances:
        engine["stage_instances"] = args.stage_instances
    write_variant(Path(args.deployment), variant, engine, "perf/accel_bench.py", accel=accel, cache=cache)
    report["served_deployment"] = variant.read_text()
    repo = work / f"repo-{args.name}"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", str(variant),
                    "--out", str(repo)], check=True, capture_output=True)
    server, report["ready_s"] = start_ready(args, repo, variant, work / f"server-{args.name}.log")
    try:
        print(f"[accel] READY after {report['ready_s']} s", flush=True)
        warm_client_process(server.grpc_url, args)
        start_scrape = loadgen.scrape(server.metrics_url)
        report["first_request_ms"] = round(timed_generation(server.grpc_url, args, 1).ms, 1)
        first_scrape = loadgen.scrape(server.metrics_url)
        report["first_request_split"] = loadgen.where_time_goes(start_scrape, first_scrape)
        solo = [timed_generation(server.grpc_url, args, 1) for _ in range(args.solo)]
        report["solo_split"] = loadgen.where_time_goes(first_scrape, loadgen.scrape(server.metrics_url))
        report["solo_ms"] = [round(timed.ms, 1) for timed in solo]
        report["solo_p50_ms"] = round(statistics.median(timed.ms for timed in solo), 1)
        # issue 22's bound on the time to first step: one dit step + 50 ms
        report["solo_first_step_ms"] = [round(timed.first_step_ms, 1) for timed in solo]
        report["solo_first_step_p50_ms"] = round(statistics.median(timed.first_step_ms for timed in solo), 1)
        step_ms = report["solo_split"].get("dit_step_ms")
        report["solo_first_step_bound_ms"] = round(step_ms + 50, 1) if step_ms else None
        seed1_media = solo[-1].media
        raw_media = np.load(work / "raw_seed1.npy")
        report["psnr_vs_raw_db"] = round(psnr(seed1_media, raw_media), 2)
        print(f"[accel] first {report['first_request_ms']} ms, solo p50 {report['solo_p50_ms']} ms, "
              f"first step p50 {report['solo_first_step_p50_ms']} ms (bound {report['solo_first_step_bound_ms']}), "
              f"PSNR {report['psnr_vs_raw_db']} dB", flush=True)
        before = loadgen.scrape(server.metrics_url)
        if args.frontend:
            report["frontend"] = through_frontend(args, server, work, solo[-1])
            for measured in report["frontend"].values():
                measured["solo_p50_vs_direct"] = round(measured["solo_p50_ms"] / report["solo_p50_ms"], 3)
        if args.concurrency > 1:
            report["concurrent"] = closed_loop(server.grpc_url, args)
            print(f"[accel] concurrency {args.concurrency}: {report['concurrent']}", flush=True)
        after = loadgen.scrape(server.metrics_url)
        report["split_under_load"] = loadgen.where_time_goes(before, after)
        report["metrics"] = accel_metrics(after)
        for tier in args.tiers.split(",")[1:]:
            report.setdefault("tiers", {})[tier] = lossy_tier(server.grpc_url, args, tier, report, seed1_media)
        if args.tiers != LOSSLESS:
            report["metrics_after_tiers"] = accel_metrics(loadgen.scrape(server.metrics_url))
    finally:
        server.stop()
        report["server_log_tail"] = server.log_tail(40)
    if args.restart:
        report["restart"] = restart(args, repo, variant, work)


def restart(args, repo: Path, variant: Path, work: Path) -> dict:
    """The same deployment started again on the compile cache the first start filled: what a pod
    restart with the cache on a volume costs (READY, first request, warm solo requests)."""
    out: dict = {}
    server, out["ready_s"] = start_ready(args, repo, variant, work / f"server-{args.name}-restart.log")
    try:
        print(f"[accel] restart on the warm compile cache: READY after {out['ready_s']} s", flush=True)
        warm_client_process(server.grpc_url, args)
        times = [round(timed_generation(server.grpc_url, args, seed).ms, 1) for seed in range(1, 4)]
        out["first_request_ms"], out["next_ms"] = times[0], times[1:]
        out["metrics"] = accel_metrics(loadgen.scrape(server.metrics_url))
    finally:
        server.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--size", required=True, help="HxW")
    ap.add_argument("--prompt", default=PROMPT, help="every request's prompt (the trained tiny model knows shapes: "
                                                        "'a red circle on a blue background')")
    ap.add_argument("--frames", type=int, default=0, help="video families")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guidance", type=float, default=4.5)
    ap.add_argument("--capacity", type=int, default=8)
    ap.add_argument("--in-flight", type=int, default=0,
                    help="[engine] in_flight: generations the public models hold at once (0 = capacity)")
    ap.add_argument("--steps-per-execute", type=int, default=0,
                    help="[engine] steps_per_execute: denoise steps dit may run per execute while its batch "
                         "stays the same (0 = the deployment's)")
    ap.add_argument("--stage-instances", type=int, default=0,
                    help="[engine] stage_instances: text_encoder and vae_decode instances per device (0 = the "
                         "deployment's)")
    ap.add_argument("--accel", nargs="*", default=["transformer=cuda_graphs"], help="[accel] key=value")
    ap.add_argument("--raw-runs", type=int, default=5)
    ap.add_argument("--raw-batches", default="", help="raw batched baseline sizes, e.g. 8,16 (its best is the ceiling)")
    ap.add_argument("--solo", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=0)
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--ready-timeout", type=float, default=480)
    ap.add_argument("--restart", action="store_true",
                    help="compile into a fresh cache, then start the server again on it (warm-cache READY time)")
    ap.add_argument("--tiers", default=LOSSLESS,
                    help="quality tiers to measure, lossless first (e.g. lossless,fast); the lossy ones need --cache-tiers "
                         "or the deployment's [cache]")
    ap.add_argument("--cache-tiers", nargs="*", default=[], help="the variant's [cache] tiers: name=threshold ...")
    ap.add_argument("--cache-back-blocks", type=int, default=None,
                    help="the variant's [cache] back_blocks (the last N blocks run at every step); default: "
                         "the deployment's")
    ap.add_argument("--cache-front-blocks", type=int, default=None,
                    help="the variant's [cache] front_blocks (the first N blocks run at every step and decide); "
                         "default: the deployment's")
    ap.add_argument("--frontend", action="store_true",
                    help="also --solo seed-1 images through the OpenAI-compatible front end (images only)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "accel"))
    args = ap.parse_args()
    if args.frontend and args.frames:
        ap.error("--frontend measures images; video families answer through its job API (docs/frontend.md)")
    if args.tiers.split(",")[0] != LOSSLESS:
        ap.error(f"--tiers must start with {LOSSLESS} (the reference of the others), got {args.tiers!r}")
    args.height, args.width = (int(v) for v in args.size.lower().split("x"))
    out = Path(args.out)
    work = out / f"work-{args.name}"
    work.mkdir(parents=True, exist_ok=True)
    args.task = load_deployment(args.deployment).task   # fail early on a bad file; txt2img / txt2vid
    report = {"name": args.name, "command": " ".join(sys.argv), "args": vars(args)}
    path = out / f"accel_{args.name}.json"
    try:
        report["raw"] = {k: v for k, v in raw_baseline(args, work).items() if k not in ("latencies_ms",)}
        print(f"[accel] raw p50 {report['raw']['p50_ms']:.1f} ms, best batch {report['raw']['best_batch']}", flush=True)
        served(args, work, report)
        raw = report["raw"]
        report["ratios"] = {
            "solo_p50_vs_raw_p50": round(report["solo_p50_ms"] / raw["p50_ms"], 3),
            "first_vs_warm_solo": round(report["first_request_ms"] / report["solo_p50_ms"], 3),
        }
        if report.get("restart", {}).get("ready_s"):
            report["ratios"]["restart_ready_vs_cold_ready"] = round(report["restart"]["ready_s"] / report["ready_s"], 3)
        if report.get("concurrent") and raw.get("best_batch"):
            report["ratios"]["throughput_vs_raw_best_batch"] = round(
                report["concurrent"]["generations_per_s"] / raw["best_batch"]["generations_per_s"], 3)
        print(f"[accel] {args.name}: {report['ratios']}", flush=True)
        return 0
    except BaseException as exc:  # keep the partial report, a timeout's SIGINT included
        report["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
        print(f"[accel] {args.name} failed: {report['error']}", flush=True)
        return 1
    finally:
        path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
