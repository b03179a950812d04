"""KV cache events in vLLM's wire format: what `--kv-events-config` turns on.

The radix cache tells an event sink which pages became resident (`BlockStored`), which were
evicted (`BlockRemoved`) and when everything went (`AllBlocksCleared`); the sink collects one
scheduler iteration's events into one `KVEventBatch` and hands it to a ZeroMQ publisher
(`kv_events_publisher.py`) that sends it from its own thread. SMG, llm-d's prefix scorer and
Dynamo's KV router all read this stream to route requests to the replica that holds their prefix.

Wire format (vLLM's `vllm/distributed/kv_events.py`, msgpack via msgspec): structs are
`array_like` (fields by position, in the declared order), `omit_defaults` (trailing fields at
their default are left out), and events are tagged by class name (the first array element).
This is the positional form every vLLM before PR #42892 and SGLang publish; the consumers that
also read vLLM's newer map form (Dynamo, llm-d) read this one too.

Block hashes: a page (page_size token ids) is one block. Its hash chains on the hash of the
page before it: `page_hash(parent, tokens)` is the first 8 bytes, big-endian, of
BLAKE2b(digest_size=8) over `b"\\0"` (first page) or `b"\\1" + parent as 8 bytes big-endian`,
followed by each token id as 8 bytes little-endian signed. It is an unsigned 64-bit integer,
the same in every process and on every machine (unlike Python's salted `hash`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import msgspec

logger = logging.getLogger("radixrt.kv_events")  # the name operators filter on, kept across moves

MEDIUM_GPU = "GPU"  # vLLM's name for the primary KV tier, which the pool is (on any device)


# ---- vLLM's structs, field for field and in vLLM's order ----------------------------------


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """One change of the set of resident blocks; the tag is the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# ---- block hashes ---------------------------------------------------------------------------


def page_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """The block hash of one page whose predecessor's hash is `parent` (None: first page)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(b"\0" if parent is None else b"\1" + parent.to_bytes(8, "big"))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return int.from_bytes(h.digest(), "big")


def chain_hashes(parent: int | None, token_ids: Sequence[int], page_size: int) -> list[int]:
    """The hashes of the whole pages of `token_ids`, each chained on the one before it."""
    hashes = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        parent = page_hash(parent, token_ids[start : start + page_size])
        hashes.append(parent)
    return hashes


# ---- config ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's `KVEventsConfig`, same fields and defaults but the endpoint's host."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None  # "zmq" or "null"; unset: "zmq" if enabled
    # PUB socket: binds if it has * / :: / a loopback host / ipc / inproc. vLLM's default is
    # every interface (tcp://*:5557); radixrt's is loopback, as every port of its own.
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None  # ROUTER socket for replays; None: no replay
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # ZeroMQ send high-water mark of the PUB socket
    max_queue_size: int = 100_000  # batches waiting for the publisher thread
    topic: str = ""  # first frame of every message (a SUB socket filters on it)


PUBLISHERS = ("zmq", "null")
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,),
    "publisher": (str, type(None)),
    "endpoint": (str,),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
}
_POSITIVE = ("buffer_steps", "max_queue_size")


def _config_error(problem: str) -> ValueError:
    allowed = ", ".join(f.name for f in fields(KVEventsConfig))
    return ValueError(f"kv_events_config: {problem} (allowed fields: {allowed})")


def parse_kv_events_config(text: str | None) -> KVEventsConfig | None:
    """The config `text` (JSON) asks for, or None when events are off (no text, not enabled,
    or the "null" publisher). Bad JSON, an unknown field, a value of the wrong type or an
    unknown publisher is a ValueError naming `kv_events_config` and the allowed fields."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise _config_error(f"not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise _config_error(f"must be a JSON object, got {type(raw).__name__}")
    for name, value in raw.items():
        if name not in _FIELD_TYPES:
            raise _config_error(f"unknown field {name!r}")
        types = _FIELD_TYPES[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise _config_error(f"{name} has the wrong type: {value!r}")
        least = 1 if name in _POSITIVE else 0
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            raise _config_error(f"{name} must be >= {least}, got {value}")
    config = KVEventsConfig(**raw)
    publisher = config.publisher or ("zmq" if config.enable_kv_cache_events else "null")
    if publisher not in PUBLISHERS:
        raise _config_error(f"publisher must be one of {list(PUBLISHERS)}, got {publisher!r}")
    if not config.enable_kv_cache_events or publisher == "null":
        return None
    return config


# ---- the cache's event sink -----------------------------------------------------------------


class Publisher(Protocol):
    """Where finished batches go (the ZeroMQ publisher, or a list in tests)."""

    def publish(self, batch: KVEventBatch) -> None: ...
    def shutdown(self) -> None: ...


class KVEventSink:
    """The radix cache's listener (`radixrt.cache.base.CacheEventSink`): turns page residency
    changes into vLLM events and sends each scheduler iteration's events as one batch."""

    def __init__(self, publisher: Publisher, page_size: int, data_parallel_rank: int = 0):
        self.publisher = publisher
        self.page_size = page_size
        self.data_parallel_rank = data_parallel_rank
        self._pending: list[BlockStored | BlockRemoved | AllBlocksCleared] = []

    def stored(self, parent_hash: int | None, token_ids: list[int]) -> list[int]:
        hashes = chain_hashes(parent_hash, token_ids, self.page_size)
        event = BlockStored(
            hashes, parent_hash, list(token_ids), self.page_size, None, MEDIUM_GPU, None
        )
        self._pending.append(event)
        return hashes

    def removed(self, block_hashes: list[int]) -> None:
        self._pending.append(BlockRemoved(list(block_hashes), MEDIUM_GPU))

    def cleared(self) -> None:
        self._pending.append(AllBlocksCleared())

    def flush(self) -> None:
        """Send what was collected since the last flush as one batch (nothing if empty)."""
        if self._pending:
            events, self._pending = self._pending, []
            self.publisher.publish(KVEventBatch(time.time(), events, self.data_parallel_rank))

    def close(self) -> None:
        self.flush()
        self.publisher.shutdown()


def create_kv_event_sink(
    config_text: str | None, page_size: int, data_parallel_rank: int = 0
) -> KVEventSink | None:
    """The sink `--kv-events-config` asks for (None when events are off). Binds its sockets
    now, so a bad endpoint or a port in use fails at start-up; replica `data_parallel_rank`
    uses the endpoints' ports plus its rank, as vLLM does."""
    config = parse_kv_events_config(config_text)
    if config is None:
        return None
    from radixrt.observability.kv_events_publisher import ZmqEventPublisher

    publisher = ZmqEventPublisher(config, data_parallel_rank)
    logger.info("KV events: publishing on %s (topic %r)", publisher.endpoint, config.topic)
    return KVEventSink(publisher, page_size, data_parallel_rank)
