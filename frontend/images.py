"""`POST /v1/images/generations`: OpenAI's image API over `txt2img_stream`."""
from __future__ import annotations

import asyncio
import base64
import io
import time
from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np
from fastapi import APIRouter, Request
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from ditserve.client import GenerationRequest

from .errors import invalid
from .gateway import Final, Progress
from .media import stored_url
from .requests import cache_tier, check_n, choose_model, one_per_image, parse_size, size_text
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
    output_format: Literal["png", "jpeg", "webp"] | None = "png"
    output_compression: int | None = Field(default=None, ge=0, le=100)   # jpeg / webp quality; OpenAI's default 100
    stream: bool = False
    user: str | None = None              # accepted, unused
    seed: int | None = Field(default=None, ge=0)
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    quality: str | None = None           # the deployment's cache tier (docs/cache.md); `auto`: its default

    def generation(self) -> GenerationRequest:
        height, width = parse_size(self.size)
        return GenerationRequest(self.prompt, self.negative_prompt, height, width, self.num_inference_steps,
                                 self.guidance_scale, self.seed, quality=cache_tier(self.quality))

    def encoding(self) -> "Encoding":
        """How each image is written; `output_compression` is the quality of the lossy formats only."""
        output_format = self.output_format or "png"
        if output_format == "png" and self.output_compression is not None:
            raise invalid("output_compression", "output_compression applies to output_format 'jpeg' and 'webp' "
                          "only; PNG is lossless")
        if self.output_compression is None:
            return Encoding(output_format)
        return Encoding(output_format, self.output_compression)


@dataclass(frozen=True)
class Encoding:
    """An image file format and, for the lossy ones, its quality (0-100). The encoder's speed is the
    front end's own latency: at 1024x1024, Pillow's PNG takes 30-140 ms (zlib level 1, below: 2.4x
    faster than its default level 6, files ~1.4x larger), JPEG 3-9 ms, WebP at its fastest
    method 17-80 ms (perf/results/2026-12-05-h100-frontend-s42.md). JPEG at quality 90 or more keeps
    full-resolution colour (4:4:4, as ImageMagick does): Pillow's default 4:2:0 caps a detailed
    picture's PSNR whatever the quality (perf/results/2026-12-05-cpu-frontend-encode.md)."""

    format: str = "png"
    quality: int = 100

    def encode(self, image: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        options = {"png": {"compress_level": 1},
                   "jpeg": {"quality": self.quality, "subsampling": 0 if self.quality >= 90 else 2},
                   "webp": {"quality": self.quality, "method": 0}}[self.format]
        Image.fromarray(image).save(buffer, format=self.format.upper(), **options)
        return buffer.getvalue()


async def encoded(finals: list[Final], encoding: Encoding) -> list[bytes]:
    """The images' files, encoded in worker threads: Pillow's encoders release the GIL, so the n
    images of a request encode side by side, and the event loop keeps serving other requests'
    events meanwhile (a 1024px PNG takes 30-140 ms)."""
    return list(await asyncio.gather(*(asyncio.to_thread(encoding.encode, final.image) for final in finals)))


def image_data(final: Final, data: bytes, formats: set[str], request: Request, encoding: Encoding) -> dict:
    """One item of `data`: the image file `data` in each of `formats` (`b64_json`, `url`), plus the
    `seed` used and the steps its quality tier reused."""
    item = {"url": stored_url(request, data, f".{encoding.format}")} if "url" in formats else {}
    if "b64_json" in formats:
        item["b64_json"] = base64.b64encode(data).decode("ascii")
    return {**item, "revised_prompt": None, "seed": final.seed, "cache_hits": final.cache_hits}


@router.post("/v1/images/generations")
async def generate_images(body: ImageGenerationBody, request: Request):
    app = request.app.state
    check_n(body.n, app.settings.max_n)
    encoding = body.encoding()
    task = choose_model(body.model, await app.gateway.task_states(), ("txt2img",), "txt2img")
    await app.gateway.check_ready(task)
    requests = one_per_image(body.generation(), body.n)
    created = int(time.time())
    if body.stream:   # OpenAI streams the image in b64_json; `url` adds a link to the stored file
        render = partial(_render_event, formats={"b64_json", body.response_format or "b64_json"},
                         quality=body.quality or "auto", request=request, encoding=encoding)
        return await event_stream(merged(app.gateway, task, requests), render)
    finals = await unless_disconnected(request, collect(app.gateway, task, requests))
    formats = {body.response_format or "b64_json"}
    files = await encoded(finals, encoding)
    items = [image_data(final, data, formats, request, encoding) for final, data in zip(finals, files)]
    return {"created": created, "data": items,
            "output_format": encoding.format, "size": size_text(*finals[0].image.shape[:2]),
            "quality": body.quality or "auto"}


async def _render_event(index: int, event: Progress | Final, formats: set[str], quality: str,
                        request: Request, encoding: Encoding) -> tuple[str, dict]:
    """SSE: `image_generation.progress` per denoise step of each image, then its
    `image_generation.completed` (the shape OpenAI streams, plus `index`, `seed`, `cache_hits`
    and `url` when asked for)."""
    now = int(time.time())
    if isinstance(event, Progress):
        return "image_generation.progress", {"index": index, "step": event.done, "total_steps": event.total,
                                             "created_at": now}
    [data] = await encoded([event], encoding)
    return "image_generation.completed", {
        "index": index, **image_data(event, data, formats, request, encoding), "created_at": now,
        "size": size_text(*event.image.shape[:2]), "output_format": encoding.format, "background": "opaque",
        "quality": quality}
