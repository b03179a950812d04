"""What every HTTP endpoint shares: OpenAI-style JSON errors, body parsing (bounded in depth,
off the event loop when large), the mapping from engine exceptions to status codes, server-sent
events, and ending the work of a client that went away (watched on the ASGI receive channel,
as it happens)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixrt.errors import (
    APIError,
    ClientDisconnected,
    ParamError,
    SchedulerDied,
    ServerOverloaded,
)

T = TypeVar("T")
logger = logging.getLogger("radixrt.server")

# Deeper JSON (a body, a schema inside it) is refused: no real request comes near, and the
# parsers, validators and grammar compilers behind recurse once per level.
MAX_JSON_DEPTH = 128
_PARSE_OFF_LOOP_BYTES = 64 * 1024  # bodies larger than this are parsed on a worker thread
CLIENT_CLOSED = 499  # nginx's status for "the client closed the request"; nobody reads it


# OpenAI's `code` is a string (vLLM and SGLang send the HTTP status there, an int): the
# error's own code where it has one (model_not_found, context_length_exceeded), else the one
# of its status. OpenAI's own names where it has them (invalid_api_key, rate_limit_exceeded).
STATUS_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limit_exceeded",
    499: "client_closed_request",
    500: "internal_error",
    503: "service_unavailable",
}


def error_response(
    message: str,
    param: str | None = None,
    status: int = 400,
    err_type: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
    code: str | None = None,
) -> JSONResponse:
    """The OpenAI API's error shape: {"error": {"message", "type", "param", "code"}}, `code`
    a string: `code`, else the status's (STATUS_CODES, else `err_type`)."""
    code = code or STATUS_CODES.get(status, err_type)
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


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
    if isinstance(exc, ClientDisconnected):
        return CLIENT_CLOSED, "client_closed_request"
    return 500, "server_error"


def exception_response(exc: BaseException) -> Response:
    """Map an exception from the engine or endpoint code to its HTTP error. An unexpected one
    (500) is logged with its traceback here and answered without its details: its class and
    text are the server's internals, not the client's business."""
    status, err_type = status_of(exc)
    if isinstance(exc, APIError):
        return error_response(exc.message, exc.param, status, err_type, code=exc.code)
    if status == CLIENT_CLOSED:
        return Response(status_code=CLIENT_CLOSED)
    if status == 500:
        logger.error("internal error while serving a request", exc_info=exc)
        return error_response(
            "internal server error (the server's log has the details)", None, 500, err_type
        )
    code = exc.code if isinstance(exc, ParamError) else None
    return error_response(str(exc), getattr(exc, "param", None), status, err_type, code=code)


# -- request bodies -------------------------------------------------------------------------
async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or APIError(400) saying why not; BodyTooLarge (413) from
    the body limit while it streams in. A large body is parsed on a worker thread."""
    raw = await request.body()
    if len(raw) > _PARSE_OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_json_object, raw)
    return parse_json_object(raw)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Strict JSON (no NaN or Infinity, valid Unicode, at most MAX_JSON_DEPTH levels) holding
    an object; APIError(400) otherwise."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, an int over 4300 digits
        raise APIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
    check_json_value(body)
    return body


def _no_constant(name: str) -> Any:
    raise APIError(f"the request body is not valid JSON: {name} is not a JSON number")


def _too_deep(param: str | None = None) -> APIError:
    where = f" (in {param})" if param else ""
    return APIError(
        f"the request body is nested too deeply{where}: at most {MAX_JSON_DEPTH} "
        "levels of arrays and objects are allowed",
        param,
    )


def check_json_value(value: Any) -> None:
    """APIError unless `value` nests at most MAX_JSON_DEPTH levels and its strings are valid
    Unicode (JSON's \\ud800 escapes make lone surrogates, which no encoder can write back)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(path or None)
        if isinstance(item, list):
            named: list[tuple[str, Any]] = [(path, child) for child in item]
        else:  # the error names the field, as far as a field name goes (two levels)
            named = [
                (path if depth > 2 else f"{path}.{k}".lstrip("."), child)
                for k, child in item.items()
            ]
            named += [(path, key) for key in item]
        for child_path, child in named:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, child_path))
            elif isinstance(child, str) and not child.isascii():
                _check_unicode(child)


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(
            f"the request body holds a lone surrogate ({text[e.start]!r}), which "
            "is not valid Unicode"
        ) from None


