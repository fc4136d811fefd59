"""What an OpenAI-style request asks for, checked and turned into `GenerationRequest`s.

Only what the front end itself must decide is checked here (the body's shape, `size`,
`n`, `model`); every range (sizes, steps, guidance, frames) is the deployment's and is
checked by the server, whose message is passed through unchanged.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ditserve.client import GenerationRequest
from ditserve.pipelines import split_model_name

from .errors import APIError, invalid, unavailable

_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def parse_size(size: str | None) -> tuple[int | None, int | None]:
    """OpenAI's `WIDTHxHEIGHT` as (height, width); `auto` or nothing keeps the deployment's size."""
    if size in (None, "", "auto"):
        return None, None
    match = _SIZE.match(size)
    if not match:
        raise invalid("size", f"size {size!r} must be 'WIDTHxHEIGHT' (e.g. '64x64') or 'auto'")
    return int(match.group(2)), int(match.group(1))


def size_text(height: int, width: int) -> str:
    return f"{width}x{height}"


def cache_tier(quality: str | None) -> str | None:
    """OpenAI's `quality` as the server's cache tier (docs/cache.md). `auto`, OpenAI's default,
    leaves the deployment's default (lossless); any other value goes to the server, whose
    validation names the tiers it enables."""
    return None if quality in (None, "", "auto") else quality


def check_n(n: int, max_n: int) -> None:
    if not 1 <= n <= max_n:
        raise invalid("n", f"n={n} is out of range; allowed [1, {max_n}] (the front end's --max-n)")


def task_of(model_id: str) -> str:
    """The task behind a model id: `txt2img` for `txt2img` and for a named pipeline's
    `pixart_txt2img` (docs/pipelines.md)."""
    return split_model_name(model_id)[1] or model_id


def choose_model(model: str | None, states: dict[str, str], allowed: tuple[str, ...], default: str) -> str:
    """The Triton model id for a request's `model`, given the ids' states (TritonGateway.task_states):
    503 for one Triton has but is not ready to serve (loading, failed), 404 (as OpenAI answers)
    for one it does not have. `allowed` are the endpoint's tasks; a named pipeline's ids of those
    tasks are allowed too."""
    task = model or default
    if task_of(task) in allowed and states.get(task, "READY") != "READY":
        raise unavailable(f"model {task!r} is not ready on tritonserver (state {states[task]}); "
                          "retry once GET /health answers 200")
    usable = [t for t, state in states.items() if task_of(t) in allowed and state == "READY"]
    if task not in usable:
        names = ", ".join(usable) or "none"
        raise APIError(404, f"model {task!r} is not served here; this endpoint's models: {names} (GET /v1/models)",
                       param="model", code="model_not_found")
    return task


def one_per_image(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """n requests; with a seed, image i gets seed + i so the n images differ and each is reproducible."""
    if request.seed is None:
        return [replace(request) for _ in range(n)]
    return [replace(request, seed=request.seed + i) for i in range(n)]


# Wan's VAE compresses time 4x, so a video has 4k + 1 frames; 16 fps is Wan2.1's rate.
FRAMES_STEP, DEFAULT_FPS = 4, 16


def frames_for_seconds(seconds: float, fps: int | None) -> int:
    """OpenAI's `seconds` as a frame count: the nearest 4k + 1 at the request's fps (or 16)."""
    if not 0 < seconds <= 3600:
        raise invalid("seconds", f"seconds={seconds} must be in (0, 3600]")
    return FRAMES_STEP * max(1, round(seconds * (fps or DEFAULT_FPS) / FRAMES_STEP)) + 1
