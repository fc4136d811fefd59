"""The FastAPI application: security defaults, `/v1/models`, health, the page, and the routers."""
from __future__ import annotations

import hmac
import shutil
import sys
import tempfile
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse

from . import images, media, videos
from .errors import APIError, invalid
from .gateway import TritonGateway
from .media import MediaStore

STATIC = Path(__file__).resolve().parent / "static"
# The page's own script and style are inline; images and videos arrive as data:/blob: URLs.
PAGE_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
               "img-src data: blob:; media-src blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@dataclass
class Settings:
    """How the front end is exposed; the defaults suit a port that faces users."""

    triton_url: str = "127.0.0.1:8001"      # tritonserver's gRPC address
    api_key: str | None = None              # if set, /v1/* needs `Authorization: Bearer <key>`
    max_n: int = 4                          # cap on `n` of one image request
    max_body_bytes: int = 16 * 2**20        # request bodies above this are refused (413)
    max_video_jobs: int = 32
    cors_origins: list[str] = field(default_factory=list)   # none: no cross-origin access
    media_dir: str | None = None            # stored results (response_format url, video jobs); None: a temp dir
    media_max_files: int = 1000             # the store keeps the newest files within both bounds
    media_max_bytes: int = 2 * 2**30


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.gateway = TritonGateway(settings.triton_url)   # its gRPC channel needs the server's loop
        # Without --media-dir the files are this process's alone: a new temporary folder, removed at exit.
        media_dir = settings.media_dir or tempfile.mkdtemp(prefix="ditserve-media-")
        app.state.media = MediaStore(media_dir, settings.media_max_files, settings.media_max_bytes)
        app.state.video_jobs = videos.VideoJobs(settings.max_video_jobs, app.state.media)
        print(f"[frontend] stored results (response_format url, video jobs) in {media_dir}", file=sys.stderr,
              flush=True)
        yield
        await app.state.gateway.close()
        if settings.media_dir is None:
            shutil.rmtree(media_dir, ignore_errors=True)

    app = FastAPI(title="ditserve OpenAI-compatible front end", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.settings = settings

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def bad_body(_request: Request, exc: RequestValidationError):
        problem = exc.errors()[0]
        where = [str(part) for part in problem.get("loc", ()) if part not in ("body", "query", "path")]
        param = where[-1] if where else None
        message = f"{param or 'body'}: {problem.get('msg')}"
        got = problem.get("input")
        if problem.get("type") != "missing" and got is not None and not isinstance(got, dict):
            message += f" (got {got!r})"
        return invalid(param, message).response()

    @app.get("/v1/models")
    async def models():
        tasks = await app.state.gateway.served_tasks()
        return {"object": "list", "data": [{"id": task, "object": "model", "created": 0, "owned_by": "ditserve"}
                                           for task in tasks]}

    @app.get("/health")
    async def health():
        """200 when tritonserver is ready, 503 (with the reason) otherwise; needs no key."""
        try:
            tasks = await app.state.gateway.served_tasks()
        except APIError as exc:
            return exc.response()
        if not tasks:
            return JSONResponse({"status": "not ready", "models": []}, status_code=503)
        return {"status": "ok", "models": tasks}

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": PAGE_POLICY,
                                                            "X-Content-Type-Options": "nosniff"})

    app.include_router(images.router)
    app.include_router(videos.router)
    app.include_router(media.router)
    # Starlette runs the middleware added last first: the size limit, then the key, then CORS.
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    return app


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on every /v1/ path when a key is set (as `vllm serve --api-key`)."""

    def __init__(self, app, api_key: str | None):
        self.app, self.expected = app, f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if self.expected and scope["type"] == "http" and scope["path"].startswith("/v1/") \
                and scope["method"] != "OPTIONS":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                    type="authentication_error", code="invalid_api_key").response()
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: by its Content-Length, or while it streams in chunked."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _error(self) -> APIError:
        return APIError(413, f"request body over the limit of {self.max_bytes} bytes (--max-body-bytes)",
                        code="body_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and int(length) > self.max_bytes:
            return await self._error().response()(scope, receive, send)
        seen, refused = 0, False

        async def counted():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:   # answer 413 now; to the app the client has gone
                refused = True
                await self._error().response()(scope, receive, send)
                return {"type": "http.disconnect"}
            return message

        async def unless_refused(message):
            if not refused:
                await send(message)

        await self.app(scope, counted, unless_refused)
