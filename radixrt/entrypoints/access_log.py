"""--log-requests: one access line per HTTP request, on the logger `radixrt.access`.

    [2026-12-01 18:00:00 frontend] INFO radixrt.access: 127.0.0.1:51234 "POST /v1/completions"
    200 12.3 ms

The line says who asked (client address), what (method and path, no query string), the status,
and how long until the last byte of the answer went out (a stream: its whole length). It never
carries a header or a body: no API key, no prompt. Registered outermost, so that it also logs
the answers of the API-key check (401) and the body limit (413). uvicorn's own access log stays
off: it would log the same requests a second time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI

logger = logging.getLogger("radixrt.access")


class AccessLog:
    """Plain ASGI middleware (no buffering: a streamed answer passes through chunk by chunk)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets if the app fails before it answers

        async def send_and_note(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            logger.info(
                '%s "%s %s" %d %.1f ms',
                _client(scope),
                scope["method"],
                scope["path"],
                status,
                (time.perf_counter() - start) * 1000,
            )


def _client(scope: dict) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


def add_access_log(app: FastAPI, enabled: bool) -> None:
    """Call last in build_app: the middleware added last is the outermost."""
    if enabled:
        app.add_middleware(AccessLog)
