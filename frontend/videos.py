"""Videos, in the shape vLLM-Omni serves `/v1/videos` (OpenAI's video job API):

- `POST /v1/videos` (multipart form) starts a job and answers its record at once;
  `GET /v1/videos/{id}` polls it, `GET /v1/videos/{id}/content` downloads the MP4,
  `GET /v1/videos` lists jobs, `DELETE /v1/videos/{id}` cancels and forgets one;
- `POST /v1/videos/sync` answers the MP4 itself, or with `stream=true` SSE progress
  events and then the MP4 in base64.

`input_reference` (an image file) makes it img2vid. Jobs live in this process's memory,
at most `--max-video-jobs` of them (finished ones are dropped oldest first), so a restart
forgets them; their MP4s are files of the media store (frontend/media.py), bounded apart.
"""
from __future__ import annotations

import asyncio
import base64
import io
import time
import uuid
from collections import OrderedDict
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from fastapi import APIRouter, Depends, Form, Request, UploadFile
from fastapi.responses import FileResponse, Response
from PIL import Image, UnidentifiedImageError

from ditserve.client import GenerationRequest

from .errors import APIError, invalid
from .gateway import Final, Progress, TritonGateway
from .media import MediaStore, stored_url
from .requests import cache_tier, choose_model, frames_for_seconds, parse_size, task_of
from .streams import collect, event_stream, merged, unless_disconnected

router = APIRouter()
VIDEO_TASKS = ("txt2vid", "img2vid")


@dataclass
class VideoForm:
    """The form fields of `POST /v1/videos` and `/v1/videos/sync` (vLLM-Omni's names)."""

    prompt: str = Form()
    model: str | None = Form(None)
    size: str | None = Form(None)
    seconds: float | None = Form(None)
    num_frames: int | None = Form(None)
    fps: int | None = Form(None)
    num_inference_steps: int | None = Form(None)
    guidance_scale: float | None = Form(None)
    guidance_scale_2: float | None = Form(None)   # Wan2.2 A14B: the low-noise expert's; other models refuse it
    seed: int | None = Form(None, ge=0)
    negative_prompt: str | None = Form(None)
    quality: str | None = Form(None)       # the deployment's cache tier (docs/cache.md); `auto`: its default
    user: str | None = Form(None)          # accepted, unused
    input_reference: UploadFile | None = None

    async def generation(self) -> tuple[str | None, GenerationRequest]:
        """(model asked for, request); the MP4 is always asked for."""
        height, width = parse_size(self.size)
        frames = self.num_frames
        if frames is None and self.seconds is not None:
            frames = frames_for_seconds(self.seconds, self.fps)
        image = await _read_image(self.input_reference) if self.input_reference else None
        return self.model, GenerationRequest(self.prompt, self.negative_prompt, height, width,
                                             self.num_inference_steps, self.guidance_scale, self.seed, frames,
                                             self.fps, "mp4", image, cache_tier(self.quality),
                                             self.guidance_scale_2)

    def seconds_text(self, request: GenerationRequest) -> str:
        if request.num_frames and request.fps:
            return f"{request.num_frames / request.fps:g}"
        return f"{self.seconds:g}" if self.seconds else "auto"


async def _read_image(upload: UploadFile) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(await upload.read())) as image:
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError) as exc:
        raise invalid("input_reference", f"input_reference is not an image PIL can read: {exc}") from None


async def _task_and_request(form: VideoForm, request: Request) -> tuple[str, GenerationRequest]:
    model, generation = await form.generation()
    default = "img2vid" if generation.image is not None else "txt2vid"
    task = choose_model(model, await request.app.state.gateway.task_states(), VIDEO_TASKS, default)
    if (task_of(task) == "img2vid") != (generation.image is not None):
        raise invalid("input_reference", "img2vid needs an input_reference image" if task_of(task) == "img2vid"
                      else f"{task} takes no input_reference; send it to model 'img2vid'")
    await request.app.state.gateway.check_ready(task)
    return task, generation


