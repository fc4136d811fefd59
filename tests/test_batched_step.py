"""The batched scheduler step (ditserve/batched_step.py) against diffusers' own `step`, row by row.

Requests of mixed step counts join and leave a running batch at random ticks, so every tick
mixes step indices (first steps, multistep history, the lower-order final steps); each request
is stepped twice, by the batched solver and by a copy of its scheduler's own `step`, and the
two latents must be identical (bit for bit: CPU, float32 and bfloat16).
"""
from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from ditserve.batched_step import DPMSolverPlusPlus, FlowMatchEulerSolver, solver_for
from scripts.build_tiny_pipelines import (FLUX_DEV_SCHEDULER_CONFIG, PIXART_SIGMA_SCHEDULER_CONFIG,
                                          QWEN_IMAGE_SCHEDULER_CONFIG, SD3_SCHEDULER_CONFIG,
                                          WAN_T2V_SCHEDULER_CONFIG)

STEP_COUNTS = (1, 2, 3, 7, 14, 15, 20, 25)


def _dpm(**overrides):
    return DPMSolverMultistepScheduler(**{**PIXART_SIGMA_SCHEDULER_CONFIG, **overrides})


def _flow(config: dict, begin_index: bool = True):
    """A flow-matching Euler factory setting a schedule as the family's adapter does."""
    def make(steps: int):
        scheduler = FlowMatchEulerDiscreteScheduler(**config)
        mu = {"mu": calculate_shift(256 + 97 * steps)} if config.get("use_dynamic_shifting") else {}
        scheduler.set_timesteps(steps, **mu)
        if begin_index:
            scheduler.set_begin_index(0)
        return scheduler
    return make


def _dpm_factory(**overrides):
    def make(steps: int):
        scheduler = _dpm(**overrides)
        scheduler.set_timesteps(steps)
        return scheduler
    return make


