"""The first request after READY should cost what a warm one does.

`adapter.warm_up` (accel.py) runs each stage's model forwards at load; what it leaves cold is the
code around them on the request path: the scheduler step and NaN checks, the first copies to the
host, DLPack hand-offs into pb_utils tensors, response objects (on a GPU, each CUDA kernel's
first launch loads it lazily). Each stage therefore runs its own request path once in
`initialize`, on a made-up request, with fault injection off and nothing kept:

  text_encoder  Triton's `model_warmup` (model_repository/text_encoder/config.pbtxt): two
                requests of empty texts through the real execute, stub IPC and shared memory
  dit           a 2-step generation per [accel] warm size (else of the default size) through a
                private StepEngine; with `[engine] scheduler = "cost"`, forwards of 1..capacity
                requests (scheduler.profile_sizes) of those sizes (with and without CFG) time
                its cost curve
  vae_decode    a decode per warm size (else of the default size) through the stage's batch path
  generate      the hand-off store, BLS request objects and the final response

BLS is not supported in `initialize` (python_backend README) and Triton's `model_warmup` of a
public model would call models that may not be loaded yet, so the public models' first BLS
calls stay cold. `ExecuteClock` logs each instance's first executes, so a GPU run shows what
the first request still pays and where.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import triton_python_backend_utils as pb_utils

from ..deployment import Deployment
from ..schema import GenerationParams, check_params

LOGGED_EXECUTES = 4   # the warm-up's executes (text_encoder) and the first requests'


def warm_request(deployment: Deployment) -> GenerationParams:
    """A request of the deployment's default size with the fewest steps allowed (at least 2, so a
    multistep scheduler's second step runs too) and no CFG rows (the warm-up has no negative text)."""
    steps = max(2, deployment.limits.min_steps)
    params = GenerationParams("warm up", "", deployment.defaults.height, deployment.defaults.width, steps, 0.0, 0,
                              num_frames=deployment.defaults.num_frames, cfg=deployment.uses_cfg)
    return check_params(params, deployment)


def warm_requests(adapter) -> list[GenerationParams]:
    """One made-up request per [accel] warm size (the shapes compiled and captured at load: the
    served path of those runs the graphs), else one of the default size."""
    return adapter.warm_params() or [warm_request(adapter.deployment)]


def cost_curve_requests(adapter) -> list[GenerationParams]:
    """The shapes whose step-batch cost the `cost` scheduler measures at load: each warm request,
    and its CFG variant where the deployment guides by default (twice the rows, another compat key)."""
    out = []
    for params in warm_requests(adapter):
        out.append(params)
        guided = replace(params, guidance_scale=adapter.deployment.defaults.guidance_scale)
        if guided.do_cfg:
            out.append(guided)
    return out


def warm_request_path(model_name: str, run: Callable[[], None]) -> None:
    """Run a stage's request path once and log what it took. `run` keeps the deployment's fault
    rules out (a rule for every request must not fail the load)."""
    start = time.perf_counter()
    run()
    pb_utils.Logger.log_info(f"{model_name}: warmed its request path in {1000 * (time.perf_counter() - start):.1f} ms")


class ExecuteClock:
    """Logs how long an instance's first executes take: on a GPU the first request after READY
    has been 1.2-1.8x a warm one, and these lines say which stage it still waits in."""

    def __init__(self, instance: str):
        self.instance = instance
        self.seen = 0

    def run(self, execute: Callable, requests: list):
        if self.seen >= LOGGED_EXECUTES:
            return execute(requests)
        self.seen += 1
        start = time.perf_counter()
        try:
            return execute(requests)
        finally:
            pb_utils.Logger.log_info(f"{self.instance}: execute {self.seen} took "
                                     f"{1000 * (time.perf_counter() - start):.1f} ms ({len(requests)} request(s))")
