"""What every HTTP endpoint shares: OpenAI-style JSON errors, body parsing, the mapping from
engine exceptions to status codes, server-sent events, and aborting on client disconnect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse

from radixrt.request_state import SchedulerDied, ServerOverloaded

T = TypeVar("T")


class APIError(Exception):
    """Raised by endpoint code for a bad request; rendered by `error_response`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 err_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.err_type = err_type


def error_response(message: str, param: str | None = None, status: int = 400,
                   err_type: str = "invalid_request_error") -> JSONResponse:
    """The OpenAI API's error shape: {"error": {"message", "type", "param", "code"}}."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def status_of(exc: BaseException) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) of an exception from the engine or endpoint code; the
    ZeroMQ frontend reports the same statuses."""
    if isinstance(exc, APIError):
        return exc.status, exc.err_type
    if isinstance(exc, ServerOverloaded):
        return 503, "server_overloaded"
    if isinstance(exc, (ValueError, TypeError)):
        return 400, "invalid_request_error"
    if isinstance(exc, SchedulerDied):
        return 503, "server_error"
    return 500, "server_error"


def exception_response(exc: BaseException) -> JSONResponse:
    """Map an exception from the engine or endpoint code to its HTTP error."""
    status, err_type = status_of(exc)
    if isinstance(exc, APIError):
        return error_response(exc.message, exc.param, status, err_type)
    message = str(exc) if status != 500 else f"{type(exc).__name__}: {exc}"
    return error_response(message, getattr(exc, "param", None), status, err_type)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or APIError(400) saying why not."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def sse_event(data: Any) -> bytes:
    """One server-sent event carrying `data` as JSON (or a literal string such as [DONE])."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


async def sse_stream(events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """Encode an async iterator of JSON-able events, ending with `data: [DONE]`. An error raised
    mid-stream (the status line is already sent) goes out as an {"error": ...} event."""
    try:
        async for event in events:
            yield sse_event(event)
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the client, which is still there
        yield sse_event(json.loads(exception_response(exc).body))
    yield sse_event("[DONE]")


async def await_or_disconnect(request: Request, work: Awaitable[T],
                              poll_s: float = 0.2) -> T:
    """Await `work`; if the client goes away first, cancel it (the engine's generator aborts
    the request, returning its KV) and raise CancelledError."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise asyncio.CancelledError("client disconnected")
    finally:
        if not task.done():
            task.cancel()
