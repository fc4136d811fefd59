#!/usr/bin/env python
"""GPU functional matrix: every public model of the tiny pipelines, served on the GPU, over
every protocol, at a small and at a real video size.

    source .gpu/env.sh && python scripts/build_tiny_pipelines.py && \
        python perf/gpu_matrix.py --out $OUT/gpu_matrix.json --logs $OUT/gpu_matrix_logs.tgz

The tiny pipelines run in milliseconds, so this answers "does the served path work on this
GPU?" in a few minutes, before any full-size run spends its time on it. For each deployment
(and engine variant) it starts one tritonserver and runs the cases below; a case that fails
asks every stub for its Python stacks (SIGUSR1, see backends/diffusion/model.py), and the
report carries any fatal-error block of the server log (faulthandler prints one when a stub
dies on a signal).

  grpc, http       one request, unary model
  stream           one request on `<task>_stream`; every step must be reported
  stream_subset    one streamed request that asks for the media and progress only (no
                   `seed`): the 2.51 stub segfaulted on a CUDA host sending an output the
                   client had not requested, until responses carried only requested outputs
  stream_x3        three concurrent streamed requests (the step batch)
  cuda_shm         the stream request again, media into a registered CUDA shm region;
                   must equal `stream` bit for bit (same seed, solo)
  large            video tasks: 81x480x832 (97 MB, the real model's size) with 2 steps,
                   streamed: the GPU media crossing vae_decode -> public model at full size
  large_cuda_shm   the same into a CUDA shm region

On a host without CUDA the CUDA cases are skipped (recorded as such), so the matrix also runs
on CPU: tests/test_gpu_matrix.py keeps it from rotting.

Variants (`--variants`): `default` (the deployment as written), `watch_on` ([engine]
watch_stubs = "on": BLS from the liveness helper thread) and `gpu_media` ([engine]
media_on_host = false: decoded media handed between stubs on the GPU). `--variants-on-failure` runs the non-default variants only for a
deployment whose default run failed.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))
from ditserve.client import DitClient, GenerationRequest  # noqa: E402
from ditserve.deployment import TASK_CONDITIONING, load_deployment, write_variant  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402

DEPLOYMENTS = ("configs/tiny-pixart-sigma.toml", "configs/tiny-wan-t2v.toml", "configs/tiny-wan-i2v.toml")
VARIANTS = {"default": {}, "watch_on": {"watch_stubs": "on"}, "gpu_media": {"media_on_host": False}}
# A stub's death first (faulthandler's block), then the stacks SIGUSR1 asked for on a failure.
FATAL_MARKERS = ("Fatal Python error", "Segmentation fault", "Aborted", "is not healthy", "Current thread")


def variant_file(deployment: str, variant: str, work: Path) -> str:
    """The deployment with the variant's [engine] keys replaced."""
    if not VARIANTS[variant]:
        return deployment
    path = work / f"{Path(deployment).stem}-{variant}.toml"
    write_variant(ROOT / deployment, path, VARIANTS[variant], "perf/gpu_matrix.py")
    return str(path)


def base_request(deployment, seed: int, **overrides) -> GenerationRequest:
    d = deployment.defaults
    fields = dict(prompt=f"a lighthouse on a cliff, seed {seed}", seed=seed, height=d.height, width=d.width,
                  num_inference_steps=4, guidance_scale=d.guidance_scale)
    if deployment.is_video:
        fields.update(num_frames=d.num_frames)
    fields.update(overrides)
    if deployment.task in TASK_CONDITIONING:
        rng = np.random.default_rng(seed)
        fields["image"] = rng.integers(0, 256, (fields["height"], fields["width"], 3), dtype=np.uint8)
    return GenerationRequest(**fields)


def timed(fn, name: str = "") -> dict:
    if name:
        print(f"[gpu_matrix]   case {name} ...", flush=True)
    t0 = time.perf_counter()
    try:
        record = fn() or {}
        record["ok"] = record.get("ok", True)
    except BaseException as exc:  # every failure is a finding, recorded, never raised
        record = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]}
    record["s"] = round(time.perf_counter() - t0, 3)
    return record


