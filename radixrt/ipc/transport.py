"""The small transport interface between the frontend, the scheduler loop and the detokenizer.

Messages are msgspec-encoded bytes either way, so the in-process queues (tests, notebooks) and
the ZeroMQ sockets (separate processes) carry exactly the same data. Torch-free: the HTTP
process imports it.
"""

from __future__ import annotations

import queue
from typing import NamedTuple, Protocol

import zmq


class Transport(Protocol):
    def recv(self, timeout: float | None) -> list[bytes]:
        """Every pending message; waits up to `timeout` seconds (None: forever) for the first."""
        ...

    def send(self, data: bytes, block: bool = True, timeout: float | None = None) -> bool:
        """Queue one message; False if it could not be queued (block=False: at once; else
        within `timeout` seconds, None: wait as long as it takes)."""
        ...


class QueueTransport:
    """One end of a pair of in-process queues."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue) -> None:
        self.inbox = inbox
        self.outbox = outbox

    def recv(self, timeout: float | None) -> list[bytes]:
        try:
            first = self.inbox.get(timeout=timeout) if timeout != 0 else self.inbox.get_nowait()
        except queue.Empty:
            return []
        items = [first]
        while True:
            try:
                items.append(self.inbox.get_nowait())
            except queue.Empty:
                return items

    def send(self, data: bytes, block: bool = True, timeout: float | None = None) -> bool:
        self.outbox.put(data)
        return True


def queue_pair() -> tuple[QueueTransport, QueueTransport]:
    """(frontend end, scheduler end) of a fresh in-process channel."""
    to_sched: queue.Queue = queue.Queue()
    from_sched: queue.Queue = queue.Queue()
    return QueueTransport(from_sched, to_sched), QueueTransport(to_sched, from_sched)


class QueuePipeline(NamedTuple):
    """The three ends of in-process queues laid out as the processes are: the frontend sends
    to the scheduler, the scheduler to the detokenizer, the detokenizer to the frontend."""

    frontend: QueueTransport
    scheduler: QueueTransport
    detokenizer: QueueTransport


def queue_pipeline() -> QueuePipeline:
    to_sched: queue.Queue = queue.Queue()
    to_detok: queue.Queue = queue.Queue()
    to_front: queue.Queue = queue.Queue()
    return QueuePipeline(
        QueueTransport(to_front, to_sched),
        QueueTransport(to_sched, to_detok),
        QueueTransport(to_detok, to_front),
    )


class ZmqTransport:
    """PUSH/PULL ZeroMQ sockets carrying the same msgspec bytes between processes."""

    def __init__(
        self, recv_addr: str, send_addr: str, bind: bool, bind_send: bool | None = None
    ) -> None:
        """`bind` says whether this end binds (else connects) its sockets; `bind_send`, when
        given, overrides it for the sending socket (a process in the middle of a pipeline)."""
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.push = self.ctx.socket(zmq.PUSH)
        bind_send = bind if bind_send is None else bind_send
        for sock, addr, b in ((self.pull, recv_addr, bind), (self.push, send_addr, bind_send)):
            sock.setsockopt(zmq.LINGER, 1000)  # let a last message (an error) out
            sock.bind(addr) if b else sock.connect(addr)

    def recv(self, timeout: float | None) -> list[bytes]:
        ms = -1 if timeout is None else int(timeout * 1000)
        if not self.pull.poll(ms):
            return []
        items = [self.pull.recv()]
        while self.pull.poll(0):
            items.append(self.pull.recv())
        return items

    def send(self, data: bytes, block: bool = True, timeout: float | None = None) -> bool:
        """Queue one message; with block=False or past `timeout` seconds, give up (False)
        rather than wait for a peer that is gone (a PUSH socket without one blocks)."""
        if block and timeout is not None and not self.push.poll(int(timeout * 1000), zmq.POLLOUT):
            return False
        try:
            self.push.send(data, 0 if block and timeout is None else zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def close(self, linger_s: float = 1.0) -> None:
        """Close the sockets, letting queued messages out for up to `linger_s` seconds (0 once
        the peers are known to be gone: nothing would take them)."""
        for sock in (self.pull, self.push):
            sock.close(linger=int(linger_s * 1000))
        self.ctx.term()
