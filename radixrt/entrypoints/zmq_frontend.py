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

from radixrt.entrypoints.http_utils import status_of
from radixrt.frontend.engine import Engine
from radixrt.protocol.messages import (
    MAX_REQUEST_ID_BYTES,
    ClientAbort,
    ClientControl,
    ClientGenerate,
    ClientReply,
    decode_from_client,
    encode,
)

logger = logging.getLogger("radixrt.server.zmq_frontend")  # kept across moves


class ZmqFrontend:
    """Binds a ROUTER on `host` (loopback when `host` is every interface and no API key is set:
    the socket would otherwise take generations from anyone on the network, unauthenticated).
    A message part larger than the engine's max_request_bytes drops the sender's connection
    (zmq.MAXMSGSIZE): nothing that size is read into memory."""

    def __init__(self, engine: Engine, host: str, api_key: str | None) -> None:
        self.engine = engine
        self.api_key = api_key
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, engine.server_args.max_request_bytes)
        host = _bind_host(host, api_key)
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.tasks: dict[tuple[bytes, str], asyncio.Task] = {}

    async def serve(self) -> None:
        """Receive until cancelled; each generation runs as its own task."""
        try:
            while True:
                frames = await self.sock.recv_multipart()
                if len(frames) == 4:  # [client identity, request_id, api_key, payload]
                    self._dispatch(*frames)
                else:  # anything else is noise: there is no request id to answer to
                    logger.debug("dropped a ZeroMQ message of %d frames", len(frames))
        except asyncio.CancelledError:
            for task in list(self.tasks.values()):
                task.cancel()
            raise
        finally:
            self.sock.close()
            self.ctx.term()

    def _dispatch(self, identity: bytes, rid_frame: bytes, key_frame: bytes, data: bytes) -> None:
        try:
            request_id = rid_frame.decode()
        except UnicodeDecodeError:
            return
        if not request_id or len(rid_frame) > MAX_REQUEST_ID_BYTES:
            return
        if not self._authorized(key_frame):  # before a byte of the payload is decoded
            self._refuse(identity, request_id, 401, "missing or wrong API key")
            return
        try:
            msg = decode_from_client(data)
        except RecursionError:
            self._refuse(identity, request_id, 400, "bad request: the payload is nested too deeply")
            return
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._refuse(identity, request_id, 400, f"bad request: {e}")
            return
        if msg.request_id != request_id:
            self._refuse(
                identity,
                request_id,
                400,
                "bad request: the payload's request_id differs from its frame's",
            )
            return
        key = (identity, request_id)
        if isinstance(msg, ClientAbort):
            task = self.tasks.get(key)
            if task is not None:
                task.cancel()  # the engine aborts the request, returning its KV
            return
        work = (
            self._generate(identity, msg)
            if isinstance(msg, ClientGenerate)
            else self._control(identity, msg)
        )
        task = asyncio.ensure_future(work)
        self.tasks[key] = task
        task.add_done_callback(lambda _: self.tasks.pop(key, None))

    def _authorized(self, given: bytes) -> bool:
        if not self.api_key:
            return True
        return hmac.compare_digest(given, self.api_key.encode())

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
            self._reply(identity, ClientReply(msg.request_id, "error", error="aborted", status=499))
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
                raise ValueError(
                    f"kind must be 'flush_cache' or 'get_server_info', got {msg.kind!r}"
                )
            self._reply(identity, ClientReply(msg.request_id, "result", data))
        except Exception as exc:  # noqa: BLE001 - reported to the client
            self._reply(identity, _error_reply(msg.request_id, exc))

    def _refuse(self, identity: bytes, request_id: str, status: int, error: str) -> None:
        self._reply(identity, ClientReply(request_id, "error", error=error, status=status))

    def _reply(self, identity: bytes, reply: ClientReply) -> None:
        self.sock.send_multipart([identity, encode(reply)])


def _error_reply(request_id: str, exc: BaseException) -> ClientReply:
    return ClientReply(request_id, "error", error=f"{exc}", status=status_of(exc)[0])


def _bind_host(host: str, api_key: str | None) -> str:
    if host in ("0.0.0.0", "::", "") and not api_key:
        logger.warning(
            "the ZeroMQ frontend binds 127.0.0.1, not %r: without --api-key it would "
            "serve anyone on the network (set --api-key to expose it)",
            host,
        )
        return "127.0.0.1"
    return host
