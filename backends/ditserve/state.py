"""Per-request state of one generation inside the step engine.

Everything that differs between requests lives here, never on the shared pipeline:
its own scheduler instance (multistep solvers keep history), its own generator,
latents and text conditioning, all on the serving device.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .schema import GenerationParams


@dataclass
class TextConditioning:
    """Prompt embeddings for one request: row 0 = negative (only with CFG), last row = prompt.

    `extra` holds a family's other per-request conditioning, by name: with batch dim 1 it is
    shared by the CFG rows (Wan2.1 I2V: CLIP image embeddings and the first-frame condition
    latents; FLUX.1: its guidance), with one row per text row it goes with its row (FLUX.1's
    pooled CLIP embedding). Empty for PixArt and Wan2.1 T2V.
    """

    embeds: torch.Tensor      # [1 or 2, L, D]
    mask: torch.Tensor        # [1 or 2, L]
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class RequestState:
    key: str
    params: GenerationParams
    scheduler: Any                       # a diffusers SchedulerMixin, one per request
    timesteps: torch.Tensor
    latents: torch.Tensor                # [1, C, h, w] (image) or [1, C, f, h, w] (video)
    cond: TextConditioning
    generator: torch.Generator
    step_kwargs: dict = field(default_factory=dict)
    step_index: int = 0
    admitted_at: float = field(default_factory=time.monotonic)
    first_step_at: float | None = None
    last_seen: float = field(default_factory=time.monotonic)
    # The NaN/inf check of its latest step, not read yet (engine.StepChecks): read at its next step.
    unchecked: Any = None
    # Its First-Block Cache (cache.RowCache) when it asked for a lossy `quality` tier, else None.
    cache: Any = None
    # The transformer module (pipeline component) each step's forward runs, from the adapter's
    # `step_modules`: Wan2.2's high-noise `transformer`, then its low-noise `transformer_2`.
    # Empty: every step runs `transformer`.
    modules: tuple[str, ...] = ()

    @property
    def total_steps(self) -> int:
        return len(self.timesteps)

    @property
    def done(self) -> bool:
        return self.step_index >= self.total_steps

    @property
    def timestep(self) -> torch.Tensor:
        return self.timesteps[self.step_index]

    @property
    def module(self) -> str:
        """The transformer module of this request's next forward."""
        return self.modules[self.step_index] if self.modules else "transformer"

    @property
    def compat_key(self) -> tuple:
        """Requests with equal keys can share one transformer forward.

        Shape (latent size) and CFG on/off change tensor shapes; the timestep does not
        (it is a per-sample tensor), nor does the step count. Extra conditioning (its
        names, shapes and dtypes) tells conditioning kinds apart: image-to-video requests
        carry a condition video and image embeddings that text-to-video ones lack. The module
        of the next forward is part of it: one forward runs one module, so a step batch whose
        rows need different experts (Wan2.2) splits into one forward per expert.
        """
        extra = tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(self.cond.extra.items()))
        return (tuple(self.latents.shape), self.params.do_cfg, self.latents.dtype, extra, self.module)
