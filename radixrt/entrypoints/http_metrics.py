"""HTTP requests by route and status: `radixrt:http_requests_total{route, status}`.

A plain ASGI middleware (streams pass through untouched), registered outside the API-key check
so that 401s count too. Labels as prometheus-fastapi-instrumentator's (vLLM's HTTP metrics):
`route` is the route's template ("/v1/models/{model}"), never the raw path, and "none" for a
path no route matches, so the number of series is bounded by the app's routes; `status` is the
status class ("2xx", "4xx", "5xx"). Every route x class series exists from the first request
the app serves (its first /metrics scrape included).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from starlette.routing import BaseRoute, Match

from radixrt.entrypoints.metrics import ServerMetrics

STATUS_CLASSES = ("2xx", "4xx", "5xx")
UNMATCHED = "none"  # the instrumentator's handler label for an untemplated path


def add_http_metrics(app: FastAPI, metrics: ServerMetrics) -> None:
    """Count `app`'s HTTP requests into `metrics.http_requests`."""
    app.add_middleware(HTTPMetrics, metrics=metrics, routes=app.routes)


def route_templates(routes: Iterable[BaseRoute]) -> list[str]:
    """The distinct path templates of `routes`, in order, then UNMATCHED."""
    templates = dict.fromkeys(p for r in routes if (p := getattr(r, "path", None)) is not None)
    return [*templates, UNMATCHED]


class HTTPMetrics:
    def __init__(self, app: Any, metrics: ServerMetrics, routes: list[BaseRoute]) -> None:
        # Starlette builds the middleware stack at the first request, once every route exists.
        self.app = app
        self.routes = routes
        self.counter = metrics.http_requests
        self.model_name = metrics.labels["model_name"]
        for template in route_templates(routes):
            for status in STATUS_CLASSES:
                self.counter.labels(self.model_name, template, status)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def send_seeing_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_seeing_status)
        except asyncio.CancelledError:
            raise  # the client left; counted below only if it had an answer started
        except Exception:
            # Raised before any answer: Starlette's outermost middleware answers 500.
            status = status or 500
            raise
        finally:
            if status is not None:
                route = self._route_of(scope)
                self.counter.labels(self.model_name, route, f"{status // 100}xx").inc()

    def _route_of(self, scope: dict[str, Any]) -> str:
        """The template of the route that served the request (the router puts it in the
        scope), or, for an answer given before routing (401, 413, 503), the one that matches."""
        route = scope.get("route")
        if route is None:
            for candidate in self.routes:
                match, _ = candidate.matches(scope)
                if match is not Match.NONE:
                    route = candidate
                    break
        return getattr(route, "path", None) or UNMATCHED
