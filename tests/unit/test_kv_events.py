"""KV events as a third party reads them: a subscriber built only from vLLM's published struct
definitions and the documented hash replays the stream of a RadixCache under a random workload
and must end up with exactly the pages the tree holds; sequence numbers have no gaps; the
replay socket returns missed batches; bad configs are refused by name."""

from __future__ import annotations

import hashlib
import itertools
import random
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import msgspec
import pytest
import zmq
from vllm_kv_events import DECODER, END_SEQ, BlockRemoved, BlockStored, KVEventBatch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import Dropped
from radixrt.cache.radix_cache import RadixCache, TreeNode
from radixrt.observability.kv_events import KVEventSink, parse_kv_events_config
from radixrt.observability.kv_events_publisher import ZmqEventPublisher

_endpoints = itertools.count()


def documented_hash(parent: int | None, tokens: list[int]) -> int:
    """docs/kv_events.md's block hash, written from the description."""
    prefix = b"\x00" if parent is None else b"\x01" + struct.pack(">Q", parent)
    body = b"".join(struct.pack("<q", t) for t in tokens)
    return int.from_bytes(hashlib.blake2b(prefix + body, digest_size=8).digest(), "big")


def resident_hashes(cache: RadixCache) -> set[int]:
    """The hash of every page the tree holds, computed from its keys alone."""
    found: set[int] = set()

    def walk(node: TreeNode, parent: int | None) -> None:
        for child in node.children.values():
            h = parent
            for start in range(0, len(child.key), cache.page_size):
                h = documented_hash(h, child.key[start : start + cache.page_size])
                found.add(h)
            walk(child, h)

    walk(cache.root, None)
    return found


