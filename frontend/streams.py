"""Running generations for one HTTP request: n at once, as SSE, and cancelled with it.

`n > 1` is n Triton requests sent together, so dit batches them step by step like any
concurrent requests. Whatever ends the HTTP request early (the client disconnects, an
error in one of the n) cancels the generations still running.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from ditserve.client import GenerationRequest

from .errors import APIError
from .gateway import Final, Progress, TritonGateway

T = TypeVar("T")


async def merged(gateway: TritonGateway, task: str,
                 requests: list[GenerationRequest]) -> AsyncIterator[tuple[int, Progress | Final]]:
    """(index, event) from all generations as they come; the first error cancels the rest."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, request: GenerationRequest) -> None:
        try:
            async with aclosing(gateway.generate(task, request)) as events:
                async for event in events:
                    await queue.put((index, event))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((index, exc))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
    try:
        remaining = len(tasks)
        while remaining:
            index, event = await queue.get()
            if isinstance(event, Exception):
                raise event
            remaining -= isinstance(event, Final)
            yield index, event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(gateway: TritonGateway, task: str, requests: list[GenerationRequest],
                  on_progress: Callable[[int, Progress], None] | None = None) -> list[Final]:
    """The n results in request order."""
    finals: list[Final | None] = [None] * len(requests)
    async with aclosing(merged(gateway, task, requests)) as events:
        async for index, event in events:
            if isinstance(event, Final):
                finals[index] = event
            elif on_progress:
                on_progress(index, event)
    return finals  # type: ignore[return-value]


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so its generations on the server) if the client leaves."""
    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not job.done():
            job.cancel()
    if not job.done() or job.cancelled():
        raise APIError(499, "client closed the request; its generations were cancelled", code="client_closed")
    return job.result()


def sse(event_type: str, payload: dict) -> str:
    return f"event: {event_type}\ndata: {json.dumps({'type': event_type, **payload})}\n\n"


async def event_stream(events: AsyncIterator[tuple[int, Progress | Final]],
                       render: Callable[[int, Progress | Final], Awaitable[tuple[str, dict]]]) -> StreamingResponse:
    """An SSE response of `render`ed events (awaited: rendering an image encodes it off the event
    loop). The first event is awaited before the response starts, so a request the server rejects
    still gets its HTTP error status."""
    try:
        first = await anext(events)
    except BaseException:
        await events.aclose()
        raise

    async def body():
        async with aclosing(events):
            yield sse(*await render(*first))
            try:
                async for index, event in events:
                    yield sse(*await render(index, event))
            except APIError as exc:   # after the 200: the error travels as an event
                yield sse("error", exc.body())

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
