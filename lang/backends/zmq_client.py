"""A client of the server's ZeroMQ frontend (used by the DSL's RuntimeEndpoint and tests).

Light on purpose: zmq and msgspec only, no torch. Thread-safe: any thread may call generate.
ZeroMQ sockets are not thread-safe, so one I/O thread owns the socket: callers queue their
messages and wake it through a pipe; it routes replies to their callers by request id.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from radixrt.protocol.messages import (
    ClientAbort,
    ClientControl,
    ClientGenerate,
    ClientReply,
    client_frames,
    decode_client_reply,
)
from radixrt.protocol.request_input import make_request


class FrontendError(RuntimeError):
    """The server refused or failed a request; `status` is HTTP-like (400, 401, 503, ...)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ZmqClient:
    def __init__(
        self,
        address: str,
        api_key: str | None = None,
        timeout_s: float = 600,
        alive: Callable[[], bool] | None = None,
        probe_s: float = 5,
    ) -> None:
        """`alive`, if given, is asked whenever a reply is `probe_s` late: a False ends the
        wait with ConnectionError (ZeroMQ itself would wait for a dead server forever)."""
        self.address = address
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.alive = alive
        self.probe_s = probe_s
        self._probe_lock = threading.Lock()
        self._probed_at, self._last_alive = float("-inf"), True
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        self._outbox: queue.Queue = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        self._waiting: dict[str, queue.Queue] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._receive, daemon=True, name="radixrt-zmq-client"
        )
        self._thread.start()

    def generate(
        self,
        text: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        **fields: Any,
    ) -> Any:
        """Engine.generate's result (a dict, or a list for a batch or n > 1). `fields`: the
        other fields of GenerateReqInput (protocol/request_input.py) by name: return_logprob,
        logprob_start_len, top_logprobs_num, return_text_in_logprobs, token_ids_logprob,
        rid, ... (TypeError for a name it does not have)."""
        fields["stream"] = False
        return next(self._exchange(self._message(text, sampling_params, input_ids, fields)))

    def generate_stream(
        self,
        text: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        **fields: Any,
    ) -> Iterator[dict[str, Any]]:
        """Chunks with the new text of each step, as Engine.generate(stream=True) yields them
        (meta_info's logprob lists hold everything so far). Closing the iterator early aborts
        the request."""
        fields["stream"] = True
        return self._exchange(self._message(text, sampling_params, input_ids, fields))

    def _message(self, text, sampling_params, input_ids, fields) -> ClientGenerate:
        req = make_request(
            text=text, sampling_params=sampling_params, input_ids=input_ids, **fields
        )
        return ClientGenerate(_new_id(), req)

    def flush_cache(self) -> bool:
        return next(self._exchange(ClientControl(_new_id(), "flush_cache")))

    def get_server_info(self) -> dict[str, Any]:
        return next(self._exchange(ClientControl(_new_id(), "get_server_info")))

    def close(self) -> None:
        self._closed.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        self._sock.close()
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> ZmqClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _exchange(self, msg) -> Iterator[Any]:
        """Send msg; yield each chunk's data, then the result's data (None after a stream)."""
        inbox: queue.Queue = queue.Queue()
        self._waiting[msg.request_id] = inbox
        self._send(msg)
        done = False
        try:
            while True:
                reply: ClientReply = self._next_reply(inbox)
                if reply.kind == "error":
                    done = True
                    raise FrontendError(reply.error, reply.status)
                if reply.kind == "result":
                    done = True
                    if (
                        reply.data is not None
                        or not isinstance(msg, ClientGenerate)
                        or not msg.request.stream
                    ):
                        yield reply.data
                    return
                yield reply.data
        finally:
            self._waiting.pop(msg.request_id, None)
            if not done and not self._closed.is_set():
                self._send(ClientAbort(msg.request_id))

    def _next_reply(self, inbox: queue.Queue) -> ClientReply:
        deadline = time.monotonic() + self.timeout_s
        while True:
            wait = min(self.probe_s, deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError(f"no reply from {self.address} within {self.timeout_s} s")
            try:
                return inbox.get(timeout=wait)
            except queue.Empty:
                if not self._server_alive():
                    raise ConnectionError(f"the server at {self.address} is gone") from None

    def _server_alive(self) -> bool:
        """`alive()`, asked at most once per probe_s however many callers wait."""
        if self.alive is None:
            return True
        with self._probe_lock:
            if time.monotonic() - self._probed_at >= self.probe_s:
                self._last_alive, self._probed_at = self.alive(), time.monotonic()
            return self._last_alive

    def _send(self, msg) -> None:
        self._outbox.put(client_frames(msg, self.api_key))
        os.write(self._wake_w, b"x")

    def _receive(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._closed.is_set():
            events = dict(poller.poll(1000))
            if self._wake_r in events:
                os.read(self._wake_r, 4096)
                while not self._outbox.empty():
                    self._sock.send_multipart(self._outbox.get())
            while self._sock.poll(0):
                reply = decode_client_reply(self._sock.recv())
                inbox = self._waiting.get(reply.request_id)
                if inbox is not None:
                    inbox.put(reply)


def _new_id() -> str:
    return uuid.uuid4().hex
