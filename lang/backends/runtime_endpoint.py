"""A backend for a running `radixrt launch` server.

HTTP is used once, to read the server's ZeroMQ frontend address and chat template; requests
then go over ZeroMQ as msgspec messages (radixrt.zmq_client), not over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from radixrt.lang.backends.base import Backend
from radixrt.lang.chat_template import ChatTemplate
from radixrt.zmq_client import FrontendError, ZmqClient


class RuntimeEndpoint(Backend):
    def __init__(self, base_url: str, api_key: str | None = None,
                 timeout_s: float = 600) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        server_info = self._get("/get_server_info")
        self.model_info = self._get("/get_model_info")
        address = server_info.get("zmq_frontend_address")
        if not address:
            raise ConnectionError(f"{self.base_url} has no zmq_frontend_address in "
                                  "/get_server_info: is it a radixrt server?")
        address = _reachable(address, self.base_url)
        self._template = ChatTemplate.from_jinja(self.model_info.get("chat_template"),
                                                 self.model_info.get("bos_token"),
                                                 self.model_info.get("eos_token"))
        self.client = ZmqClient(address, api_key, timeout_s=timeout_s, alive=self._alive)

    def _generate(self, **request: Any) -> Any:
        return _translated(lambda: self.client.generate(**request))

    def _generate_stream(self, **request: Any) -> Iterator[dict[str, Any]]:
        chunks = self.client.generate_stream(**request)
        while True:
            chunk = _translated(lambda: next(chunks, None))
            if chunk is None:
                return
            yield chunk

    def get_chat_template(self) -> ChatTemplate:
        return self._template

    def get_model_info(self) -> dict[str, Any]:
        return self.model_info

    def flush_cache(self) -> bool:
        return _translated(self.client.flush_cache)

    def get_server_info(self) -> dict[str, Any]:
        """The server's /get_server_info (its arguments and live counters)."""
        return self._get("/get_server_info")

    def shutdown(self) -> None:
        """Close the socket (the server keeps running)."""
        self.client.close()

    close = shutdown

    def _get(self, path: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            resp = httpx.get(self.base_url + path, headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"cannot reach the radixrt server at {self.base_url}: "
                                  f"{exc}") from exc
        if resp.status_code == 401:
            raise PermissionError(f"{self.base_url} refused the API key (HTTP 401)")
        resp.raise_for_status()
        return resp.json()

    def _alive(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=5).status_code < 500
        except httpx.HTTPError:
            return False


def _translated(call):
    """The server's refusals as the exceptions the engine raises in process."""
    try:
        return call()
    except FrontendError as exc:
        if exc.status == 400:
            raise ValueError(str(exc)) from exc
        if exc.status == 401:
            raise PermissionError(str(exc)) from exc
        raise


def _reachable(zmq_address: str, base_url: str) -> str:
    """A server bound to every interface (--host 0.0.0.0) reports that wildcard address; reach
    it at the host the HTTP URL names instead."""
    scheme, _, rest = zmq_address.partition("://")
    host, _, port = rest.rpartition(":")
    if host in ("0.0.0.0", "*", "[::]", "::"):
        host = urlsplit(base_url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}"
