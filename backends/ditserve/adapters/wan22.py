"""Wan2.2 A14B text-to-video: WanPipeline with two experts, over the Wan2.1 step contract (wan.py).

Mirrors `WanPipeline.__call__` with `boundary_ratio` set: a step whose timestep t satisfies
t >= boundary_ratio x num_train_timesteps runs the high-noise expert `transformer`, a later
one the low-noise expert `transformer_2`. Each request's per-step plan is fixed when it is
admitted (`step_modules`), and the engine groups requests by the expert of their next step
(RequestState.compat_key), so a step batch straddling the boundary runs one forward per expert.

`guidance_scale` guides the high-noise expert's steps and, unless the request sets input
`guidance_scale_2`, the low-noise expert's too (diffusers' `guidance_scale_2`, whose default is
`guidance_scale`). As in diffusers, CFG rows run iff guidance_scale > 1, whatever the second
scale (the schema refuses a guidance_scale_2 > 1 that would have no CFG to act on). Everything
else (UMT5 text, float32 latents, flow UniPC, Wan VAE) is Wan2.1's.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from ..state import RequestState, TextConditioning
from .wan import WanT2VAdapter

EXPERTS = ("transformer", "transformer_2")   # high-noise, low-noise


class Wan22T2VAdapter(WanT2VAdapter):
    family = "wan22-t2v"
    # No quality tiers yet: a request's First-Block Cache would carry one expert's residuals
    # into the other's steps, and the cached forward runs `transformer` only.
    cache_blocks = None

    @property
    def transformer_modules(self) -> tuple[str, ...]:
        return EXPERTS

    @property
    def boundary_timestep(self) -> float:
        return self.pipe.config.boundary_ratio * self.pipe.scheduler.config.num_train_timesteps

    def step_modules(self, timesteps: torch.Tensor) -> tuple[str, ...]:
        boundary = self.boundary_timestep
        return tuple(EXPERTS[0] if t >= boundary else EXPERTS[1] for t in timesteps.tolist())

    def guidance_scale(self, state: RequestState) -> float:
        second = state.params.guidance_scale_2
        return second if state.module == EXPERTS[1] and second is not None else state.params.guidance_scale

    def forward_for(self, module: str) -> Callable[[torch.Tensor, torch.Tensor, TextConditioning], torch.Tensor]:
        return partial(self.run_transformer, getattr(self.pipe, module))

    def check_limits(self, stage: str) -> None:
        if stage == "dit" and self.pipe.transformer_2 is None:
            raise ValueError(f"{self.deployment.model.path} has boundary_ratio={self.pipe.config.boundary_ratio} but "
                             f"no transformer_2 (the low-noise expert)")
        super().check_limits(stage)
