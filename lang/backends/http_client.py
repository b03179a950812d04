"""A client of SGLang's native HTTP API, with ZmqClient's methods, for servers without
radixrt's ZeroMQ frontend (a real SGLang server) or when HTTP is asked for.

`POST /generate` takes GenerateReqInput's fields as JSON (a list of texts for a batch); a
stream is server-sent events `data: {...}` ending with `data: [DONE]`, whose "text" and
"output_ids" are those so far, or only the new ones on a server started with
--incremental-streaming-output (`incremental`, read from /server_info by RuntimeEndpoint).
Refusals raise zmq_client.FrontendError with the HTTP status, so both transports fail
the same way.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator
from typing import Any

import httpx

from radixrt.lang.backends.zmq_client import FrontendError


class HttpClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: bool | str | None = None,
        timeout_s: float = 600,
    ) -> None:
        """verify: httpx's TLS check for an https URL (True, False, or a CA bundle path);
        None is True."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.incremental = False  # the server's streams carry only the new text and ids
        self.client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            verify=_tls(verify),
            timeout=httpx.Timeout(timeout_s, connect=30),
        )

    def get(self, *paths: str) -> dict[str, Any]:
        """GET the first of `paths` the server has (SGLang 0.5's name first, then the older
        /get_* one); ConnectionError if the server cannot be reached."""
        for path in paths:
            try:
                resp = self.client.get(path)
            except httpx.HTTPError as exc:
                raise ConnectionError(f"cannot reach the server at {self.base_url}: {exc}") from exc
            if resp.status_code != 404 or path == paths[-1]:
                break
        if resp.status_code == 401:
            raise PermissionError(f"{self.base_url} refused the API key (HTTP 401)")
        _raise_for_status(resp)
        return resp.json()

    def generate(self, **fields: Any) -> Any:
        """POST /generate; the parsed result (a dict, or a list for a batch or n > 1)."""
        resp = self._post("/generate", _body(fields))
        _raise_for_status(resp)
        return resp.json()

    def generate_stream(self, **fields: Any) -> Iterator[dict[str, Any]]:
        """Chunks with the new text of each event, as ZmqClient.generate_stream yields them.
        Closing the iterator early closes the connection (the server aborts the request)."""
        body = {**_body(fields), "stream": True}
        with self.client.stream("POST", "/generate", json=body) as resp:
            if resp.status_code != 200:
                resp.read()
                _raise_for_status(resp)
            text_sent, ids_sent = 0, 0
            for data in _events(resp.iter_lines()):
                text, ids = data.get("text", ""), data.get("output_ids", [])
                if not self.incremental:
                    text, ids = text[text_sent:], ids[ids_sent:]
                    text_sent, ids_sent = text_sent + len(text), ids_sent + len(ids)
                yield {"text": text, "output_ids": ids, "meta_info": data.get("meta_info", {})}

    def flush_cache(self) -> bool:
        """POST /flush_cache; False when the server refuses (requests are running)."""
        resp = self._post("/flush_cache", None)
        if resp.status_code == 400:
            return False
        _raise_for_status(resp)
        return True

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict | None) -> httpx.Response:
        try:
            return self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"cannot reach the server at {self.base_url}: {exc}") from exc


def _tls(verify: Any) -> bool | ssl.SSLContext:
    """httpx's verify: a CA bundle file or folder becomes an SSL context (httpx 0.28 has
    deprecated plain paths)."""
    if verify is None:
        return True
    if not isinstance(verify, (str, os.PathLike)):  # a bool, or an SSLContext already
        return verify
    if os.path.isdir(verify):
        return ssl.create_default_context(capath=verify)
    return ssl.create_default_context(cafile=verify)


def _body(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON payloads of `data:` lines until [DONE]; an error event raises."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        data = json.loads(payload)
        if isinstance(data, dict) and "error" in data and "text" not in data:
            raise FrontendError(_message(data), _status(data, 500))
        yield data


def _raise_for_status(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        data = resp.json()
    except ValueError:
        data = resp.text
    raise FrontendError(_message(data), resp.status_code)


def _message(data: Any) -> str:
    """The message of an error body: OpenAI's {"error": {"message"}}, SGLang's
    {"object": "error", "message"} or {"error": "..."}, or the raw text."""
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(data)


def _status(data: dict, default: int) -> int:
    err = data.get("error")
    code = err.get("code") if isinstance(err, dict) else data.get("code")
    return code if isinstance(code, int) and 400 <= code < 600 else default
