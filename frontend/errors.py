"""OpenAI-style error bodies, and how a Triton error becomes one.

OpenAI clients (the `openai` SDK among them) read `{"error": {"message", "type", "param",
"code"}}` and pick their exception class from the HTTP status, so each failure gets both.
"""
from __future__ import annotations

import re

from fastapi.responses import JSONResponse

# The `ditserve` schema names the bad input as `input 'name'` (backends/ditserve/schema.py).
_BAD_INPUT = re.compile(r"input '(\w+)'")
# A stage failure starts with the stage's name (docs/reliability.md).
_STAGES = ("text_encoder:", "dit:", "vae_decode:", "vae_encode:", "output:")


class APIError(Exception):
    """An error answered to the HTTP client with `status` and an OpenAI error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid(param: str | None, message: str) -> APIError:
    return APIError(400, message, param=param)


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="triton_not_ready")


def from_server_message(message: str) -> APIError:
    """The error Triton streamed back for a generation, with the server's message unchanged.

    A stream error carries no status code, so the message decides: the schema's rejection
    of an input is the client's fault (400), a request timeout is 504, a stage failure 500."""
    match = _BAD_INPUT.search(message)
    if match or message.startswith("unknown input"):
        return APIError(400, message, param=match.group(1) if match else None)
    if "timeout" in message and "expired" in message:
        return APIError(504, message, type="timeout", code="generation_timeout")
    if message.startswith(_STAGES):
        return APIError(500, message, type="server_error", code="generation_failed")
    return APIError(502, f"tritonserver: {message}", type="server_error", code="triton_error")