def http_client_missing() -> str | None:
    """The GPU bundle's tritonclient has no HTTP extra (geventhttpclient): skip, not fail, there."""
    try:
        import tritonclient.http  # noqa: F401
    except (ImportError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def run_cases(server: TritonServer, deployment, request_timeout_s: float) -> dict:
    task, url = deployment.task, server.grpc_url
    expected_shape = lambda r: ([r.num_frames] if deployment.is_video else []) + [r.height, r.width, 3]  # noqa: E731
    results: dict = {}

    def one(protocol: str, request: GenerationRequest, shm: str | None = None):
        with DitClient(server.http_url if protocol == "http" else url, protocol=protocol, task=task,
                       shm=shm) as client:
            res = client.generate(request, timeout_s=request_timeout_s)
        media = np.asarray(res.media)
        ok = list(media.shape) == expected_shape(request) and \
            (protocol != "grpc-stream" or res.steps_reported == request.num_inference_steps)
        return {"ok": ok, "shape": list(media.shape), "steps_reported": res.steps_reported,
                "mean": round(float(media.mean()), 3)}, media

    solo = base_request(deployment, seed=7)
    medias: dict = {}

    def keep(name, protocol, request, shm=None):
        record, medias[name] = one(protocol, request, shm)
        return record

    results["grpc"] = timed(lambda: keep("grpc", "grpc", solo), "grpc")
    missing = http_client_missing()
    results["http"] = {"ok": True, "skipped": missing} if missing else timed(lambda: keep("http", "http", solo), "http")
    results["stream"] = timed(lambda: keep("stream", "grpc-stream", solo), "stream")

    def subset():
        import queue
        import tritonclient.grpc as grpcclient
        media_name = "video" if deployment.is_video else "image"
        responses: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(url) as client:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            client.async_stream_infer(f"{task}_stream", solo.infer_inputs(grpcclient), outputs=[
                grpcclient.InferRequestedOutput(n) for n in (media_name, "progress")])
            names = []
            while True:
                result, error = responses.get(timeout=request_timeout_s)
                if error is not None:
                    raise RuntimeError(error.message())
                names.append(sorted(o.name for o in result.get_response().outputs))
                if media_name in names[-1]:
                    client.stop_stream()
                    break
        return {"ok": names[-1] == [media_name] and len(names) == solo.num_inference_steps + 1, "final": names[-1]}
    results["stream_subset"] = timed(subset, "stream_subset")

    def concurrent():
        records = [{} for _ in range(3)]

        def worker(i):
            records[i] = timed(lambda: one("grpc-stream", base_request(deployment, seed=20 + i))[0])
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"ok": all(r["ok"] for r in records), "requests": records}
    results["stream_x3"] = timed(concurrent, "stream_x3")

    def shm_equal(name, reference, request):
        record = keep(name, "grpc-stream", request, shm="cuda")
        if reference in medias:
            diff = int(np.abs(medias[name].astype(np.int16) - medias[reference].astype(np.int16)).max())
            record.update(max_abs_diff_vs_grpc=diff, ok=record["ok"] and diff == 0)
        return record
    no_cuda = None if torch.cuda.is_available() else "no CUDA device on this host"
    results["cuda_shm"] = {"ok": True, "skipped": no_cuda} if no_cuda else \
        timed(lambda: shm_equal("cuda_shm", "stream", solo), "cuda_shm")

    if deployment.is_video and not no_cuda:  # 97 MB through a CPU host's VAE is minutes, not seconds
        large = base_request(deployment, seed=9, height=480, width=832, num_frames=81, num_inference_steps=2)
        results["large"] = timed(lambda: keep("large", "grpc-stream", large), "large")
        results["large_cuda_shm"] = timed(lambda: shm_equal("large_cuda_shm", "large", large), "large_cuda_shm")
    return results


