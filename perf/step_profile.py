"""Where one dit step's time goes, in process (no server): the transformer forward vs the Python
around it (inputs stacked, CFG combined, each request's scheduler.step, the NaN/inf checks).

    python perf/step_profile.py --deployment configs/pixart-sigma-1024-random.toml --size 512x512 \
        --batches 1,4,8,16 [--accel transformer=cuda_graphs] --out FILE

For each batch size B: B requests (CFG, 20 steps) admitted into a StepEngine of the deployment's
dit adapter, `--warm` steps, then `--iters` timed steps, each CUDA-synchronised:
  step_ms_<path>     engine.step over the B requests (what ditserve_step_duration_seconds measures)
  forward_ms        the adapter's transformer forward alone, on the same stacked inputs
  scheduler_ms_<path>  the B requests' scheduler steps on saved outputs, as the engine calls them
  other_ms_<path>   step - forward: all the Python and small kernels around the forward
  outside_denoise_ms_<path>  per engine step, its time minus its denoise (stacking, forward, CFG;
                    the engine's own ForwardTimer): scheduler steps, NaN checks, grouping
  batched_vs_per_request_max_abs  the two paths' latents after one step from the same state
  eager_forward_ms, forward_speedup, forward_rel_rms_vs_eager   with --accel: the eager forward
              on the same inputs, and the accelerated output's relative RMS error against it
  eager_forward_ms_pinned / _as_diffusers, pin_speedup   the eager forward with the attention
              processors' signatures pinned (accel.pin_processor_signatures, as dit runs) and
              unpinned (as plain diffusers runs), alternating, and the ratio
  loop_ms, loop_ms_waiting  per step, `--iters` engine steps back to back as dit's burst runs them
              (synchronised only before and after, `--loop-host-ms` of host work between steps
              standing in for progress responses and the scheduler's pick): as the engine queues
              them, and with a wait for the device after each step's forward (what a blocking
              host-to-device copy of the CFG scales did until 2026-12-04: the host could not queue
              the next step while the GPU ran this one)
  middle_step_waits  whether a middle step (not a request's first or last) waited for the device:
              run under torch's sync debug mode "error" (CUDA only; None on a CPU)
<path> is `per_request` (each request's own scheduler.step) and, where ditserve/batched_step.py
covers the deployment's scheduler, `batched` (one solve for the group): both run in the same process.
Issue 23 asks this before vectorising: the answer says whether the per-request scheduler step
is worth batching.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "perf")]

from ditserve.accel import processor_calls  # noqa: E402
from ditserve.adapters import adapter_for  # noqa: E402
from ditserve.deployment import parse_accel_overrides, write_variant  # noqa: E402
from ditserve.engine import StepEngine  # noqa: E402
from ditserve.schema import GenerationParams  # noqa: E402
from ditserve.state import TextConditioning  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, iters: int) -> float:
    """Median ms of `iters` calls, each synchronised."""
    out = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(out), 3)


def middle_step_waits(engine: StepEngine, keys: list[str]) -> bool | None:
    """Whether one engine step in the middle of its requests' schedules made the host wait for the
    device (torch's sync debug mode raises on a blocking copy or `.item()`); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.set_sync_debug_mode("error")
    try:
        engine.step(keys)
        return False
    except RuntimeError as exc:
        print(f"[step_profile] a middle step waited for the device: {exc}", flush=True)
        return True
    finally:
        torch.cuda.set_sync_debug_mode(0)


def looped(engine: StepEngine, keys: list[str], iters: int, host_s: float, wait: bool) -> float:
    """Mean ms per step of `iters` back-to-back engine steps, `host_s` of host work after each;
    with `wait`, the host also waits for each step's forward before its CFG and scheduler step."""
    adapter = engine.adapter
    denoise = adapter.denoise

    def waiting(states):
        outputs = denoise(states)
        sync()
        return outputs
    if wait:
        adapter.denoise = waiting
    try:
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            engine.step(keys)
            time.sleep(host_s)
        sync()
        return round((time.perf_counter() - start) * 1000 / iters, 3)
    finally:
        if wait:
            del adapter.denoise   # the class's method again


@contextlib.contextmanager
def as_diffusers(model: torch.nn.Module):
    """Inside, the attention processors' call signatures are looked up as plain diffusers does at every
    call: what accel.pin_processor_signatures computed once is taken off, and put back after."""
    saved = {call: call.__dict__.pop("__signature__") for call in processor_calls(model)
             if "__signature__" in call.__dict__}
    try:
        yield
    finally:
        for call, sig in saved.items():
            call.__signature__ = sig


def _fresh(scheduler):
    """A copy to step from a saved state: `step` replaces tensors but edits its history lists in place."""
    clone = copy.copy(scheduler)
    for name, value in vars(scheduler).items():
        if isinstance(value, list):
            setattr(clone, name, list(value))
    return clone


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--size", default="512x512")
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--accel", nargs="*", default=[])
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--loop-host-ms", type=float, default=2.0,
                    help="host work between the looped steps (dit's progress responses and pick)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    batches = [int(b) for b in args.batches.split(",")]
    out = Path(args.out)
    accel = {"warm_sizes": [args.size], **parse_accel_overrides(args.accel)} if args.accel else {}
    deployment = write_variant(Path(args.deployment), Path(tempfile.mkdtemp()) / "step_profile.toml",
                               {"mode": "step", "capacity": max(batches)}, "perf/step_profile.py", accel=accel)
    adapter = adapter_for(deployment.model.family)(deployment, "dit")
    warm = adapter.warm_up()
    length, dim = deployment.model.max_sequence_length, adapter.text_embed_dim
    solver = adapter.solver
    modes = ("per_request", "batched") if solver is not None else ("per_request",)
    rows = []
    for batch in batches:
        engine = StepEngine(adapter)
        for i in range(batch):
            steps = 20 + args.warm + args.iters * (len(modes) + 2) + 5
            params = GenerationParams("p", "", height, width, steps, 4.5, i)
            cond = adapter.example_conditioning(params)
            cond.embeds, cond.mask = torch.randn(2, length, dim, dtype=adapter.dtype), torch.ones(2, length, dtype=torch.int64)
            engine.admit(str(i), params, cond)
        keys = list(engine.table)
        row = {"requests": batch, "rows": 2 * batch}
        for _ in range(args.warm):
            engine.step(keys)
        step_ms, outside_ms = {mode: [] for mode in modes}, {mode: [] for mode in modes}
        for _ in range(args.iters):   # the two scheduler-step paths alternate, so drift hits both alike
            for mode in modes:
                adapter.solver = solver if mode == "batched" else None
                sync()
                start = time.perf_counter()
                report = engine.step(keys)
                sync()
                total = (time.perf_counter() - start) * 1000
                step_ms[mode].append(total)
                outside_ms[mode].append(total - 1000 * sum(timer.seconds() for _, _, timer in report.timings))
        for mode in modes:
            row[f"step_ms_{mode}"] = round(statistics.median(step_ms[mode]), 3)
            row[f"outside_denoise_ms_{mode}"] = round(statistics.median(outside_ms[mode]), 3)
        adapter.solver = solver
        row["middle_step_waits"] = middle_step_waits(engine, keys)
        for label, wait in (("loop_ms", False), ("loop_ms_waiting", True)):
            row[label] = looped(engine, keys, args.iters, args.loop_host_ms / 1000, wait)
        states = [engine.table[k] for k in keys]
        latents = torch.cat([torch.cat([s.latents] * 2) for s in states])
        timesteps = torch.cat([s.timestep.reshape(1).expand(2) for s in states]).to(adapter.device)
        cond = TextConditioning(torch.cat([s.cond.embeds for s in states]), torch.cat([s.cond.mask for s in states]))
        with torch.inference_mode():
            forward_ms = timed(lambda: adapter.run_forward(latents, timesteps, cond), args.iters)
            outputs = adapter.denoise(states)
            # The accelerated forward against the eager one on the same inputs (bf16 noise ~1-2 %).
            fast, eager = adapter.run_forward(latents, timesteps, cond).float(), adapter.forward(latents, timesteps, cond).float()
            rel_rms = ((fast - eager).pow(2).mean().sqrt() / eager.pow(2).mean().sqrt()).item()
            eager_ms = timed(lambda: adapter.forward(latents, timesteps, cond), args.iters) if accel else forward_ms
            pinned, plain = [], []
            for _ in range(3):   # alternating, so drift hits both alike
                pinned.append(timed(lambda: adapter.forward(latents, timesteps, cond), args.iters))
                with as_diffusers(adapter.pipe.transformer):
                    plain.append(timed(lambda: adapter.forward(latents, timesteps, cond), args.iters))
        row.update({"eager_forward_ms_pinned": statistics.median(pinned),
                    "eager_forward_ms_as_diffusers": statistics.median(plain),
                    "pin_speedup": round(statistics.median(plain) / statistics.median(pinned), 3)})
        saved = [(copy.deepcopy(s.scheduler), s.latents.clone(), s.step_index) for s in states]

        def schedule() -> list[torch.Tensor]:
            """One scheduler step of every request from the saved state (the engine's call)."""
            for s, (scheduler, latents_before, index) in zip(states, saved):
                s.scheduler, s.latents, s.step_index = _fresh(scheduler), latents_before, index
            adapter.scheduler_steps(states, outputs)
            return [s.latents for s in states]

        stepped = {}
        for mode in modes:
            adapter.solver = solver if mode == "batched" else None
            row[f"scheduler_ms_{mode}"] = timed(schedule, args.iters)
            row[f"other_ms_{mode}"] = round(row[f"step_ms_{mode}"] - forward_ms, 3)
            stepped[mode] = torch.cat(schedule()).float()
        if solver is not None:   # on this device: the batched latents against each request's own step
            row["batched_vs_per_request_max_abs"] = (stepped["batched"] - stepped["per_request"]).abs().max().item()
        adapter.solver = solver
        row.update({"forward_ms": forward_ms, "eager_forward_ms": eager_ms, "forward_speedup": round(eager_ms / forward_ms, 3),
                    "forward_rel_rms_vs_eager": round(rel_rms, 5)})
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"command": " ".join(sys.argv), "deployment": deployment.source, "size": args.size,
              "accel": accel, "warm_up_s": round(warm.seconds, 1), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "rows": rows}
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
