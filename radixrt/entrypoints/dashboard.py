"""The live page of the cache: `GET /cache_tree` (JSON: the scheduler's bounded snapshot of the
radix tree, the KV pool and the queues, with the tree's previews decoded here) and
`GET /dashboard` (a page and a small script from static/, no build step, no CDN), which polls
it. docs/dashboard.md describes both.

Both sit behind --api-key like every route but /health. A browser cannot add a Bearer header
to a navigation, so the API-key check also takes HTTP Basic (any user name, the key as the
password) and asks for it on the dashboard's paths: the browser prompts once, then sends it
with the page's own requests."""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from radixrt.entrypoints.http_utils import exception_response, json_response
from radixrt.errors import APIError
from radixrt.protocol.messages import MAX_CACHE_TREE_DEPTH, MAX_CACHE_TREE_NODES, GetCacheTreeReq

DASHBOARD_PATH = "/dashboard"
_ASSETS = {  # file -> media type
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The page loads only its own script and style and talks only to this server.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}
# query parameter -> (lowest, highest) allowed; the defaults are GetCacheTreeReq's
_BOUNDS = {"depth": (0, MAX_CACHE_TREE_DEPTH), "max_nodes": (1, MAX_CACHE_TREE_NODES)}


def is_dashboard_path(path: str) -> bool:
    """The page, its assets and its data: where a 401 asks a browser for Basic credentials."""
    return path in (DASHBOARD_PATH, "/cache_tree") or path.startswith(DASHBOARD_PATH + "/")


def add_dashboard_routes(app: FastAPI, state: Any) -> None:
    """Register /cache_tree and /dashboard (+ its assets); `state` is the ServerState."""
    engine = state.engine
    assets = {name: _read_asset(name) for name in _ASSETS}

    @app.get("/cache_tree", openapi_extra={"parameters": _query_parameters()})
    async def cache_tree(request: Request) -> Response:
        try:
            depth, max_nodes = (_bounded_param(request, name) for name in _BOUNDS)
            snapshot = await asyncio.to_thread(engine.get_cache_tree, depth, max_nodes)
            await asyncio.to_thread(add_previews, snapshot, engine.tokenizer)
        except Exception as exc:  # noqa: BLE001 - every error becomes an HTTP error
            return exception_response(exc)
        response = json_response(snapshot)
        response.headers["Cache-Control"] = "no-store"
        return response

    def asset(name: str) -> Response:
        return Response(assets[name], media_type=_ASSETS[name], headers=_PAGE_HEADERS)

    @app.get(DASHBOARD_PATH, include_in_schema=False)
    async def dashboard() -> Response:
        return asset("dashboard.html")

    @app.get(DASHBOARD_PATH + "/{name}", include_in_schema=False)
    async def dashboard_asset(name: str) -> Response:
        if name not in _ASSETS or name.endswith(".html"):
            raise APIError(f"no dashboard file {name!r}", None, 404, "not_found_error")
        return asset(name)


def _read_asset(name: str) -> bytes:
    return (resources.files("radixrt.entrypoints") / "static" / name).read_bytes()


def _query_parameters() -> list[dict[str, Any]]:
    """/openapi.json's description of /cache_tree's query (the handler reads it itself)."""
    return [
        {
            "name": name,
            "in": "query",
            "required": False,
            "schema": {
                "type": "integer",
                "minimum": low,
                "maximum": high,
                "default": getattr(GetCacheTreeReq(), name),
            },
        }
        for name, (low, high) in _BOUNDS.items()
    ]


def _bounded_param(request: Request, name: str) -> int:
    """An integer query parameter within _BOUNDS[name], its default when absent; APIError
    (400) naming it and its range otherwise."""
    low, high = _BOUNDS[name]
    raw = request.query_params.get(name)
    if raw is None:
        default: int = getattr(GetCacheTreeReq(), name)
        return default
    try:
        value: int | None = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise APIError(f"{name} must be an integer from {low} to {high}, got {raw!r}", name)
    return value


def add_previews(snapshot: dict[str, Any], tokenizer: Any) -> None:
    """Give every described tree node a `preview`: its first token ids as text (None without
    a tokenizer: --skip-tokenizer-init). Mutates `snapshot`."""
    tree = snapshot.get("tree")
    if tree is None:
        return
    stack = [tree["root"]]
    while stack:
        node = stack.pop()
        ids = node["preview_ids"]
        node["preview"] = _decode(tokenizer, ids) if tokenizer is not None and ids else None
        stack.extend(node["children"])


def _decode(tokenizer: Any, ids: list[int]) -> str:
    # Special tokens are shown: a chat template's markers are part of what is cached.
    text: str = tokenizer.decode(ids, skip_special_tokens=False)
    return text
