"""The tcp transfer backend: ZeroMQ sockets between the two schedulers, pages as raw frames.

The prefill server binds one ROUTER on its bootstrap port (SGLang's --disaggregation-bootstrap-
port: SMG probes that port with a bare TCP connect, which ZeroMQ shrugs off). A decode server
opens one DEALER per allowed prefill address (disaggregation/peers.py) on first use, at most
`max_peers` of them, and closes one that has been idle for the transfer timeout. Every message
is [tag, header, *frames], the tag signing the header under the shared bootstrap key
(messages.sign); no socket reads a frame larger than its limit (zmq.MAXMSGSIZE: ZeroMQ drops
the sender's connection instead). Both sides only ever poll (no blocking call): the scheduler
loop stays in charge. docs/disaggregation.md maps these calls onto NIXL's and Mooncake's, and
says what each check stops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import zmq

from radixrt.disaggregation.messages import (
    KVCancel,
    KVPages,
    KVPull,
    KVWait,
    decode_to_decode,
    decode_to_prefill,
    encode,
    sign,
    signed_by,
)
from radixrt.disaggregation.peers import BootstrapPeers

logger = logging.getLogger(__name__)
Frames = Sequence[bytes | memoryview]

MAX_PULL_BYTES = 64 * 1024  # a pull or cancel is ~100 bytes; nothing larger is read
MAX_PEERS = 64  # DEALER sockets a decode server keeps open at once


def bind_address(host: str, port: int) -> str:
    """tcp://HOST:PORT to bind ("*" for every interface; a v6 literal in brackets)."""
    if host in ("0.0.0.0", "::", ""):
        return f"tcp://*:{port}"
    host = host.strip("[]")
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class PrefillEndpoint:
    """The prefill side: pulls and cancels arrive from decode servers; pages go back to the
    one that asked (identified by its ZeroMQ routing id). A message whose tag does not verify
    under `key` is dropped unanswered."""

    def __init__(
        self, host: str, port: int, key: bytes = b"", max_message_bytes: int = MAX_PULL_BYTES
    ) -> None:
        self.key = key
        self.dropped = 0  # messages refused: unsigned, wrongly signed or malformed
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone peer raises, not a silent drop
        self.sock.setsockopt(zmq.SNDTIMEO, 1000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.sock.setsockopt(zmq.IPV6, int(":" in host))
        address = bind_address(host, port)
        try:
            self.sock.bind(address)
        except zmq.ZMQError as e:
            self.close()
            raise RuntimeError(
                f"cannot bind the disaggregation bootstrap port {address}: {e} (is another "
                "prefill server on it? --disaggregation-bootstrap-port picks another)"
            ) from e

    def receive(self) -> list[tuple[bytes, KVPull | KVCancel]]:
        """Every authentic message waiting now, as (peer, message)."""
        got = []
        while self.sock.poll(0):
            parts = self.sock.recv_multipart()
            if len(parts) != 3 or not signed_by(self.key, parts[2], parts[1]):
                self._drop("unsigned or not signed with this server's bootstrap key")
                continue
            try:
                got.append((parts[0], decode_to_prefill(parts[2])))
            except Exception as e:  # noqa: BLE001 - a bad peer must not stop the scheduler
                self._drop(f"it does not decode: {e}")
        return got

    def send(self, peer: bytes, header: KVPages | KVWait, frames: Frames = ()) -> bool:
        """Send one answer; False if the peer is gone (or its queue stayed full for 1 s)."""
        data = encode(header)
        try:
            self.sock.send_multipart([peer, sign(self.key, data), data, *frames], copy=False)
            return True
        except zmq.ZMQError as e:
            logger.warning("room %d: the decode server is unreachable: %s", header.room, e)
            return False

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def _drop(self, why: str) -> None:
        # Logged at the 1st, 2nd, 4th, 8th... drop: a stranger's flood cannot flood the log.
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:
            logger.warning("dropped a bootstrap message (%d so far): %s", self.dropped, why)


class Answer(NamedTuple):
    """One message from a prefill server: the address it came over, its header, its K/V
    frames, and whether its tag verified (if not, the frames are dropped: empty)."""

    peer: str
    header: KVPages | KVWait
    frames: list[zmq.Frame]
    authentic: bool


@dataclass
class _Peer:
    sock: zmq.Socket
    active_at: float  # monotonic time of the last send or receive


class DecodeEndpoint:
    """The decode side: one DEALER per allowed prefill address, opened on first use."""

    def __init__(
        self,
        peers: BootstrapPeers,
        key: bytes,
        max_frame_bytes: int,
        idle_timeout: float,
        max_peers: int = MAX_PEERS,
    ) -> None:
        """`max_frame_bytes`: the largest frame a legitimate answer holds (one layer's K of
        the longest prompt); `idle_timeout`: seconds after which a quiet socket is closed."""
        self.peers = peers
        self.key = key
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout = idle_timeout
        self.max_peers = max_peers
        self.ctx = zmq.Context()
        self.open: dict[str, _Peer] = {}  # by tcp:// address

    def address(self, host: str, port: int) -> str:
        """The address to pull from for a request's bootstrap_host and bootstrap_port;
        ParamError (naming bootstrap_host) if they are not an allowed peer."""
        return self.peers.address(host, port)

    def can_reach(self, address: str) -> bool:
        """Its socket is open, or one more may be."""
        return address in self.open or len(self.open) < self.max_peers

    def send(self, address: str, msg: KVPull | KVCancel, open_new: bool = True) -> bool:
        """Queue a message for the prefill server (ZeroMQ connects in the background; one
        that never answers is the caller's timeout to notice). False if it was not queued:
        no socket may be opened (the cap, or `open_new` False), or its queue is full."""
        peer = self.open.get(address)
        if peer is None:
            if not open_new or not self.can_reach(address):
                return False
            peer = self.open[address] = _Peer(self._connect(address), 0.0)
        peer.active_at = time.monotonic()
        data = encode(msg)
        try:
            peer.sock.send_multipart([sign(self.key, data), data], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:  # its queue is full: the peer has not read for a long time
            logger.warning("room %d: cannot queue a message to %s: %s", msg.room, address, e)
            return False

    def receive(self) -> list[Answer]:
        """Every answer waiting now."""
        got = []
        for address, peer in self.open.items():
            while peer.sock.poll(0):
                peer.active_at = time.monotonic()
                answer = self._read(address, peer.sock.recv_multipart(copy=False))
                if answer is not None:
                    got.append(answer)
        return got

    def close_idle(self) -> None:
        """Close every socket quiet for longer than the idle timeout (ZeroMQ would otherwise
        keep retrying a dead peer's connection for ever)."""
        now = time.monotonic()
        for address, peer in list(self.open.items()):
            if now - peer.active_at > self.idle_timeout:
                peer.sock.close(0)
                del self.open[address]

    def close(self) -> None:
        for peer in self.open.values():
            peer.sock.close(0)
        self.open.clear()
        self.ctx.term()

    def _connect(self, address: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        sock.setsockopt(zmq.IPV6, int(address.startswith("tcp://[")))
        sock.connect(address)
        return sock

    def _read(self, address: str, parts: list[zmq.Frame]) -> Answer | None:
        if len(parts) < 2:
            logger.warning("dropped a message of %d frame(s) from %s", len(parts), address)
            return None
        tag, data = parts[0].bytes, parts[1].bytes
        try:
            header = decode_to_decode(data)
        except Exception as e:  # noqa: BLE001 - a bad peer must not stop the scheduler
            logger.warning("dropped a message from %s that does not decode: %s", address, e)
            return None
        if not signed_by(self.key, data, tag):
            return Answer(address, header, [], False)
        return Answer(address, header, parts[2:], True)