class Replayer:
    """A consumer's view: which blocks a worker holds, rebuilt from its events."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.blocks: set[int] = set()

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert event.block_size == self.page_size
                assert len(event.token_ids) == len(event.block_hashes) * self.page_size
                parent = event.parent_block_hash
                assert parent is None or parent in self.blocks, "stored under an unknown parent"
                for i, h in enumerate(event.block_hashes):
                    page = event.token_ids[i * self.page_size : (i + 1) * self.page_size]
                    assert h == documented_hash(parent, page)
                    parent = h
                self.blocks.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert set(event.block_hashes) <= self.blocks, "removed a block never stored"
                self.blocks.difference_update(event.block_hashes)
            else:
                self.blocks.clear()


# ---- the publisher's side ----------------------------------------------------------------------


@pytest.fixture
def endpoints() -> Iterator[tuple[str, str]]:
    n = next(_endpoints)
    yield f"inproc://kv-events-{n}", f"inproc://kv-replay-{n}"


def make_publisher(endpoint: str, replay: str, buffer_steps: int = 10_000) -> ZmqEventPublisher:
    config = parse_kv_events_config(
        msgspec.json.encode(
            {
                "enable_kv_cache_events": True,
                "endpoint": endpoint,
                "replay_endpoint": replay,
                "topic": "kv",
                "buffer_steps": buffer_steps,
            }
        ).decode()
    )
    assert config is not None
    return ZmqEventPublisher(config)


def subscribe(endpoint: str) -> zmq.Socket[bytes]:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(endpoint)
    time.sleep(0.1)  # let the subscription reach the PUB socket (ZeroMQ's slow joiner)
    return sub


def receive_all(sub: zmq.Socket[bytes], quiet_ms: int = 300) -> list[tuple[int, KVEventBatch]]:
    got = []
    while sub.poll(quiet_ms):
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv" and len(seq) == 8
        got.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    return got


def replay_from(endpoint: str, start: int) -> list[tuple[int, KVEventBatch]]:
    # DEALER, not REQ: one request gets many replies, and a REQ socket takes only the first.
    req = zmq.Context.instance().socket(zmq.DEALER)
    req.connect(endpoint)
    req.send_multipart((b"", start.to_bytes(8, "big")))
    got = []
    try:
        while True:
            assert req.poll(5000), "no answer from the replay socket"
            empty, seq, payload = req.recv_multipart()
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == END_SEQ:
                assert payload == b""
                return got
            got.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    finally:
        req.close(linger=0)


def random_workload(cache: RadixCache, rng: random.Random, steps: int) -> None:
    """Inserts of prompts sharing a few prefixes, hits that lock for a while, evictions, and
    flushes; the sink is flushed after every operation, as the scheduler does each iteration."""
    ps, alloc = cache.page_size, cache.allocator

    def give_back(dropped: Dropped) -> None:  # the KVManager's part: the tree frees nothing
        for span in dropped.spans:
            alloc.free_slots(span)

    prefixes = [[rng.randrange(50) for _ in range(ps * rng.randint(1, 4))] for _ in range(4)]
    locked: list[Any] = []
    for _ in range(steps):
        op = rng.random()
        if op < 0.6:
            key = rng.choice(prefixes) + [rng.randrange(50) for _ in range(ps * rng.randint(0, 3))]
            slots = alloc.alloc_slots(len(key), None)
            if slots is None:
                give_back(cache.evict(len(key)))
                slots = alloc.alloc_slots(len(key), None)
            if slots is not None and key:
                alloc.free_slots(slots[: cache.insert(key, slots)])
        elif op < 0.8:
            hit = cache.match_prefix(rng.choice(prefixes) + [rng.randrange(50)] * ps)
            if hit.last_node is not cache.root:
                cache.inc_lock_ref(hit.last_node)
                locked.append(hit.last_node)
        elif op < 0.95:
            if locked:
                cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
            give_back(cache.evict(ps * rng.randint(1, 8)))
        else:
            while locked:
                cache.dec_lock_ref(locked.pop())
            give_back(cache.reset())
        cache.flush_events()


@pytest.mark.parametrize("page_size", [1, 4])
def test_replaying_the_stream_gives_the_resident_pages(endpoints, page_size) -> None:
    endpoint, replay = endpoints
    cache = RadixCache(PageAllocator(24, page_size))
    publisher = make_publisher(endpoint, replay)
    cache.event_sink = KVEventSink(publisher, page_size)
    sub = subscribe(endpoint)
    try:
        random_workload(cache, random.Random(page_size), steps=400)
        got = receive_all(sub)
    finally:
        sub.close(linger=0)
        cache.close_events()
    seqs = [seq for seq, _ in got]
    assert seqs == list(range(len(seqs))), "sequence numbers must start at 0 with no gaps"
    kinds = {type(e).__name__ for _, batch in got for e in batch.events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}, kinds
    view = Replayer(page_size)
    for _, batch in got:
        view.apply(batch)
    assert view.blocks == resident_hashes(cache)
    assert len(view.blocks) * page_size == cache.total_size()


def test_replay_returns_the_missed_batches(endpoints) -> None:
    endpoint, replay = endpoints
    cache = RadixCache(PageAllocator(64, 2))
    publisher = make_publisher(endpoint, replay, buffer_steps=3)
    cache.event_sink = KVEventSink(publisher, 2)
    sub = subscribe(endpoint)
    try:
        for first in range(5):  # five batches, one stored page each
            cache.insert([first, 9], cache.allocator.alloc_slots(2, None))  # type: ignore[arg-type]
            cache.flush_events()
        live = receive_all(sub)
        missed = replay_from(replay, 3)
        buffered = replay_from(replay, 0)  # only the last buffer_steps batches are kept
    finally:
        sub.close(linger=0)
        cache.close_events()
    assert [seq for seq, _ in live] == [0, 1, 2, 3, 4]
    assert missed == live[3:]
    assert [seq for seq, _ in buffered] == [2, 3, 4]
    stored = [e.token_ids for _, b in missed for e in b.events]
    assert stored == [[3, 9], [4, 9]]


def test_events_off_costs_nothing_and_a_split_sends_nothing() -> None:
    assert parse_kv_events_config(None) is None
    assert parse_kv_events_config('{"enable_kv_cache_events": false}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}') is None
    sent: list[Any] = []

    class ListPublisher:
        def publish(self, batch: Any) -> None:
            sent.append(batch)

        def shutdown(self) -> None:
            pass

    cache = RadixCache(PageAllocator(16, 1))
    cache.event_sink = KVEventSink(ListPublisher(), 1)
    cache.insert([1, 2, 3], cache.allocator.alloc_slots(3, None))  # type: ignore[arg-type]
    cache.flush_events()
    cache.match_prefix([1, 2, 7])  # splits [1, 2, 3] into [1, 2] + [3]
    cache.flush_events()
    assert len(sent) == 1, "a split changes no resident page, so no batch"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"enable_kv_cache_events": true, "port": 5557}', "unknown field 'port'"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "publisher must be one of"),
        ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events has the wrong type"),
        ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "buffer_steps must be >= 1"),
        ('{"enable_kv_cache_events": true, "hwm": true}', "hwm has the wrong type"),
    ],
)
def test_bad_configs_are_refused_by_name(text, named) -> None:
    with pytest.raises(ValueError, match="kv_events_config") as err:
        parse_kv_events_config(text)
    assert named in str(err.value)
    assert "allowed fields: enable_kv_cache_events, publisher, endpoint" in str(err.value)


def test_a_bad_endpoint_fails_naming_the_field() -> None:
    config = parse_kv_events_config('{"enable_kv_cache_events": true, "endpoint": "bogus://x"}')
    assert config is not None
    with pytest.raises(ValueError, match="kv_events_config: endpoint 'bogus://x'"):
        ZmqEventPublisher(config)


def test_the_publisher_binds_loopback_unless_told_every_interface(caplog) -> None:
    # vLLM's default is tcp://*:5557; radixrt's binds 127.0.0.1 only, and binding every
    # interface (said explicitly) warns. A free port each, so the test never meets a server.
    port, wide_port = _free_port(), _free_port()
    default = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert default is not None and default.endpoint == "tcp://127.0.0.1:5557"
    local = replace(default, endpoint=f"tcp://127.0.0.1:{port}")
    publisher = ZmqEventPublisher(local)
    try:
        assert _listening(port) == ["127.0.0.1"], "loopback, bound (not connected)"
        assert "every interface" not in caplog.text
    finally:
        publisher.shutdown()
    publisher = ZmqEventPublisher(replace(default, endpoint=f"tcp://*:{wide_port}"))
    try:
        assert _listening(wide_port) == ["0.0.0.0"]
        assert "kv_events_config: endpoint tcp://*:" in caplog.text
        assert "every interface" in caplog.text
    finally:
        publisher.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> list[str]:
    """The local addresses with a TCP socket listening on `port` (IPv4, /proc/net/tcp)."""
    found = []
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            local, state = line.split()[1], line.split()[3]
            host, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(socket.inet_ntoa(bytes.fromhex(host)[::-1]))
    return found
