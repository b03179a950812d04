"""The server's ZeroMQ frontend: a ROUTER socket on which clients (the DSL's RuntimeEndpoint)
send msgspec messages (ClientGenerate / ClientAbort / ClientControl) and get ClientReply
messages back, bypassing HTTP and JSON. It runs on the HTTP server's event loop and shares its
engine, so requests from both meet in one scheduler and one radix cache."""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from radixrt.engine import Engine
from radixrt.messages import (
    ClientAbort,
    ClientControl,
    ClientGenerate,
    ClientReply,
    decode_from_client,
    encode,
)
from radixrt.server.http_utils import status_of

logger = logging.getLogger(__name__)


class ZmqFrontend:
    def __init__(self, engine: Engine, host: str, api_key: str | None) -> None:
        self.engine = engine
        self.api_key = api_key
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.tasks: dict[tuple[bytes, str], asyncio.Task] = {}

    async def serve(self) -> None:
        """Receive until cancelled; each generation runs as its own task."""
        try:
            while True:
                frames = await self.sock.recv_multipart()
                if len(frames) == 2:  # [client identity, message]; anything else is noise
                    self._dispatch(*frames)
        except asyncio.CancelledError:
            for task in list(self.tasks.values()):
                task.cancel()
            raise
        finally:
            self.sock.close()
            self.ctx.term()

    def _dispatch(self, identity: bytes, data: bytes) -> None:
        try:
            msg = decode_from_client(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._refuse(identity, data, e)
            return
        if not self._authorized(msg.api_key):
            self._reply(identity, ClientReply(msg.request_id, "error", error="missing or "
                                              "wrong API key", status=401))
            return
        key = (identity, msg.request_id)
        if isinstance(msg, ClientAbort):
            task = self.tasks.get(key)
            if task is not None:
                task.cancel()  # the engine aborts the request, returning its KV
            return
        work = self._generate(identity, msg) if isinstance(msg, ClientGenerate) else \
            self._control(identity, msg)
        task = asyncio.ensure_future(work)
        self.tasks[key] = task
        task.add_done_callback(lambda _: self.tasks.pop(key, None))

    def _refuse(self, identity: bytes, data: bytes, error: Exception) -> None:
        """A message that does not decode: a 400 if it names its request_id, else dropped."""
        try:
            raw = msgspec.msgpack.decode(data)
        except msgspec.DecodeError:
            raw = None
        fields = raw if isinstance(raw, dict) else {}
        request_id, api_key = fields.get("request_id"), fields.get("api_key")
        if not isinstance(request_id, str) or not self._authorized(
                api_key if isinstance(api_key, str) else None):
            logger.warning("dropped a malformed message on the ZeroMQ frontend: %s", error)
            return
        self._reply(identity, ClientReply(request_id, "error", error=f"bad request: {error}",
                                          status=400))

    def _authorized(self, given: str | None) -> bool:
        if not self.api_key:
            return True
        return given is not None and hmac.compare_digest(given.encode(), self.api_key.encode())

    async def _generate(self, identity: bytes, msg: ClientGenerate) -> None:
        try:
            if msg.request.stream:
                async for chunk in await self.engine.async_generate_request(msg.request):
                    self._reply(identity, ClientReply(msg.request_id, "chunk", chunk))
                result: Any = None
            else:
                result = await self.engine.async_generate_request(msg.request)
            self._reply(identity, ClientReply(msg.request_id, "result", result))
        except asyncio.CancelledError:
            self._reply(identity, ClientReply(msg.request_id, "error", error="aborted",
                                              status=499))
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client
            self._reply(identity, _error_reply(msg.request_id, exc))

    async def _control(self, identity: bytes, msg: ClientControl) -> None:
        try:
            if msg.kind == "flush_cache":
                data: Any = await asyncio.to_thread(self.engine.flush_cache)
            elif msg.kind == "get_server_info":
                data = await asyncio.to_thread(self.engine.get_server_info)
            else:
                raise ValueError(f"kind must be 'flush_cache' or 'get_server_info', "
                                 f"got {msg.kind!r}")
            self._reply(identity, ClientReply(msg.request_id, "result", data))
        except Exception as exc:  # noqa: BLE001 - reported to the client
            self._reply(identity, _error_reply(msg.request_id, exc))

    def _reply(self, identity: bytes, reply: ClientReply) -> None:
        self.sock.send_multipart([identity, encode(reply)])


def _error_reply(request_id: str, exc: BaseException) -> ClientReply:
    return ClientReply(request_id, "error", error=f"{exc}", status=status_of(exc)[0])
