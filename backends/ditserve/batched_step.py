"""The scheduler step of a whole step batch in one set of tensor ops.

Each request keeps its own diffusers scheduler (its schedule, step index and multistep history:
DESIGN's per-request contract). Calling `scheduler.step` once per request costs some twenty
small tensor ops and their Python per request (2.2 ms for 8 requests on the H200), most of it
0-dim math on the schedule. A `BatchedSolver` reads every request's scheduler state, advances all
requests of a compatibility group with a few batched ops (each row with its own coefficients) and
writes the state back as `step` would. The per-step coefficients are computed once per schedule,
with the same 0-dim float32 operations diffusers uses, and applied with the same dtype rules, so a
row's result is bit-identical to `scheduler.step` on CPU (tests/test_batched_step.py).

Covered (`solver_for`): FlowMatchEulerDiscreteScheduler without stochastic sampling (FLUX.1, SD3,
Qwen-Image) and DPMSolverMultistepScheduler as dpmsolver++ of order 1-2, midpoint, epsilon
prediction, no thresholding (PixArt-Sigma). Any other scheduler or config gets None and each
request runs its own `scheduler.step` (UniPC: the Wan families).
"""
from __future__ import annotations

import sys
import weakref
from abc import ABC, abstractmethod
from typing import Any

import torch


def _column(values: torch.Tensor, j: int, ndim: int) -> torch.Tensor:
    """Column j of per-row coefficients [B, K], shaped to broadcast over [B, ...] of `ndim` dims."""
    return values[:, j].reshape(-1, *[1] * (ndim - 1))


def _times(coef: torch.Tensor, t: torch.Tensor, *, host_scalar: bool, first: bool = True) -> torch.Tensor:
    """`s * t` (or `t * s`) per row, as torch computes it for diffusers' 0-dim float32 `s`.

    Same dtype rules, hence the same bits: a float32 `t` takes the float32 product. A bfloat16 /
    float16 `t` is multiplied in float32 and rounded once, with `s` kept in float32 where torch
    treats it as a host scalar (a CPU `s` against a CUDA `t`, or a CPU `s` as second operand on
    CPU) and rounded to `t`'s dtype first otherwise (CPU first operand; `s` on the same GPU)."""
    if t.dtype == torch.float32:
        return coef * t
    if host_scalar and (t.is_cuda or not first):
        return (coef * t.float()).to(t.dtype)
    return coef.to(t.dtype) * t


