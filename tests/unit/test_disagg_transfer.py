"""The transfer's parts without a model: pages out of one pool and into another, bit for bit in
every pool dtype; frames that do not fit are refused; the messages round-trip through msgspec;
a real ZeroMQ pair of endpoints carries a pull and its pages over loopback TCP."""

from __future__ import annotations

import time

import pytest
import torch
from launch_helpers import free_port

from radixrt.cache.kv_pool import KVPool
from radixrt.disaggregation.endpoints import DecodeEndpoint, PrefillEndpoint, tcp_address
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
)
from radixrt.disaggregation.pages import layout_of, read_slots, write_slots


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
    prefill, decode = PrefillEndpoint("127.0.0.1", port), DecodeEndpoint()
    pool = _pool(torch.float32)
    pool.k_buffer[1][3] = 2.5
    try:
        pull = KVPull(9, 4, 0, prompt_digest([1, 2, 3, 4]), layout_of(pool))
        decode.send("127.0.0.1", port, pull)
        got = _wait(prefill.receive)
        (peer, msg) = got[0]
        assert msg == pull
        frames = read_slots(pool, torch.tensor([3]))
        assert prefill.send(peer, KVPages(9, True, count=1, first_token=11), frames)
        (header, raw) = _wait(decode.receive)[0]
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
    assert tcp_address("0.0.0.0", 5, bind=True) == "tcp://*:5"
    with pytest.raises(ValueError, match="cannot resolve bootstrap host"):
        tcp_address("no-such-host.invalid", 5)


def _wait(receive, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = receive()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("nothing arrived")
