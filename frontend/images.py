"""`POST /v1/images/generations`: OpenAI's image API over `txt2img_stream`."""
from __future__ import annotations

import base64
import io
import time
from typing import Literal

import numpy as np
from fastapi import APIRouter, Request
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from ditserve.client import GenerationRequest

from .errors import invalid
from .gateway import Final, Progress
from .requests import check_n, choose_model, one_per_image, parse_size, size_text
from .streams import collect, event_stream, merged, unless_disconnected

router = APIRouter()


class ImageGenerationBody(BaseModel):
    """OpenAI's request body, plus the diffusion extras; unknown fields are refused by name."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    model: str | None = None
    n: int = 1
    size: str | None = "auto"
    response_format: Literal["b64_json", "url"] | None = "b64_json"
    output_format: Literal["png"] | None = "png"
    stream: bool = False
    user: str | None = None              # accepted, unused
    seed: int | None = Field(default=None, ge=0)
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None

    def generation(self) -> GenerationRequest:
        height, width = parse_size(self.size)
        return GenerationRequest(self.prompt, self.negative_prompt, height, width, self.num_inference_steps,
                                 self.guidance_scale, self.seed)


def png_b64(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def image_data(final: Final) -> dict:
    return {"b64_json": png_b64(final.image), "revised_prompt": None, "seed": final.seed}


@router.post("/v1/images/generations")
async def generate_images(body: ImageGenerationBody, request: Request):
    app = request.app.state
    if body.response_format == "url":
        raise invalid("response_format", "response_format 'url' is not supported: this server stores no images; "
                                         "use 'b64_json'")
    check_n(body.n, app.settings.max_n)
    task = choose_model(body.model, await app.gateway.served_tasks(), ("txt2img",), "txt2img")
    await app.gateway.check_ready(task)
    requests = one_per_image(body.generation(), body.n)
    created = int(time.time())
    if body.stream:
        return await event_stream(merged(app.gateway, task, requests), _render_event)
    finals = await unless_disconnected(request, collect(app.gateway, task, requests))
    return {"created": created, "data": [image_data(f) for f in finals], "output_format": "png",
            "size": size_text(*finals[0].image.shape[:2])}


def _render_event(index: int, event: Progress | Final) -> tuple[str, dict]:
    """SSE: `image_generation.progress` per denoise step of each image, then its
    `image_generation.completed` (the shape OpenAI streams, plus `index` and `seed`)."""
    now = int(time.time())
    if isinstance(event, Progress):
        return "image_generation.progress", {"index": index, "step": event.done, "total_steps": event.total,
                                             "created_at": now}
    height, width = event.image.shape[:2]
    return "image_generation.completed", {
        "index": index, "b64_json": png_b64(event.image), "seed": event.seed, "created_at": now,
        "size": size_text(height, width), "output_format": "png", "background": "opaque", "quality": "auto"}
