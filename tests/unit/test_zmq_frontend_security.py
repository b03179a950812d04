"""The ZeroMQ frontend's defences, on a real socket with a stand-in engine (no model): the API
key is checked before the payload is decoded, an oversized message is never read, and an
exposed host without a key binds loopback."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest
import zmq
import zmq.asyncio

from radixrt.entrypoints.zmq_frontend import ZmqFrontend
from radixrt.protocol.messages import ClientControl, client_frames, decode_client_reply


class _Engine:
    def __init__(self, max_bytes: int = 1 << 20) -> None:
        self.server_args = SimpleNamespace(max_request_bytes=max_bytes)
        self.info_calls = 0

    def get_server_info(self) -> dict:
        self.info_calls += 1
        return {"ok": True}


async def _exchange(frontend: ZmqFrontend, messages: list[list[bytes]], wait_s: float = 2.0):
    """Send each multipart message from its own DEALER; the replies that came back in time."""
    task = asyncio.ensure_future(frontend.serve())
    ctx = zmq.asyncio.Context()
    socks, replies = [], []
    try:
        for frames in messages:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(frontend.address)
            await sock.send_multipart(frames)
            socks.append(sock)
        for sock in socks:
            if await sock.poll(int(wait_s * 1000)):
                replies.append(decode_client_reply(await sock.recv()))
            else:
                replies.append(None)
    finally:
        for sock in socks:
            sock.close()
        ctx.term()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return replies


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_a_wrong_key_is_refused_before_the_payload_is_decoded():
    engine = _Engine()
    frontend = ZmqFrontend(engine, "127.0.0.1", "secret")
    junk = b"\xc1 not msgpack at all"  # decoding it would answer 400, not 401
    good = client_frames(ClientControl("r3", "get_server_info"), "secret")
    replies = _run(_exchange(frontend, [[b"r1", b"wrong", junk], [b"r2", b"", junk], good]))
    assert [(r.request_id, r.status) for r in replies[:2]] == [("r1", 401), ("r2", 401)]
    assert replies[2].kind == "result" and replies[2].data == {"ok": True}
    assert engine.info_calls == 1


def test_a_payload_with_a_right_key_but_bad_bytes_is_a_400():
    frontend = ZmqFrontend(_Engine(), "127.0.0.1", "secret")
    bad = msgspec.msgpack.encode(
        {"type": "client_control", "request_id": "other", "kind": "get_server_info"}
    )
    replies = _run(_exchange(frontend, [[b"r1", b"secret", b"\xc1"], [b"r2", b"secret", bad]]))
    assert [r.status for r in replies] == [400, 400]
    assert "differs" in replies[1].error


def test_a_payload_nested_too_deeply_is_a_400_not_a_crash():
    enc = msgspec.msgpack.encode
    deep = b"\x91" * 100_000 + b"\xc0"  # a list in a list in a list ... of nil
    payload = (
        b"\x83"
        + enc("type")
        + enc("client_generate")
        + enc("request_id")
        + enc("r1")
        + enc("request")
        + b"\x81"
        + enc("custom_logit_processor")
        + deep
    )
    good = client_frames(ClientControl("r2", "get_server_info"), None)
    replies = _run(
        _exchange(ZmqFrontend(_Engine(), "127.0.0.1", None), [[b"r1", b"", payload], good])
    )
    assert replies[0].status == 400 and "nested" in replies[0].error
    assert replies[1].kind == "result"


@pytest.mark.slow  # sends a message past the size limit
def test_an_oversized_message_is_dropped_and_the_frontend_keeps_serving():
    engine = _Engine(max_bytes=4096)
    frontend = ZmqFrontend(engine, "127.0.0.1", None)
    big = [b"r1", b"", b"\x00" * 100_000]
    good = client_frames(ClientControl("r2", "get_server_info"), None)
    replies = _run(_exchange(frontend, [big, good]))
    assert replies[0] is None  # never read: the peer's connection was dropped
    assert replies[1].kind == "result" and engine.info_calls == 1


def test_every_interface_without_a_key_binds_loopback_only(caplog):
    frontend = ZmqFrontend(_Engine(), "0.0.0.0", None)
    try:
        assert frontend.address.startswith("tcp://127.0.0.1:")
        assert "--api-key" in caplog.text
    finally:
        frontend.sock.close()
        frontend.ctx.term()
    keyed = ZmqFrontend(_Engine(), "0.0.0.0", "secret")
    try:
        assert keyed.address.startswith("tcp://0.0.0.0:")
    finally:
        keyed.sock.close()
        keyed.ctx.term()
