"""The HTTP server's app: SGLang's own API (its "native" endpoints), health, metrics, the
OpenAI-compatible routes (openai/api.py), and the guards in front of them all (plain ASGI
middleware: the API-key check, a 503 once the engine has failed, the request-body limit).
Every error has the OpenAI shape; /openapi.json declares every request body. Every
generation goes through the engine (the tokenizer manager of this process), which talks to
the scheduler over ZeroMQ."""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hmac
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

import radixrt
from radixrt.entrypoints.access_log import add_access_log
from radixrt.entrypoints.dashboard import add_dashboard_routes, is_dashboard_path
from radixrt.entrypoints.http_metrics import add_http_metrics
from radixrt.entrypoints.http_utils import (
    CLIENT_CLOSED,
    SCHEMA_REF,
    await_or_disconnect,
    error_response,
    event_stream,
    exception_response,
    json_body,
    json_response,
    logger,
    pydantic_components,
    read_json,
)
from radixrt.entrypoints.info_routes import SGLANG_BODIES, add_info_routes
from radixrt.entrypoints.load_info import add_load_routes
from radixrt.entrypoints.metrics import ServerMetrics
from radixrt.entrypoints.openai.api import add_openai_routes
from radixrt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixrt.entrypoints.openai.responses_protocol import ResponsesRequest
from radixrt.errors import (
    APIError,
    BodyTooLarge,
    ClientDisconnected,
    SchedulerDied,
    ServerOverloaded,
)
from radixrt.frontend.engine import Engine
from radixrt.native.memory import release_freed_memory
from radixrt.protocol.request_input import GenerateReqInput
from radixrt.protocol.request_input import from_dict as request_from_dict
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.server_args import ServerArgs

# With --incremental-streaming-output, these meta_info lists carry only the chunk's entries.
_INCREMENTAL_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")
_OPEN_PATHS = {"/health"}  # reachable without the API key (load balancers probe it)


@dataclasses.dataclass
class ServerState:
    """What the endpoints share; `zmq_address` is set once the ZeroMQ frontend is bound."""

    engine: Engine
    args: ServerArgs
    served_model_name: str
    metrics: ServerMetrics
    healthy: bool = False
    zmq_address: str | None = None


class AbortRequestBody(BaseModel):
    """The body of /abort_request (SGLang's AbortReq fields; the message the engine sends is
    protocol.messages.AbortReq): the request with exactly this rid (and the n samples or batch made
    from it), or with abort_all every request."""

    rid: str = ""
    abort_all: bool = False


def build_app(state: ServerState, lifespan=None) -> FastAPI:
    """The app; outermost first: the API-key check, the failed-engine gate, the body limit."""
    app = FastAPI(title="radixrt", version=radixrt.__version__, lifespan=lifespan)
    app.state.server = state
    _add_sglang_routes(app, state)
    add_info_routes(app, state)
    add_load_routes(app, state)  # /v1/loads and /get_load, which SMG polls
    add_openai_routes(app, state.engine, state.served_model_name)
    add_dashboard_routes(app, state)
    _add_error_handlers(app)
    _declare_bodies(app)
    app.add_middleware(BodyLimit, limit=state.args.max_request_bytes)
    app.add_middleware(EngineGate, engine=state.engine)
    if state.args.api_key:
        app.add_middleware(APIKeyCheck, key=state.args.api_key)
    add_http_metrics(app, state.metrics)  # outside the API-key check: 401s count too
    add_access_log(app, state.args.log_requests)  # last: outermost, sees every answer
    return app


