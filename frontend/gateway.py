"""The front end's only way to tritonserver: gRPC streaming to the `<task>_stream` models.

Each generation is one request on its own gRPC stream, with a request id of its own. When the
generator is closed early (the HTTP client went away, a job was deleted) the generation is
cancelled by that id through the pipeline's `cancel` model (stages/cancel.py): dit ends it at
its next step boundary and the stream ends with a CANCELLED error, read in the background and
dropped (the server counts it in `ditserve_requests_cancelled_total`). The gRPC call itself is
not cancelled: a cancel that crosses the final response can segfault Triton 2.51's gRPC front
end (docs/reliability.md, "Known crash of Triton 2.51 under client cancels"). Only when the
cancel model cannot be reached, or the stream runs on for READ_ON_TIMEOUT_S, is the call cancelled.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from ditserve.client import MEDIA_OUTPUT, GenerationRequest, cancel_inputs
from ditserve.pipelines import PipelineNames, split_model_name

from .errors import APIError, from_server_message, unavailable
from .requests import task_of


@dataclass
class Progress:
    done: int
    total: int


@dataclass
class Final:
    seed: int
    image: np.ndarray | None = None   # txt2img: uint8 [H, W, 3]
    mp4: bytes | None = None          # videos: H.264 in MP4
    cache_hits: int = 0               # denoise steps the request's `quality` tier reused


READ_ON_TIMEOUT_S = 300.0   # a cancelled generation's gRPC call is cancelled if it runs this long after
_TASKS: set[asyncio.Task] = set()   # each stream's reader until its stream ends, each cancel (held against GC)


def _hold(task: asyncio.Task) -> asyncio.Task:
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


async def _read_into(stream, responses: asyncio.Queue) -> None:
    """Pump one gRPC stream's (result, error) pairs into `responses`: then None at its end, or
    the exception that ended it. A task of its own, so that cancelling the HTTP request's task
    does not cancel the gRPC call (grpc.aio cancels a call whose reader is cancelled)."""
    try:
        async for item in stream:
            responses.put_nowait(item)
    except Exception as exc:  # noqa: BLE001 - handed to generate(), which raises it
        responses.put_nowait(exc)
        return
    responses.put_nowait(None)


class TritonGateway:
    """Readiness, the served tasks and streamed generations of one tritonserver."""

    def __init__(self, url: str):
        self.url = url
        self._client = grpcaio.InferenceServerClient(url)

    async def close(self) -> None:
        await self._client.close()

    async def task_states(self) -> dict[str, str]:
        """Each public task's model id in Triton's repository index (`txt2img`, or a named
        pipeline's `pixart_txt2img`): `READY` when its unary and `_stream` models both are, else
        the state of one that is not (`LOADING`, `UNAVAILABLE`, `MISSING`)."""
        try:
            index = await self._client.get_model_repository_index(as_json=True)
        except InferenceServerException as exc:
            raise unavailable(f"tritonserver at {self.url} is not reachable: {exc.message()}") from None
        states = {m["name"]: m.get("state") or "UNKNOWN" for m in index.get("models", [])}
        ids = {name.removesuffix("_stream") for name in states
               if (split_model_name(name)[1] or "").removesuffix("_stream") in MEDIA_OUTPUT}
        tasks = {}
        for model_id in sorted(ids):
            pair = [states.get(name, "MISSING") for name in (model_id, f"{model_id}_stream")]
            tasks[model_id] = next((state for state in pair if state != "READY"), "READY")
        return tasks

    async def served_tasks(self) -> list[str]:
        """Public tasks whose unary and `_stream` models are both loaded and ready."""
        return [task for task, state in (await self.task_states()).items() if state == "READY"]

    async def check_ready(self, task: str) -> None:
        """503 unless the server is up and `<task>_stream` is ready (before any work is queued)."""
        try:
            ready = await self._client.is_server_ready() and await self._client.is_model_ready(f"{task}_stream")
        except InferenceServerException as exc:
            raise unavailable(f"tritonserver at {self.url} is not reachable: {exc.message()}") from None
        if not ready:
            raise unavailable(f"tritonserver at {self.url} is not ready to serve {task}_stream")

    async def generate(self, task: str, request: GenerationRequest) -> AsyncIterator[Progress | Final]:
        """One `Progress` per denoise step, then one `Final`; an `APIError` on failure."""
        image = task_of(task) == "txt2img"
        media = MEDIA_OUTPUT["txt2img"] if image else "video_mp4"
        outputs = [grpcaio.InferRequestedOutput(name) for name in (media, "seed", "progress", "cache_hits")]
        sent = asyncio.Event()   # keeps the request side of the stream open until the result came
        request_id = uuid.uuid4().hex

        async def requests():
            yield {"model_name": f"{task}_stream", "inputs": request.infer_inputs(grpcaio), "outputs": outputs,
                   "request_id": request_id}
            await sent.wait()

        stream = self._client.stream_infer(requests())
        responses: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        reader = _hold(loop.create_task(_read_into(stream, responses)))
        finished = False
        try:
            while (item := await responses.get()) is not None:
                if isinstance(item, Exception):
                    finished = True
                    raise (_rpc_error(item) if isinstance(item, grpc.aio.AioRpcError) else item) from None
                result, error = item
                if error is not None:
                    finished = True
                    raise from_server_message(error.message())
                if result.get_output(media) is None:
                    yield Progress(*(int(v) for v in result.as_numpy("progress")))
                    continue
                finished = True
                value = result.as_numpy(media)
                seed, hits = (int(result.as_numpy(name)[0]) for name in ("seed", "cache_hits"))
                yield Final(seed, image=value, cache_hits=hits) if image \
                    else Final(seed, mp4=bytes(value.reshape(-1)[0]), cache_hits=hits)
                return
            raise APIError(502, f"{task}_stream ended without a result", type="server_error")
        finally:
            sent.set()
            if not finished:   # closed early: the client left or the job was deleted
                deadline = loop.call_later(READ_ON_TIMEOUT_S, stream.cancel)
                reader.add_done_callback(lambda _: deadline.cancel())
                _hold(loop.create_task(self._cancel(task, request_id, stream)))

    async def _cancel(self, task: str, request_id: str, stream) -> None:
        """Cancel generation `request_id` of `task`'s pipeline through its `cancel` model; the
        gRPC call itself only where that model cannot take it (a repository rendered without it)."""
        name = PipelineNames(split_model_name(task)[0]).model("cancel")
        try:
            await self._client.infer(name, cancel_inputs(grpcaio, request_id))
        except InferenceServerException:
            stream.cancel()


def _rpc_error(exc: grpc.aio.AioRpcError) -> APIError:
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return unavailable(f"tritonserver is not reachable: {exc.details()}")
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, f"tritonserver: {exc.details()}", type="timeout")
    return APIError(502, f"tritonserver: {exc.code().name}: {exc.details()}", type="server_error")
