"""A backend for a running server: `radixrt launch`, or any server speaking SGLang's native API.

HTTP is used first, to read /server_info and /model_info (SGLang 0.5's names, falling back to
the older /get_*). A server that offers `zmq_frontend_address` (radixrt) then gets its
requests over ZeroMQ as msgspec messages (lang/backends/zmq_client.py); any other (a real SGLang
server), or any server with transport="http", over HTTP `POST /generate`. Both transports
raise the same exceptions (ValueError for a refused request, PermissionError for a bad key).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from radixrt.lang.backends.base import Backend
from radixrt.lang.backends.http_client import HttpClient
from radixrt.lang.backends.zmq_client import FrontendError, ZmqClient
from radixrt.lang.chat_template import ChatTemplate
from radixrt.lang.named_templates import named_template, template_name_for

TRANSPORTS = ("auto", "zmq", "http")


class RuntimeEndpoint(Backend):
    """`RuntimeEndpoint(base_url, api_key=None, verify=None, chat_template_name=None)` as
    SGLang's: verify is the TLS check of an https server (a CA bundle path, or a bool);
    chat_template_name picks one of SGLang's named templates (radixrt.lang.named_templates
    .NAMES) instead of the model's own. radixrt's extras: transport ("auto": ZeroMQ when the
    server offers it, else HTTP; "zmq"; "http") and timeout_s (per request)."""

    is_chat_model = False  # a completion-style backend: programs render roles themselves

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: bool | str | None = None,
        chat_template_name: str | None = None,
        *,
        transport: str = "auto",
        timeout_s: float = 600,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(
                f"RuntimeEndpoint: transport must be one of "
                f"{', '.join(TRANSPORTS)}; got {transport!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.http = HttpClient(self.base_url, api_key, verify, timeout_s)
        self.client: ZmqClient | HttpClient = self.http
        try:
            self._connect(transport, timeout_s, chat_template_name)
        except BaseException:
            self.http.close()
            raise

    def _connect(self, transport: str, timeout_s: float, chat_template_name: str | None) -> None:
        server_info = self.get_server_info()
        self.model_info = self.http.get("/model_info", "/get_model_info")
        self.http.incremental = bool(server_info.get("incremental_streaming_output"))
        self.chat_template = self._pick_template(chat_template_name)
        address = server_info.get("zmq_frontend_address")
        if transport == "zmq" and not address:
            raise ConnectionError(
                f"{self.base_url} offers no zmq_frontend_address in "
                "/server_info (not a radixrt server?); use transport='auto' "
                "or 'http'"
            )
        self.transport = "zmq" if address and transport != "http" else "http"
        if self.transport == "zmq":
            self.client = ZmqClient(
                _reachable(address, self.base_url),
                self.api_key,
                timeout_s=timeout_s,
                alive=self._alive,
            )

    def _pick_template(self, name: str | None) -> ChatTemplate:
        """The named template if given; else the model's own (a radixrt server sends its jinja
        source); else SGLang's choice by model path."""
        if name is None and self.model_info.get("chat_template"):
            self.chat_template_name = None
            return ChatTemplate.from_jinja(
                self.model_info["chat_template"],
                self.model_info.get("bos_token"),
                self.model_info.get("eos_token"),
            )
        self.chat_template_name = name or template_name_for(self.model_info.get("model_path"))
        return named_template(self.chat_template_name)

    @property
    def endpoint(self) -> RuntimeEndpoint:
        """As SGLang's Runtime.endpoint: code written for either reaches the endpoint."""
        return self

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
        return self.chat_template

    def get_model_info(self) -> dict[str, Any]:
        return self.model_info

    def get_model_name(self) -> str | None:
        """The served model's path (SGLang's model_info["model_path"])."""
        return self.model_info.get("model_path")

    model_path = get_model_name

    def flush_cache(self) -> bool:
        """Empty the server's radix cache; False if it refused (requests were running)."""
        return _translated(self.client.flush_cache)

    def get_server_info(self) -> dict[str, Any]:
        """The server's /server_info (its arguments and live counters)."""
        return self.http.get("/server_info", "/get_server_info")

    def uncache_prefix(self, rid: str | None = None) -> None:
        """A no-op, as SGLang's: cached prefixes are evicted by the radix cache (LRU)."""

    def shutdown(self) -> None:
        """Close the connections (the server keeps running)."""
        if self.client is not self.http:
            self.client.close()
        self.http.close()

    close = shutdown

    def _alive(self) -> bool:
        try:
            return self.http.client.get("/health", timeout=5).status_code < 500
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