CASES = {
    "pixart-dpm++2m": (DPMSolverPlusPlus, _dpm_factory()),
    "dpm++2m-no-lower-order-final-sigma-min": (DPMSolverPlusPlus, _dpm_factory(lower_order_final=False,
                                                                                final_sigmas_type="sigma_min")),
    "dpm++1": (DPMSolverPlusPlus, _dpm_factory(solver_order=1)),
    "dpm++2m-karras-euler-at-final": (DPMSolverPlusPlus, _dpm_factory(use_karras_sigmas=True, euler_at_final=True)),
    "flux-dev-euler": (FlowMatchEulerSolver, _flow(FLUX_DEV_SCHEDULER_CONFIG)),
    "sd3-euler-no-begin-index": (FlowMatchEulerSolver, _flow(SD3_SCHEDULER_CONFIG, begin_index=False)),
    "qwen-image-euler": (FlowMatchEulerSolver, _flow(QWEN_IMAGE_SCHEDULER_CONFIG)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_step_equals_diffusers_per_row(case, dtype):
    solver_class, make = CASES[case]
    rng = random.Random(case)
    gen = torch.Generator().manual_seed(len(case))
    solver = solver_for(make(4))
    assert isinstance(solver, solver_class)
    counts = [n for n in STEP_COUNTS if n > 1 or "qwen" not in case]   # Qwen-Image: 1 step is NaN (its adapter refuses it)
    pending = [rng.choice(counts) for _ in range(10)] + counts
    expected_rows = sum(pending)
    active: list[dict] = []
    checked_rows, widest = 0, 0
    while pending or active:
        while pending and (not active or rng.random() < 0.4):   # join at random step boundaries
            steps = pending.pop()
            scheduler = make(steps)
            latents = torch.randn(1, 4, 6, 5, generator=gen).to(dtype) * 3
            active.append({"ours": scheduler, "theirs": copy.deepcopy(scheduler), "latents": latents,
                           "reference": latents.clone(), "step": 0})
        batch = [r for r in active if rng.random() < 0.8] or active[:1]   # some rows sit a tick out
        outputs = [torch.randn(1, 4, 6, 5, generator=gen).to(dtype) for _ in batch]
        new = solver.step([r["ours"] for r in batch], [r["latents"] for r in batch], outputs,
                          [r["ours"].timesteps[r["step"]] for r in batch])
        for row, latents, output in zip(batch, new, outputs):
            theirs = row["theirs"]
            row["reference"] = theirs.step(output, theirs.timesteps[row["step"]], row["reference"], return_dict=False)[0]
            assert latents.dtype == row["reference"].dtype and latents.shape == row["reference"].shape
            assert torch.equal(latents, row["reference"]), \
                f"{case}: step {row['step'] + 1}/{len(theirs.timesteps)} differs by " \
                f"{(latents.float() - row['reference'].float()).abs().max().item()}"
            assert row["ours"].step_index == theirs.step_index
            if hasattr(theirs, "lower_order_nums"):
                assert row["ours"].lower_order_nums == theirs.lower_order_nums
            row["latents"], row["step"] = latents, row["step"] + 1
        checked_rows, widest = checked_rows + len(batch), max(widest, len(batch))
        active = [r for r in active if r["step"] < len(r["theirs"].timesteps)]
    assert checked_rows == expected_rows   # every step of every request was compared
    assert widest >= 4, "the random schedule never batched 4 requests together"


def test_solver_state_interleaves_with_diffusers_step():
    """A request stepped batched, then by its own `step` (the engine's fallback), then batched
    again ends where diffusers alone ends: the solver keeps the scheduler's state exact."""
    make = _dpm_factory()
    ours, theirs = make(12), make(12)
    solver = solver_for(ours)
    latents = reference = torch.randn(1, 4, 6, 5, generator=torch.Generator().manual_seed(0))
    for i, t in enumerate(theirs.timesteps):
        output = torch.randn(1, 4, 6, 5, generator=torch.Generator().manual_seed(i))
        if i % 3 == 1:
            latents = ours.step(output, t, latents, return_dict=False)[0]
        else:
            latents = solver.step([ours], [latents], [output], [t])[0]
        reference = theirs.step(output, t, reference, return_dict=False)[0]
    assert torch.equal(latents, reference)


@pytest.mark.parametrize("scheduler", [
    UniPCMultistepScheduler(**WAN_T2V_SCHEDULER_CONFIG),
    _dpm(algorithm_type="sde-dpmsolver++"),
    _dpm(solver_order=3),
    _dpm(thresholding=True),
    _dpm(solver_type="heun"),
    _dpm(prediction_type="v_prediction"),
    FlowMatchEulerDiscreteScheduler(stochastic_sampling=True),
], ids=["unipc-wan", "sde-dpm++", "dpm++3m", "thresholding", "heun", "v-prediction", "stochastic-euler"])
def test_uncovered_schedulers_step_per_request(scheduler):
    assert solver_for(scheduler) is None


@pytest.mark.parametrize("config", ["configs/tiny-pixart-sigma.toml", "configs/tiny-flux.toml"])
def test_engine_batched_equals_per_request(tmp_path, config):
    """The step engine over the real tiny adapter: requests of 3-16 steps joining a running batch
    at different steps end with the same latents as with `[accel] scheduler_step = "per_request"`
    (each request's own `scheduler.step`, the path served before)."""
    from ditserve.adapters import adapter_for
    from ditserve.deployment import write_variant
    from ditserve.engine import StepEngine
    from ditserve.schema import GenerationParams

    results = {}
    for mode in ("batched", "per_request"):
        deployment = write_variant(Path(config), tmp_path / f"{mode}.toml", {}, "test", accel={"scheduler_step": mode})
        adapter = adapter_for(deployment.model.family)(deployment, "dit")
        assert (adapter.solver is not None) == (mode == "batched")
        engine = StepEngine(adapter)
        joins = {0: [("a", 16), ("b", 3)], 2: [("c", 9)], 5: [("d", 14), ("e", 7)]}   # tick -> (key, steps)
        final, tick, widest = {}, 0, 0
        while tick in joins or engine.table:
            for key, steps in joins.get(tick, []):
                params = GenerationParams("p", "", 64, 64, steps, 4.5, len(key) + steps, cfg=deployment.uses_cfg)
                engine.admit(key, params, _conditioning(adapter, params))
            report = engine.step(list(engine.table))
            assert not report.failed, report.failed
            widest = max(widest, max(report.batch_sizes))
            for key in [k for k, s in engine.table.items() if s.done]:
                final[key] = engine.release(key).latents
            tick += 1
        assert widest >= 3 and len(final) == 5
        results[mode] = final
    for key, latents in results["batched"].items():
        assert torch.equal(latents, results["per_request"][key]), key


def _conditioning(adapter, params):
    """Random embeddings shaped as the text_encoder's output ([negative, prompt] rows with CFG)."""
    from ditserve.state import TextConditioning
    one, rows = adapter.example_conditioning(params), 2 if params.do_cfg else 1
    gen = torch.Generator().manual_seed(params.seed)
    return TextConditioning(torch.randn(rows, *one.embeds.shape[1:], generator=gen, dtype=one.embeds.dtype),
                            torch.ones(rows, one.mask.shape[1], dtype=one.mask.dtype), one.extra)