@dataclass
class VideoJob:
    id: str
    model: str
    prompt: str
    size: str
    seconds: str
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "queued"          # queued -> in_progress (first step done) -> completed | failed
    progress: int = 0               # percent of the denoise steps done
    completed_at: int | None = None
    error: dict | None = None
    seed: int | None = None
    media: str | None = None        # the MP4's name in the media store, once completed
    runner: asyncio.Task | None = None

    def record(self) -> dict:
        return {"id": self.id, "object": "video", "model": self.model, "status": self.status,
                "progress": self.progress, "created_at": self.created_at, "completed_at": self.completed_at,
                "expires_at": None, "prompt": self.prompt, "size": self.size, "seconds": self.seconds,
                "remixed_from_video_id": None, "error": self.error, "seed": self.seed}

    def on_progress(self, _index: int, progress: Progress) -> None:
        self.status = "in_progress"
        self.progress = min(99, progress.done * 100 // progress.total)


class VideoJobs:
    """The jobs of this process, oldest first; at most `limit` kept. A job dropped or deleted
    takes its MP4 out of the media store."""

    def __init__(self, limit: int, store: MediaStore):
        self.limit, self.store = limit, store
        self.jobs: OrderedDict[str, VideoJob] = OrderedDict()

    def add(self, job: VideoJob) -> None:
        if len(self.jobs) >= self.limit:
            finished = [j.id for j in self.jobs.values() if j.status in ("completed", "failed")]
            if not finished:
                raise APIError(429, f"{self.limit} video jobs are running (--max-video-jobs); retry later",
                               type="rate_limit_error", code="too_many_jobs")
            self._forget(finished[0])
        self.jobs[job.id] = job

    def _forget(self, video_id: str) -> VideoJob:
        job = self.jobs.pop(video_id)
        if job.media:
            self.store.remove(job.media)
        return job

    def get(self, video_id: str) -> VideoJob:
        if video_id not in self.jobs:
            raise APIError(404, f"no video job {video_id!r} (jobs live in the front end's memory)",
                           param="video_id", code="video_not_found")
        return self.jobs[video_id]

    async def run(self, job: VideoJob, gateway: TritonGateway, task: str, request: GenerationRequest) -> None:
        try:
            [final] = await collect(gateway, task, [request], job.on_progress)
            job.media = self.store.put(final.mp4, ".mp4")
        except APIError as exc:   # the server's rejection or failure, or an MP4 larger than the store
            job.status, job.error = "failed", {"code": exc.code or exc.type, "message": exc.message}
        else:
            job.status, job.progress, job.seed = "completed", 100, final.seed
        job.completed_at = int(time.time())

    async def delete(self, video_id: str) -> None:
        job = self._forget(self.get(video_id).id)
        if job.runner and not job.runner.done():
            job.runner.cancel()          # cancels the generation on the server
            with suppress(asyncio.CancelledError):
                await job.runner


def _jobs(request: Request) -> VideoJobs:
    return request.app.state.video_jobs


@router.post("/v1/videos")
async def create_video(request: Request, form: VideoForm = Depends()):
    task, generation = await _task_and_request(form, request)
    job = VideoJob(f"video_{uuid.uuid4().hex}", task, form.prompt, form.size or "auto", form.seconds_text(generation))
    _jobs(request).add(job)
    job.runner = asyncio.create_task(_jobs(request).run(job, request.app.state.gateway, task, generation))
    return job.record()


@router.get("/v1/videos")
async def list_videos(request: Request):
    records = [job.record() for job in reversed(_jobs(request).jobs.values())]
    return {"object": "list", "data": records, "first_id": records[0]["id"] if records else None,
            "last_id": records[-1]["id"] if records else None, "has_more": False}


@router.get("/v1/videos/{video_id}")
async def retrieve_video(video_id: str, request: Request):
    return _jobs(request).get(video_id).record()


@router.get("/v1/videos/{video_id}/content")
async def video_content(video_id: str, request: Request):
    job = _jobs(request).get(video_id)
    if job.media is None:
        raise APIError(409 if job.status != "failed" else 422, f"video {video_id} is {job.status}; its content "
                       "exists once the status is 'completed'", param="video_id", code="video_not_ready")
    return FileResponse(request.app.state.media.path(job.media), media_type="video/mp4")


@router.delete("/v1/videos/{video_id}")
async def delete_video(video_id: str, request: Request):
    await _jobs(request).delete(video_id)
    return {"id": video_id, "object": "video.deleted", "deleted": True}


@router.post("/v1/videos/sync")
async def generate_video_sync(request: Request, form: VideoForm = Depends(), stream: bool = Form(False),
                              response_format: Literal["mp4", "url"] = Form("mp4")):
    """The MP4 as the body (`response_format=mp4`), or `{"url", "seed", ...}` with a link to the
    stored file (`url`); with `stream=true`, SSE ending in the MP4 in base64."""
    task, generation = await _task_and_request(form, request)
    gateway = request.app.state.gateway
    if stream:
        return await event_stream(merged(gateway, task, [generation]), _render_event)
    [final] = await unless_disconnected(request, collect(gateway, task, [generation]))
    if response_format == "url":
        return {"created": int(time.time()), "url": stored_url(request, final.mp4, ".mp4"), "seed": final.seed,
                "cache_hits": final.cache_hits, "output_format": "mp4"}
    return Response(final.mp4, media_type="video/mp4",
                    headers={"X-Seed": str(final.seed), "X-Cache-Hits": str(final.cache_hits)})


async def _render_event(_index: int, event: Progress | Final) -> tuple[str, dict]:
    now = int(time.time())
    if isinstance(event, Progress):
        return "video_generation.progress", {"step": event.done, "total_steps": event.total, "created_at": now}
    return "video_generation.completed", {"b64_json": base64.b64encode(event.mp4).decode("ascii"),
                                          "seed": event.seed, "cache_hits": event.cache_hits, "created_at": now,
                                          "output_format": "mp4"}
