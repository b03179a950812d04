"""The transfer's parts without a model: pages out of one pool and into another, bit for bit in
every pool dtype; frames that do not fit are refused; the messages round-trip through msgspec;
a real ZeroMQ pair of endpoints carries a pull and its pages over loopback TCP. And what a
stranger can do to them: a message signed with another key is dropped by either side (an
answer's pages are never handed on), a frame over the bootstrap port's limit costs the sender
its connection and nothing else, and a thousand peers leave no socket open."""

from __future__ import annotations

import os
import time

import pytest
import torch
import zmq
from launch_helpers import free_port
from zmq.utils.monitor import recv_monitor_message

from radixrt.cache.kv_pool import KVPool
from radixrt.disaggregation.endpoints import DecodeEndpoint, PrefillEndpoint, bind_address
from radixrt.disaggregation.messages import (
    KVCancel,
    KVLayout,
    KVPages,
    KVPull,
    KVWait,
    decode_to_decode,
    decode_to_prefill,
    encode,
    prompt_digest,
    sign,
)
from radixrt.disaggregation.pages import layout_of, read_slots, write_slots
from radixrt.disaggregation.peers import BootstrapPeers


def _pool(dtype: torch.dtype, size: int = 64) -> KVPool:
    return KVPool(size, num_layers=3, num_kv_heads=2, head_dim=8, dtype=dtype, device="cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pages_move_bit_for_bit(dtype):
    src, dst = _pool(dtype), _pool(dtype)
    gen = torch.Generator().manual_seed(0)
    for layer in range(src.num_layers):
        for buf in src.get_kv(layer):
            buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
    from_slots, to_slots = torch.tensor([5, 6, 7, 20, 21]), torch.tensor([40, 41, 42, 43, 9])
    frames = read_slots(src, from_slots)
    assert len(frames) == 2 * src.num_layers
    written = write_slots(dst, to_slots, [bytes(f) for f in frames])
    assert written == 2 * 3 * 5 * 2 * 8 * src.k_buffer[0].element_size()
    for layer in range(src.num_layers):
        for a, b in zip(src.get_kv(layer), dst.get_kv(layer), strict=True):
            assert torch.equal(a[from_slots], b[to_slots])
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[to_slots] = False
    assert not dst.k_buffer[0][untouched].any()


def test_frames_that_do_not_fit_are_refused():
    pool = _pool(torch.float32)
    frames = read_slots(pool, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="expected 6 frames"):
        write_slots(pool, torch.tensor([3, 4]), frames[:-1])
    with pytest.raises(ValueError, match="holds 128 bytes, expected 64"):
        write_slots(pool, torch.tensor([3]), frames)
    empty = read_slots(pool, torch.tensor([], dtype=torch.int64))
    assert write_slots(pool, torch.tensor([], dtype=torch.int64), empty) == 0


def test_messages_round_trip_and_the_digest_tells_prompts_apart():
    layout = layout_of(_pool(torch.bfloat16))
    assert layout == KVLayout(3, 2, 8, "bfloat16")
    pull = KVPull(7, 40, 16, prompt_digest([1, 2, 3]), layout)
    assert decode_to_prefill(encode(pull)) == pull
    assert decode_to_prefill(encode(KVCancel(7))) == KVCancel(7)
    pages = KVPages(7, True, count=24, first_token=5, logprob=-0.5, top_logprobs=[(-0.5, 5)])
    assert decode_to_decode(encode(pages)) == pages
    assert decode_to_decode(encode(KVWait(7))) == KVWait(7)
    assert prompt_digest([1, 2, 3]) != prompt_digest([1, 2, 4])
    with pytest.raises(Exception):  # noqa: B017 - msgspec's own error type
        decode_to_prefill(b"\x93not a message")


def test_a_pull_and_its_pages_over_loopback_tcp():
    port = free_port()
    prefill = PrefillEndpoint("127.0.0.1", port, b"k")
    decode = DecodeEndpoint(BootstrapPeers("127.0.0.1"), b"k", 1 << 20, 30.0)
    pool = _pool(torch.float32)
    pool.k_buffer[1][3] = 2.5
    try:
        pull = KVPull(9, 4, 0, prompt_digest([1, 2, 3, 4]), layout_of(pool))
        address = decode.address("127.0.0.1", port)
        assert address == f"tcp://127.0.0.1:{port}" and decode.send(address, pull)
        got = _wait(prefill.receive)
        (peer, msg) = got[0]
        assert msg == pull
        frames = read_slots(pool, torch.tensor([3]))
        assert prefill.send(peer, KVPages(9, True, count=1, first_token=11), frames)
        (peer_address, header, raw, authentic) = _wait(decode.receive)[0]
        assert peer_address == address and authentic
        assert header.first_token == 11 and len(raw) == 6
        target = _pool(torch.float32)
        write_slots(target, torch.tensor([0]), [f.buffer for f in raw])
        assert target.k_buffer[1][0].eq(2.5).all()
        assert not prefill.send(b"nobody", KVPages(9, False, "x"))  # a gone peer: False
    finally:
        prefill.close()
        decode.close()


def test_a_taken_bootstrap_port_is_named():
    port = free_port()
    first = PrefillEndpoint("127.0.0.1", port)
    try:
        with pytest.raises(RuntimeError, match="--disaggregation-bootstrap-port"):
            PrefillEndpoint("127.0.0.1", port)
    finally:
        first.close()
    assert bind_address("0.0.0.0", 5) == "tcp://*:5"
    assert bind_address("::1", 5) == "tcp://[::1]:5"


def _wait(receive, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = receive()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("nothing arrived")


def _pull(room: int = 9, digest: str = "") -> KVPull:
    return KVPull(
        room, 4, 0, digest or prompt_digest([1, 2, 3, 4]), layout_of(_pool(torch.float32))
    )


def _decode_endpoint(key: bytes, **kwargs) -> DecodeEndpoint:
    return DecodeEndpoint(BootstrapPeers("127.0.0.1"), key, 1 << 20, 30.0, **kwargs)


def test_a_pull_signed_with_another_key_is_dropped_unanswered():
    port = free_port()
    prefill = PrefillEndpoint("127.0.0.1", port, b"right")
    stranger, friend = _decode_endpoint(b"wrong"), _decode_endpoint(b"right")
    try:
        stranger.send(stranger.address("127.0.0.1", port), _pull(1))
        friend.send(friend.address("127.0.0.1", port), _pull(2))
        (peer, msg) = _wait(prefill.receive)[0]
        time.sleep(0.2)  # the stranger's went first: it is not merely late
        assert msg.room == 2 and prefill.receive() == [] and prefill.dropped == 1
    finally:
        for endpoint in (prefill, stranger, friend):
            endpoint.close()


def test_pages_signed_with_another_key_are_flagged_and_never_handed_on():
    port = free_port()
    ctx = zmq.Context()
    impostor = ctx.socket(zmq.ROUTER)  # answers any pull, as a prefill server with no key check
    impostor.bind(f"tcp://127.0.0.1:{port}")
    decode = _decode_endpoint(b"right")
    try:
        address = decode.address("127.0.0.1", port)
        decode.send(address, _pull(5))
        assert impostor.poll(5000)
        identity, _, _ = impostor.recv_multipart()
        for key in (b"wrong", b"right"):
            header = encode(KVPages(5, True, count=1, first_token=3))
            impostor.send_multipart([identity, sign(key, header), header, b"\x7f" * 64])
            answer = _wait(decode.receive)[0]
            assert answer.peer == address and answer.header.room == 5
            assert answer.authentic == (key == b"right")
            assert len(answer.frames) == (1 if answer.authentic else 0)
    finally:
        decode.close()
        impostor.close(0)
        ctx.term()


def test_a_frame_over_the_limit_costs_the_sender_its_connection_and_nothing_else():
    port = free_port()
    prefill = PrefillEndpoint("127.0.0.1", port, b"k", max_message_bytes=1024)
    ctx = zmq.Context()
    flooder = ctx.socket(zmq.DEALER)
    flooder.setsockopt(zmq.LINGER, 0)
    events = flooder.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    decode = _decode_endpoint(b"k")
    try:
        flooder.connect(f"tcp://127.0.0.1:{port}")
        big = encode(_pull(7, digest="x" * 4096))  # signed right: only its size is wrong
        flooder.send_multipart([sign(b"k", big), big])
        seen = [recv_monitor_message(events)["event"] for _ in range(2) if events.poll(5000)]
        assert seen == [zmq.EVENT_CONNECTED, zmq.EVENT_DISCONNECTED]
        assert prefill.receive() == []
        decode.send(decode.address("127.0.0.1", port), _pull(8))
        assert [msg.room for _, msg in _wait(prefill.receive)] == [8]  # still serving
    finally:
        events.close(0)
        flooder.close(0)
        ctx.term()
        prefill.close()
        decode.close()


def test_a_thousand_peers_leave_no_socket_open():
    """Every loopback port is allowed by default: at most max_peers sockets are open at
    once, and each is closed once idle for the timeout."""
    decode = DecodeEndpoint(BootstrapPeers("127.0.0.1"), b"", 1 << 20, 0.3, max_peers=8)
    try:
        decode.send(decode.address("127.0.0.1", 1), KVCancel(0))  # ZeroMQ's own threads up
        time.sleep(0.4)
        decode.close_idle()
        baseline = _open_fds()
        sent = [decode.send(decode.address("127.0.0.1", p), KVCancel(p)) for p in range(2, 1002)]
        assert sum(sent) == 8 and len(decode.open) == 8
        assert not decode.send(decode.address("127.0.0.1", 500), KVCancel(5), open_new=False)
        time.sleep(0.4)
        decode.close_idle()
        assert not decode.open
        _wait(lambda: _open_fds() <= baseline)  # ZeroMQ's reaper closes them just after
    finally:
        decode.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
