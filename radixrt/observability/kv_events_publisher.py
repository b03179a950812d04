"""The ZeroMQ side of KV events: vLLM's `ZmqEventPublisher` protocol.

PUB socket: every batch is one multipart message [topic, seq, payload]: the topic (UTF-8),
the batch's sequence number as 8 bytes big-endian (0, 1, 2, ... with no gaps), and the
msgpack-encoded `KVEventBatch`. A subscriber that sees a gap asks the ROUTER replay socket:
it sends the first sequence number it wants (8 bytes big-endian) after an empty delimiter
frame, and gets back one [b"", seq, payload] message per batch still buffered from there on,
then the end marker [b"", -1 as 8 bytes big-endian signed, b""]. Use a DEALER socket: a REQ
socket (which adds and strips the delimiter itself) takes only the first reply.

The scheduler only appends to a queue (`publish` never blocks it); a thread encodes, sends,
keeps the last `buffer_steps` batches for replay and answers replay requests.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import deque
from itertools import count

import msgspec
import zmq

from radixrt.observability.kv_events import KVEventBatch, KVEventsConfig

logger = logging.getLogger("radixrt.kv_events_publisher")  # kept across moves

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.02  # the thread's wait for a batch, so replay requests are answered promptly
_SHUTDOWN_S = 1.0


def offset_endpoint_port(endpoint: str, data_parallel_rank: int) -> str:
    """`endpoint` for replica `data_parallel_rank`: a tcp port plus the rank, an inproc or ipc
    name with `_dp<rank>` appended (vLLM's rule); rank 0 keeps it unchanged."""
    if data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + data_parallel_rank}"
    return f"{endpoint}_dp{data_parallel_rank}"


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
EVERY_INTERFACE = ("*", "0.0.0.0", "[::]")


def _host(endpoint: str) -> str:
    return endpoint.removeprefix("tcp://").rpartition(":")[0]


def _binds(endpoint: str) -> bool:
    """vLLM's convention, plus loopback: a wildcard, a loopback address (radixrt's default) or a
    local transport binds (stable), anything else connects."""
    local = endpoint.startswith(("ipc://", "inproc://")) or _host(endpoint) in LOOPBACK_HOSTS
    return local or "*" in endpoint or "::" in endpoint


def _warn_if_public(endpoint: str, field: str) -> None:
    if _host(endpoint) in EVERY_INTERFACE:
        logger.warning(
            "kv_events_config: %s %s publishes every cached prompt's token ids on every "
            "interface, with no key; bind 127.0.0.1 unless other hosts must subscribe",
            field, endpoint,
        )  # fmt: skip


class ZmqEventPublisher:
    """PUB + optional ROUTER replay socket, fed by a queue and served by one thread."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.endpoint = offset_endpoint_port(config.endpoint, data_parallel_rank)
        replay = config.replay_endpoint
        self.replay_endpoint = replay and offset_endpoint_port(replay, data_parallel_rank)
        self._topic = config.topic.encode()
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = count()
        self._dropped = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        # Made here, used only by the thread from now on (ZeroMQ allows handing a socket over).
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.set_hwm(config.hwm)
            _attach(self._pub, self.endpoint, "endpoint")
            if self.replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                _attach(self._replay, self.replay_endpoint, "replay_endpoint", bind=True)
        except ValueError:
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events")
        self._thread.start()

    def publish(self, batch: KVEventBatch) -> None:
        """Queue `batch` for sending; when the queue is full it is dropped (and logged) rather
        than stalling the scheduler: subscribers then hold a stale view until the next flush."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._dropped += 1
            logger.error("KV events: queue full, %d batches dropped so far", self._dropped)

    def shutdown(self) -> None:
        """Send what is queued (for up to a second), then close the sockets."""
        with contextlib.suppress(queue.Full):  # a full queue: the join below times out
            self._queue.put(None, timeout=_SHUTDOWN_S)
        self._thread.join(timeout=_SHUTDOWN_S)
        if self._thread.is_alive():
            logger.warning("KV events: the publisher thread did not stop in %.0f s", _SHUTDOWN_S)
            return  # it still uses the sockets; the daemon thread dies with the process
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    # ---- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                return
            seq, payload = next(self._seq), encoder.encode(batch)
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError as e:  # a subscriber can still replay it from the buffer
                logger.error("KV events: sending batch %d failed: %s", seq, e)
            self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("KV events: ignored a malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


def _attach(sock: zmq.Socket[bytes], endpoint: str, field: str, bind: bool = False) -> None:
    """Bind or connect `sock`; a bad endpoint or a port in use names the config field."""
    try:
        if bind or _binds(endpoint):
            _warn_if_public(endpoint, field)
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError as e:
        raise ValueError(f"kv_events_config: {field} {endpoint!r}: {e}") from None