def _divided(t: torch.Tensor, coef: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """`t / s` per row for a 0-dim float32 CPU `s`: CUDA multiplies by its float32 reciprocal
    (`inverse`), the CPU divides (in float32, rounded once for reduced dtypes)."""
    if t.is_cuda:
        return _times(inverse, t, host_scalar=True)
    if t.dtype == torch.float32:
        return t / coef
    return (t.float() / coef).to(t.dtype)


class BatchedSolver(ABC):
    """One scheduler class's step over many requests; its schedulers stay the source of truth."""

    def __init__(self):
        self._tables: dict[tuple, list[tuple[float, ...]]] = {}   # schedule -> per-step coefficients
        # scheduler -> its schedule's table, looked up once per request (its sigmas may be on the GPU)
        self._table_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @staticmethod
    @abstractmethod
    def covers(scheduler: Any) -> bool:
        """Whether this solver reproduces `scheduler.step` for the scheduler's config."""

    @abstractmethod
    def coefficients(self, scheduler: Any) -> list[tuple[float, ...]]:
        """Per step of the scheduler's schedule, the numbers its step multiplies by."""

    @abstractmethod
    def solve(self, schedulers: list, samples: list[torch.Tensor], outputs: list[torch.Tensor],
              rows: list[tuple[float, ...]]) -> tuple[list[torch.Tensor], list]:
        """New samples, one per row, and what `commit` needs; changes no scheduler."""

    @abstractmethod
    def commit(self, scheduler: Any, kept: Any) -> None:
        """Advance one scheduler's state as its own `step` would have."""

    def table(self, scheduler: Any) -> list[tuple[float, ...]]:
        """The coefficients of this scheduler's schedule, computed once per distinct schedule."""
        if scheduler not in self._table_of:
            sigmas = scheduler.sigmas.detach().to("cpu", torch.float32)
            key = (len(scheduler.timesteps), sigmas.numpy().tobytes())
            if key not in self._tables:
                self._tables[key] = self.coefficients(scheduler)
            self._table_of[scheduler] = self._tables[key]
        return self._table_of[scheduler]

    def step(self, schedulers: list, samples: list[torch.Tensor], outputs: list[torch.Tensor],
             timesteps: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each request's next sample, its scheduler advanced; all or none of them on an error."""
        for scheduler, timestep in zip(schedulers, timesteps):
            if scheduler.step_index is None:   # what `step` does first (no begin index set)
                scheduler._init_step_index(timestep)
        rows = [self.table(s)[s.step_index] for s in schedulers]
        new, kept = self.solve(schedulers, samples, outputs, rows)
        for scheduler, extra in zip(schedulers, kept):
            self.commit(scheduler, extra)
        return new


class FlowMatchEulerSolver(BatchedSolver):
    """x' = x + (sigma_next - sigma) * v, upcast to float32 and back to the output's dtype."""

    @staticmethod
    def covers(scheduler: Any) -> bool:
        return type(scheduler).__name__ == "FlowMatchEulerDiscreteScheduler" \
            and not scheduler.config.get("stochastic_sampling", False)

    def coefficients(self, scheduler: Any) -> list[tuple[float, ...]]:
        sigmas = scheduler.sigmas.detach().cpu()
        return [((sigmas[i + 1] - sigmas[i]).item(),) for i in range(len(scheduler.timesteps))]

    def solve(self, schedulers, samples, outputs, rows):
        sample, output = torch.cat(samples), torch.cat(outputs)
        dt = _column(torch.tensor(rows, dtype=torch.float32).to(output.device, non_blocking=True), 0, output.ndim)
        host = not schedulers[0].sigmas.is_cuda and output.is_cuda
        new = (sample.float() + _times(dt, output, host_scalar=host)).to(output.dtype)
        return list(new.split(1)), [None] * len(schedulers)

    def commit(self, scheduler, kept) -> None:
        scheduler._step_index += 1


class DPMSolverPlusPlus(BatchedSolver):
    """DPM-Solver++ (multistep, order <= 2, midpoint): per row the first- or second-order update
    diffusers picks for that request (warm-up, lower_order_final), with its own model-output history.

    Per step i the coefficients are: sigma_t and alpha_t (and 1/alpha_t) that turn the epsilon
    prediction into x0, then x' = a*x - b*x0 (first order) or x' = a*x - b*x0 - c*(r*(x0 - x0_prev))."""

    SIGMA, ALPHA, INV_ALPHA, A, B, C, R = range(7)

    @staticmethod
    def covers(scheduler: Any) -> bool:
        config = scheduler.config
        return (type(scheduler).__name__ == "DPMSolverMultistepScheduler"
                and config.algorithm_type == "dpmsolver++" and config.solver_order in (1, 2)
                and config.solver_type == "midpoint" and config.prediction_type == "epsilon"
                and not config.thresholding and config.variance_type is None)

    def coefficients(self, scheduler: Any) -> list[tuple[float, ...]]:
        """The 0-dim float32 math of diffusers' convert_model_output and first/second-order updates."""
        alpha_sigma = [scheduler._sigma_to_alpha_sigma_t(s) for s in scheduler.sigmas.detach().cpu()]
        lambdas = [torch.log(alpha) - torch.log(sigma) for alpha, sigma in alpha_sigma]
        table = []
        for i in range(len(scheduler.timesteps)):
            (alpha_s, sigma_s), (alpha_t, sigma_t) = alpha_sigma[i], alpha_sigma[i + 1]
            h = lambdas[i + 1] - lambdas[i]
            b = alpha_t * (torch.exp(-h) - 1.0)
            c = 0.5 * (alpha_t * (torch.exp(-h) - 1.0))
            r = 1.0 / ((lambdas[i] - lambdas[i - 1]) / h) if i > 0 else torch.tensor(0.0)
            table.append(tuple(v.item() for v in (sigma_s, alpha_s, 1.0 / alpha_s, sigma_t / sigma_s, b, c, r)))
        return table

    @staticmethod
    def order(scheduler: Any) -> int:
        """The order diffusers' `step` uses for this scheduler's next step."""
        config, n, i = scheduler.config, len(scheduler.timesteps), scheduler.step_index
        short = config.lower_order_final and n < 15
        final = i == n - 1 and (config.euler_at_final or short or config.final_sigmas_type == "zero")
        if config.solver_order == 1 or scheduler.lower_order_nums < 1 or final:
            return 1
        return 2

    def solve(self, schedulers, samples, outputs, rows):
        orders = [self.order(s) for s in schedulers]
        new: list[torch.Tensor | None] = [None] * len(schedulers)
        kept: list[torch.Tensor | None] = [None] * len(schedulers)
        for order in (1, 2):
            group = [i for i, o in enumerate(orders) if o == order]
            if not group:
                continue
            sample, output = torch.cat([samples[i] for i in group]), torch.cat([outputs[i] for i in group])
            coef = torch.tensor([rows[i] for i in group], dtype=torch.float32).to(output.device, non_blocking=True)

            def col(j: int) -> torch.Tensor:
                return _column(coef, j, output.ndim)

            # convert_model_output: x0 = (x - sigma_t * eps) / alpha_t, in the inputs' dtypes
            x0 = _divided(sample - _times(col(self.SIGMA), output, host_scalar=True), col(self.ALPHA),
                          col(self.INV_ALPHA))
            x = _times(col(self.A), sample.float(), host_scalar=True) - _times(col(self.B), x0, host_scalar=True)
            if order == 2:
                previous = torch.cat([schedulers[i].model_outputs[-1] for i in group])
                d1 = _times(col(self.R), x0 - previous, host_scalar=True)
                x = x - _times(col(self.C), d1, host_scalar=True)
            for i, row_new, row_x0 in zip(group, x.to(x0.dtype).split(1), x0.split(1)):
                new[i], kept[i] = row_new, row_x0
        return new, kept

    def commit(self, scheduler, x0) -> None:
        scheduler.model_outputs = [*scheduler.model_outputs[1:], x0]
        scheduler.lower_order_nums = min(scheduler.lower_order_nums + 1, scheduler.config.solver_order)
        scheduler._step_index += 1


SOLVERS: tuple[type[BatchedSolver], ...] = (FlowMatchEulerSolver, DPMSolverPlusPlus)


def solver_for(scheduler: Any) -> BatchedSolver | None:
    """The batched solver reproducing this scheduler's `step`, or None (step each request alone)."""
    for solver in SOLVERS:
        if solver.covers(scheduler):
            return solver()
    return None


def warn_fallback(exc: Exception) -> None:
    """A batched solve that raised: the engine steps each request alone instead (and says why)."""
    print(f"ditserve dit: batched scheduler step failed ({type(exc).__name__}: {exc}); "
          "stepping each request with its own scheduler", file=sys.stderr, flush=True)