class APIKeyCheck:
    """Plain ASGI middleware: 401 unless `Authorization: Bearer KEY`, or HTTP Basic with the
    key as the password (a browser's only way; any user name), on every path but /health;
    the key is compared in constant time. On the dashboard's paths the 401 asks for Basic
    credentials, so that a browser prompts. Unlike Starlette's BaseHTTPMiddleware it does not
    re-wrap every response body (streams pass through as they are)."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            given = _presented_key(dict(scope["headers"]).get(b"authorization", b""))
            if not hmac.compare_digest(given, self.key):
                challenge = is_dashboard_path(scope["path"])
                response = error_response(
                    "missing or wrong API key: send 'Authorization: Bearer KEY'",
                    None,
                    401,
                    "invalid_api_key",
                    {"WWW-Authenticate": 'Basic realm="radixrt"'} if challenge else None,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _presented_key(header: bytes) -> bytes:
    """The key in an Authorization header: a Bearer token or a Basic password; b"" if none."""
    scheme, _, credentials = header.strip().partition(b" ")
    if scheme.lower() == b"bearer":
        return credentials.strip()
    if scheme.lower() == b"basic":
        try:
            return base64.b64decode(credentials.strip(), validate=True).partition(b":")[2]
        except binascii.Error:
            return b""
    return b""


class EngineGate:
    """Plain ASGI middleware: once the engine has failed (a child process died), every
    endpoint but /health answers 503 naming the failure instead of failing its own way."""

    def __init__(self, app, engine: Engine) -> None:
        self.app = app
        self.engine = engine

    async def __call__(self, scope, receive, send) -> None:
        error = self.engine.error
        if scope["type"] == "http" and error is not None and scope["path"] not in _OPEN_PATHS:
            await error_response(str(error), None, 503, "server_error")(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Plain ASGI middleware: a body over `limit` bytes is a 413 before any of it is read
    when its Content-Length says so, and otherwise (a chunked body) as soon as the bytes
    received pass the limit: receiving then raises BodyTooLarge, which the endpoint answers.
    Nothing past the limit is buffered, parsed or tokenized. After a body of at least
    TRIM_AFTER_BYTES the heap's free pages go back to the system (release_freed_memory)."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await exception_response(BodyTooLarge(self.limit))(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, send)
        if received >= TRIM_AFTER_BYTES:
            release_freed_memory()


# Tokenizing a prompt takes about 125 bytes of transient memory per character (SmolLM2's fast
# tokenizer), in the arena of the worker thread that tokenized it; glibc keeps that arena's
# freed pages: 45 MB stayed resident after one 360,000-character prompt refused as over the
# context (scripts/measure_refusal_rss.py). A body this size is at most ~8 MB of that.
TRIM_AFTER_BYTES = 64 * 1024


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in the OpenAI shape: the router's 404 and 405, the engine's and endpoint
    code's exceptions, and a generic 500 (its traceback goes to the log, not the client)."""

    async def http_error(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, HTTPException):  # Starlette types every handler's exc as Exception
            return exception_response(exc)
        return error_response(
            str(exc.detail), None, exc.status_code, headers=getattr(exc, "headers", None)
        )

    async def known_error(request: Request, exc: Exception) -> Response:
        return exception_response(exc)

    async def internal_error(request: Request, exc: Exception) -> Response:
        # Starlette's ServerErrorMiddleware logs the traceback after this answer.
        return error_response(
            "internal server error (the server's log has the details)", None, 500, "server_error"
        )

    app.add_exception_handler(HTTPException, http_error)
    for kind in (APIError, SchedulerDied, ServerOverloaded, ClientDisconnected):
        app.add_exception_handler(kind, known_error)
    app.add_exception_handler(Exception, internal_error)


def _declare_bodies(app: FastAPI) -> None:
    """/openapi.json describes every request body: the handlers read the raw body (their
    errors keep the OpenAI shape), so the schemas are added to the document's components."""
    components = pydantic_components(
        ChatCompletionRequest, CompletionRequest, ResponsesRequest, AbortRequestBody, *SGLANG_BODIES
    )
    components.update(_generate_components())
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = app.openapi_schema
        if schema is None:
            schema = build()  # FastAPI's openapi() caches it as app.openapi_schema
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def _generate_components() -> dict[str, dict[str, Any]]:
    """GenerateReqInput's schema, with its untyped prompt fields spelled out."""
    _, components = msgspec.json.schema_components(
        [GenerateReqInput, SamplingParams], ref_template=SCHEMA_REF.replace("model", "name")
    )
    props = components["GenerateReqInput"]["properties"]

    def some(items: dict) -> dict:
        return {"type": "array", "items": items, "minItems": 1}

    ints, params = some({"type": "integer"}), {"$ref": SCHEMA_REF.format(model="SamplingParams")}
    props["text"] = {"anyOf": [{"type": "string"}, some({"type": "string"})]}
    props["input_ids"] = {"anyOf": [ints, some(ints)]}
    props["sampling_params"] = {"anyOf": [params, some(params), {"type": "null"}]}
    # The prompt: exactly one of them (the handler says so when neither or both are given).
    components["GenerateReqInput"]["anyOf"] = [{"required": ["text"]}, {"required": ["input_ids"]}]
    return components


