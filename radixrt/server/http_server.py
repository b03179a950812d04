"""The HTTP server's app: the native API (SGLang's endpoints), health, metrics, the API-key
check, and the OpenAI-compatible routes (openai_api.py). Every generation goes through the
engine (the tokenizer manager of this process), which talks to the scheduler over ZeroMQ."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

import radixrt
from radixrt.engine import Engine
from radixrt.request_input import from_dict as request_from_dict
from radixrt.server.http_utils import (
    APIError,
    await_or_disconnect,
    exception_response,
    read_json,
    sse_stream,
)
from radixrt.server.metrics import ServerMetrics
from radixrt.server.native_info import add_native_info_routes
from radixrt.server.openai_api import add_openai_routes
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


def build_app(state: ServerState, lifespan=None) -> FastAPI:
    app = FastAPI(title="radixrt", version=radixrt.__version__, lifespan=lifespan)
    app.state.server = state
    if state.args.api_key:
        _add_api_key_check(app, state.args.api_key)
    _add_native_routes(app, state)
    add_native_info_routes(app, state)
    add_openai_routes(app, state.engine, state.served_model_name)
    return app


def _add_api_key_check(app: FastAPI, api_key: str) -> None:
    app.add_middleware(APIKeyCheck, expected=f"Bearer {api_key}".encode())


class APIKeyCheck:
    """Plain ASGI middleware: 401 unless `Authorization: Bearer KEY` (but on /health). Unlike
    Starlette's BaseHTTPMiddleware it does not re-wrap every response body (streams pass
    through as they are)."""

    def __init__(self, app, expected: bytes) -> None:
        self.app = app
        self.expected = expected

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse({"error": {
                    "message": "missing or wrong API key: send 'Authorization: Bearer KEY'",
                    "type": "invalid_api_key", "param": None, "code": 401}}, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _add_native_routes(app: FastAPI, state: ServerState) -> None:
    engine = state.engine

    @app.get("/health")
    async def health() -> Response:
        if state.healthy and engine.error is None:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting" if engine.error is None else "failed"},
                            status_code=503)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        try:
            # SGLang's GenerateReqInput; an unknown name or a wrong type is a 400 naming it.
            req = request_from_dict(await read_json(request))
            if req.stream:
                chunks = await engine.async_generate_request(req)
                events = _stream_chunks(chunks, state.args.incremental_streaming_output)
                return StreamingResponse(sse_stream(events), media_type="text/event-stream")
            return JSONResponse(await await_or_disconnect(
                request, engine.async_generate_request(req)))
        except asyncio.CancelledError:
            return Response(status_code=499)  # the client is gone; nobody reads this
        except Exception as exc:  # noqa: BLE001 - every error becomes an HTTP error
            return exception_response(exc)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if await asyncio.to_thread(engine.flush_cache):
            return JSONResponse({"success": True, "message": "Cache flushed."})
        return JSONResponse({"success": False, "message": "Cache not flushed: requests are "
                             "running; retry when the server is idle."}, status_code=400)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        try:
            body = await read_json(request)
            rid = body.get("rid")
            if not isinstance(rid, str) or not rid:
                raise APIError("rid must be a non-empty string (the request's id)", "rid")
        except APIError as exc:
            return exception_response(exc)
        engine.abort_request(rid)
        return JSONResponse({"success": True})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await asyncio.to_thread(state.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _stream_chunks(chunks: AsyncIterator[dict[str, Any]],
                         incremental: bool) -> AsyncIterator[dict[str, Any]]:
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
