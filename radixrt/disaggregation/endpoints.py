"""The tcp transfer backend: ZeroMQ sockets between the two schedulers, pages as raw frames.

The prefill server binds one ROUTER on its bootstrap port (SGLang's --disaggregation-bootstrap-
port: SMG probes that port with a bare TCP connect, which ZeroMQ shrugs off). A decode server
opens one DEALER per prefill address it is sent to, on first use. Both sides only ever poll
(no blocking call): the scheduler loop stays in charge. docs/disaggregation.md maps these calls
onto NIXL's and Mooncake's.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence

import zmq

from radixrt.disaggregation.messages import (
    KVCancel,
    KVPages,
    KVPull,
    KVWait,
    decode_to_decode,
    decode_to_prefill,
    encode,
)

logger = logging.getLogger(__name__)
Frames = Sequence[bytes | memoryview]


def tcp_address(host: str, port: int, bind: bool = False) -> str:
    """tcp://IP:PORT for ZeroMQ, which takes IPs, not host names ("*" binds every interface)."""
    if bind and host in ("0.0.0.0", "::", ""):
        return f"tcp://*:{port}"
    try:
        ip = socket.gethostbyname(host)
    except OSError as e:
        raise ValueError(f"cannot resolve bootstrap host {host!r}: {e}") from e
    return f"tcp://{ip}:{port}"


class PrefillEndpoint:
    """The prefill side: pulls and cancels arrive from any decode server; pages go back to the
    one that asked (identified by its ZeroMQ routing id)."""

    def __init__(self, host: str, port: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone peer raises, not a silent drop
        self.sock.setsockopt(zmq.SNDTIMEO, 1000)
        address = tcp_address(host, port, bind=True)
        try:
            self.sock.bind(address)
        except zmq.ZMQError as e:
            self.close()
            raise RuntimeError(
                f"cannot bind the disaggregation bootstrap port {address}: {e} (is another "
                "prefill server on it? --disaggregation-bootstrap-port picks another)"
            ) from e

    def receive(self) -> list[tuple[bytes, KVPull | KVCancel]]:
        """Every message waiting now, as (peer, message); undecodable ones are dropped."""
        got = []
        while self.sock.poll(0):
            parts = self.sock.recv_multipart()
            try:
                got.append((parts[0], decode_to_prefill(parts[1])))
            except Exception as e:  # noqa: BLE001 - a bad peer must not stop the scheduler
                logger.warning("dropped a disaggregation message that does not decode: %s", e)
        return got

    def send(self, peer: bytes, header: KVPages | KVWait, frames: Frames = ()) -> bool:
        """Send one answer; False if the peer is gone (or its queue stayed full for 1 s)."""
        try:
            self.sock.send_multipart([peer, encode(header), *frames], copy=False)
            return True
        except zmq.ZMQError as e:
            logger.warning("room %d: the decode server is unreachable: %s", header.room, e)
            return False

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


class DecodeEndpoint:
    """The decode side: one DEALER per prefill server (host, port), connected on first use."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.peers: dict[tuple[str, int], zmq.Socket] = {}

    def send(self, host: str, port: int, msg: KVPull | KVCancel) -> None:
        """Queue a message for the prefill server (ZeroMQ connects in the background; one that
        never answers is the caller's timeout to notice)."""
        sock = self.peers.get((host, port))
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(tcp_address(host, port))
            self.peers[(host, port)] = sock
        try:
            sock.send(encode(msg), zmq.NOBLOCK)
        except zmq.ZMQError as e:  # its queue is full: the peer has not read for a long time
            logger.warning("room %d: cannot queue a message to %s:%d: %s", msg.room, host, port, e)

    def receive(self) -> list[tuple[KVPages | KVWait, list[zmq.Frame]]]:
        """Every answer waiting now, as (header, K/V frames)."""
        got = []
        for sock in self.peers.values():
            while sock.poll(0):
                parts = sock.recv_multipart(copy=False)
                try:
                    got.append((decode_to_decode(parts[0].bytes), parts[1:]))
                except Exception as e:  # noqa: BLE001
                    logger.warning("dropped a disaggregation message that does not decode: %s", e)
        return got

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close(0)
        self.ctx.term()