def _add_sglang_routes(app: FastAPI, state: ServerState) -> None:
    engine = state.engine
    incremental = state.args.incremental_streaming_output

    @app.get("/health")
    async def health() -> Response:
        if state.healthy and engine.error is None:
            return JSONResponse({"status": "ok"})
        if engine.error is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "failed", "message": str(engine.error)}, status_code=503)

    @app.post("/generate", openapi_extra=json_body("GenerateReqInput"))
    async def generate(request: Request) -> Response:
        try:
            # SGLang's GenerateReqInput; an unknown name or a wrong type is a 400 naming it.
            req = request_from_dict(await read_json(request))
            if req.stream:
                chunks = await engine.async_generate_request(req)
                return await event_stream(chunks, lambda c: _stream_chunks(c, incremental))
            out = await await_or_disconnect(request, engine.async_generate_request(req))
            return await asyncio.to_thread(json_response, out)
        except asyncio.CancelledError:
            return Response(status_code=CLIENT_CLOSED)  # cancelled: nobody reads this
        except Exception as exc:  # noqa: BLE001 - every error becomes an HTTP error
            return exception_response(exc)

    async def flush_cache() -> Response:
        if await asyncio.to_thread(engine.flush_cache):
            return JSONResponse({"success": True, "message": "Cache flushed."})
        return JSONResponse(
            {
                "success": False,
                "message": "Cache not flushed: requests are "
                "running; retry when the server is idle.",
            },
            status_code=400,
        )

    for method in ("GET", "POST"):  # SGLang takes both; one operation id each
        app.add_api_route(
            "/flush_cache",
            flush_cache,
            methods=[method],
            operation_id=f"flush_cache_{method.lower()}",
        )

    @app.post("/abort_request", openapi_extra=json_body("AbortRequestBody"))
    async def abort_request(request: Request) -> Response:
        try:
            rid, abort_all = _abort_target(await read_json(request))
        except APIError as exc:
            return exception_response(exc)
        engine.abort_request(rid, abort_all=abort_all)
        if abort_all:
            logger.warning("aborting every request (/abort_request with abort_all)")
        return JSONResponse({"success": True})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await asyncio.to_thread(state.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


def _abort_target(body: dict[str, Any]) -> tuple[str, bool]:
    """(rid, abort_all) of an /abort_request body; APIError naming a bad field."""
    rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
    if not isinstance(abort_all, bool):
        raise APIError(f"abort_all must be true or false, got {abort_all!r}", "abort_all")
    if not isinstance(rid, str):
        raise APIError(f"rid must be a string (the request's id), got {type(rid).__name__}", "rid")
    if not rid and not abort_all:
        raise APIError(
            "give the rid of the request to abort (matched exactly), or "
            "abort_all: true to abort every request",
            "rid",
        )
    return rid, abort_all


async def _stream_chunks(
    chunks: AsyncIterator[dict[str, Any]], incremental: bool
) -> AsyncIterator[dict[str, Any]]:
    """SGLang's /generate streams: each chunk carries the text and ids so far and meta_info's
    logprob lists so far; with incremental (--incremental-streaming-output) only the new
    text, ids and output logprob entries. The engine's chunks carry the new text and ids."""
    text: dict[int, str] = {}
    ids: dict[int, list[int]] = {}
    async for chunk in chunks:
        i = chunk.get("index", 0)
        before = len(ids.setdefault(i, []))
        ids[i].extend(chunk["output_ids"])
        if incremental:
            meta = chunk["meta_info"]
            for key in _INCREMENTAL_KEYS:
                if key in meta:
                    meta[key] = meta[key][before:]
            yield chunk
            continue
        text[i] = text.get(i, "") + chunk["text"]
        yield {**chunk, "text": text[i], "output_ids": list(ids[i])}