def json_body(schema_name: str) -> dict[str, Any]:
    """A route's `openapi_extra`: its required JSON body is components/schemas/`schema_name`
    (the handlers read and check the body themselves, so that errors keep the OpenAI shape)."""
    ref = {"$ref": f"#/components/schemas/{schema_name}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


# -- streams and disconnects ----------------------------------------------------------------
def dumps(data: Any) -> str:
    """JSON text of `data`; a non-finite float (an impossible token's -inf logprob) is null,
    as SGLang's orjson writes it: JSON has no infinity."""
    try:
        return json.dumps(data, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(data), ensure_ascii=False, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_response(content: Any, status: int = 200) -> Response:
    """A JSON response written by `dumps` (call it off the event loop for a large answer)."""
    return Response(dumps(content).encode(), status, media_type="application/json")


def sse_event(data: Any) -> bytes:
    """One server-sent event carrying `data` as JSON (or a literal string such as [DONE])."""
    text = data if isinstance(data, str) else dumps(data)
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
        yield sse_event(json.loads(bytes(exception_response(exc).body)))
    yield sse_event("[DONE]")


async def await_or_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client goes away first, cancel it (the engine aborts the request,
    returning its KV) and raise ClientDisconnected. The body has been read, so the next ASGI
    message can only be http.disconnect: waiting for it sees the disconnect as it happens."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected()
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # its abort is sent before the handler returns


async def _disconnected(receive: Callable[[], Awaitable[MutableMapping[str, Any]]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# An engine stream: its result chunks; closing it aborts what still runs.
Chunks = AsyncGenerator[dict[str, Any], None]


async def event_stream(chunks: Chunks, events: Callable[[Chunks], AsyncIterator[Any]]) -> Response:
    """The SSE response of an engine stream, `events(chunks)` encoded. The engine's generator
    is started here, before the response: a generator never started has no cleanup to run,
    so a client gone before the first event would leave its request running."""
    first = asyncio.ensure_future(anext(chunks))
    await asyncio.sleep(0)  # the task's first step: the generator is inside its try
    return EngineStream(events(_after(first, chunks)), chunks, first)


async def _after(first: asyncio.Future, rest: Chunks) -> Chunks:
    try:
        yield await first
    except StopAsyncIteration:
        return
    async for chunk in rest:
        yield chunk


class EngineStream(StreamingResponse):
    """Server-sent events that close the engine's stream when the response ends, however it
    ends (finished, client gone, never iterated): closing it aborts what still runs.
    Starlette cancels the iteration as soon as the client disconnects."""

    def __init__(self, events: AsyncIterator[Any], source: Chunks, first: asyncio.Future) -> None:
        super().__init__(sse_stream(events), media_type="text/event-stream")
        self.source, self.first = source, first

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.first.done():  # gone before the first chunk: its wait ends now
                self.first.cancel()
                await asyncio.wait({self.first})
            if not self.first.cancelled():
                self.first.exception()  # retrieved: an error nobody read is not "lost"
            await self.source.aclose()


# -- the OpenAPI document -------------------------------------------------------------------
SCHEMA_REF = "#/components/schemas/{model}"


def pydantic_components(*models: Any) -> dict[str, dict[str, Any]]:
    """components/schemas entries for pydantic models (and the models they use)."""
    out: dict[str, dict[str, Any]] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=SCHEMA_REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out