def fatal_excerpt(log_text: str, limit: int = 250) -> list[str]:
    """The lines of the server log around every fatal marker (stub deaths, their stacks)."""
    lines = log_text.splitlines()
    keep: set[int] = set()
    for i, line in enumerate(lines):
        if any(marker in line for marker in FATAL_MARKERS):
            keep.update(range(max(0, i - 2), min(len(lines), i + 25)))
    return [lines[i] for i in sorted(keep)][:limit]


def run_one(deployment_path: str, variant: str, work: Path, request_timeout_s: float) -> dict:
    source = variant_file(deployment_path, variant, work)
    deployment = load_deployment(source)
    repo = work / f"repo-{Path(deployment_path).stem}-{variant}"
    subprocess.run([sys.executable, str(ROOT / "scripts/render_repository.py"), "--deployment", source,
                    "--out", str(repo)], check=True, capture_output=True)
    http, grpc, metrics = free_ports(3)
    log_path = work / f"server-{Path(deployment_path).stem}-{variant}.log"
    server = TritonServer(ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc,
                                        metrics_port=metrics, deployment=source), log_path=log_path)
    report = {"deployment": deployment_path, "variant": variant, "task": deployment.task, "log": log_path.name}
    t0 = time.perf_counter()
    server.start()
    try:
        print(f"[gpu_matrix] {deployment_path} {variant}: starting the server", flush=True)
        server.wait_ready(timeout_s=180)
        report["ready_s"] = round(time.perf_counter() - t0, 1)
        report["cases"] = run_cases(server, deployment, request_timeout_s)
        if not all(c["ok"] for c in report["cases"].values()):
            report["stub_pids_dumped"] = server.dump_stacks()
            time.sleep(2)
    except BaseException as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
    finally:
        server.stop(timeout_s=60)
    report["ok"] = "error" not in report and all(c["ok"] for c in report.get("cases", {}).values())
    report["fatal"] = fatal_excerpt(log_path.read_text(errors="replace")) if log_path.exists() else []
    print(f"[gpu_matrix] {deployment_path} {variant}: {'ok' if report['ok'] else 'FAILED'} "
          + json.dumps({k: v.get("ok") for k, v in report.get("cases", {}).items()}), flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployments", default=",".join(DEPLOYMENTS))
    parser.add_argument("--variants", default="default,watch_on,gpu_media")
    parser.add_argument("--variants-on-failure", action="store_true",
                        help="run the non-default variants only where the default failed")
    parser.add_argument("--deadline-s", type=float, default=420, help="start no new server after this many s")
    parser.add_argument("--request-timeout-s", type=float, default=90)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--logs", type=Path, help="tar.gz of every server log")
    args = parser.parse_args()
    started = time.monotonic()
    report = {"command": " ".join(sys.argv), "machine": platform.node(), "python": platform.python_version(),
              "torch": torch.__version__, "cuda": torch.cuda.is_available(),
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "runs": []}
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="gpu_matrix.") as tmp:
        work = Path(tmp)
        plan = [(d, v) for v in variants[:1] for d in args.deployments.split(",")]
        failed = set()
        while plan:
            deployment, variant = plan.pop(0)
            if time.monotonic() - started > args.deadline_s:
                report["runs"].append({"deployment": deployment, "variant": variant, "skipped": "deadline"})
                continue
            run = run_one(deployment, variant, work, args.request_timeout_s)
            report["runs"].append(run)
            if not run["ok"]:
                failed.add(deployment)
            if not plan and variant == variants[0]:
                plan = [(d, v) for v in variants[1:] for d in args.deployments.split(",")
                        if not args.variants_on_failure or d in failed]
            args.out.write_text(json.dumps(report, indent=2) + "\n")
            if args.logs:  # after every run: a call cut short still returns the logs so far
                with tarfile.open(args.logs, "w:gz") as tar:
                    for log in work.glob("server-*.log"):
                        tar.add(log, arcname=log.name)
    report["ok"] = all(r.get("ok") for r in report["runs"])
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
