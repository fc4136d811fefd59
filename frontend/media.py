"""Generated files served back by URL (`response_format: "url"`, video job content).

One directory, bounded by a file count and a byte total; storing past either bound deletes
the oldest files first, so a URL handed out earlier can expire (its GET answers 404).
A name is 32 random URL-safe characters (192 bits) plus the extension: it cannot be guessed
or enumerated, and it is the only thing a client can name, so no path ever escapes the
directory. The GET route also sits under /v1/, behind the API key when one is set.
"""
from __future__ import annotations

import os
import re
import secrets
from collections import OrderedDict
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from .errors import APIError

MEDIA_TYPES = {".png": "image/png", ".jpeg": "image/jpeg", ".webp": "image/webp", ".mp4": "video/mp4"}
_NAME = re.compile(r"^[A-Za-z0-9_-]{32}\.(png|jpeg|webp|mp4)$")


class MediaStore:
    """Files in `directory`, at most `max_files` of them and `max_bytes` in all, oldest evicted."""

    def __init__(self, directory: Path, max_files: int, max_bytes: int):
        if max_files < 1 or max_bytes < 1:
            raise ValueError(f"media store bounds must be positive (max_files={max_files}, max_bytes={max_bytes})")
        self.directory, self.max_files, self.max_bytes = Path(directory), max_files, max_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        for partial in self.directory.glob("*.partial"):   # a write a previous run did not finish
            partial.unlink(missing_ok=True)
        # Files a previous run left here count against the bounds (oldest first by mtime).
        found = sorted((p for p in self.directory.iterdir() if _NAME.match(p.name)), key=lambda p: p.stat().st_mtime)
        self._sizes: OrderedDict[str, int] = OrderedDict((p.name, p.stat().st_size) for p in found)
        self._evict()

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes.values())

    def names(self) -> list[str]:
        """Stored names, oldest first."""
        return list(self._sizes)

    def put(self, data: bytes, suffix: str) -> str:
        """Store `data` under a new unguessable name ending in `suffix`; returns the name.

        Written in the event loop's thread: a result is a few MB at most, and a write that no
        cancellation can interrupt never leaves a file outside the index."""
        if suffix not in MEDIA_TYPES:
            raise ValueError(f"suffix {suffix!r}; the store holds {sorted(MEDIA_TYPES)}")
        if len(data) > self.max_bytes:
            raise APIError(507, f"the result ({len(data)} bytes) is larger than the media store "
                                f"(--media-max-bytes {self.max_bytes}); ask for b64_json", type="server_error",
                           code="media_store_full")
        name = secrets.token_urlsafe(24) + suffix
        _write_atomically(self.directory / name, data)
        self._sizes[name] = len(data)
        self._evict()
        return name

    def path(self, name: str) -> Path:
        """The file of a stored name; 404 for a name never stored or evicted since."""
        if not _NAME.match(name) or name not in self._sizes:
            raise APIError(404, f"no stored file {name!r}: it expired (the store keeps the newest "
                                f"{self.max_files} files, {self.max_bytes} bytes at most) or never existed",
                           param="name", code="media_not_found")
        return self.directory / name

    def remove(self, name: str) -> None:
        if self._sizes.pop(name, None) is not None:
            (self.directory / name).unlink(missing_ok=True)

    def _evict(self) -> None:
        while len(self._sizes) > self.max_files or self.total_bytes > self.max_bytes:
            self.remove(next(iter(self._sizes)))


def _write_atomically(path: Path, data: bytes) -> None:
    """Write beside `path`, then rename: a reader never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def media_type(name: str) -> str:
    return MEDIA_TYPES[Path(name).suffix]


router = APIRouter()


@router.get("/v1/media/{name}", name="media_file")
async def media_file(name: str, request: Request) -> FileResponse:
    path = request.app.state.media.path(name)
    return FileResponse(path, media_type=media_type(name), headers={"X-Content-Type-Options": "nosniff",
                                                                    "Cache-Control": "private, max-age=3600"})


def stored_url(request: Request, data: bytes, suffix: str) -> str:
    """Store `data` and return its absolute URL, built from the request's own base URL."""
    name = request.app.state.media.put(data, suffix)
    return str(request.url_for("media_file", name=name))
