"""The prefix-cache interface the scheduler talks to, and how a cache kind is chosen.

A prefix cache decides which pool pages of cached prefixes to keep; it never takes pages from
the allocator or gives them back: the scheduler's `KVManager` does both, so every page has one
owner at a time. A request matches its prompt (`match_prefix`), borrows the matched slots while
it runs (the node it got is locked), and hands its computed K/V over with `publish` (between
prefill chunks and when it ends). What a cache lets go of (`publish`, `evict`, `reset`) comes
back as `Dropped` slots for the caller to free. Two kinds sit behind it: the radix tree
(`radix_cache.py`, SGLang's) and a cache that shares nothing (`no_sharing.py`,
`--disable-radix-cache`), so no code tests a `disable` flag.

Observers (`CacheObserver`) watch the cache's nodes come, split, lock and go: the block
timings (`block_timings.py`) always, the KV events (`kv_event_hashes.py`) when a sink is set.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.block_timings import KVBlockTimings
from radixrt.cache.kv_event_hashes import KVEventHashes


class CacheNode(Protocol):
    """A node of a prefix cache, as everyone but its own cache sees it: an opaque handle to
    lock and publish through, whose `parent` (None at the root) and `children` the cache-aware
    schedule policies walk. Only the cache that returned a node may be given it back."""

    @property
    def parent(self) -> CacheNode | None: ...
    @property
    def children(self) -> Mapping[Hashable, CacheNode]: ...


class ObservedNode(CacheNode, Protocol):
    """A node as a cache's observers see it: an `id` unique for the cache's lifetime and the
    token ids of its span (`key`, whole pages)."""

    @property
    def parent(self) -> ObservedNode | None: ...
    @property
    def id(self) -> int: ...
    @property
    def key(self) -> list[int]: ...


@dataclass(frozen=True)
class MatchResult:
    """The slots of the longest cached prefix (int64 [n], CPU) and the node where that prefix
    ends (the cache's root if nothing matched). Lock `last_node` to keep the prefix while it
    is in use. Nodes have `.parent` (None at the root) and `.children` (a dict): the cache-aware
    schedule policies walk them."""

    indices: torch.Tensor
    last_node: CacheNode


@dataclass(frozen=True)
class Dropped:
    """Slots a cache let go of; the caller gives each span back to the allocator, in order (the
    allocator's free stack, and so which pages are handed out next, follows that order)."""

    spans: tuple[torch.Tensor, ...] = ()  # int64 [n] each, CPU, whole pages

    @property
    def tokens(self) -> int:
        return sum(s.numel() for s in self.spans)


@dataclass(frozen=True)
class Published:
    """What a request holds after `publish`: its first `length` positions are the cache's, at
    `slots` (int64 [length], CPU), kept for it by the lock on `node`. `dropped`: the caller's
    copies of pages the cache held already, now nobody's (the caller frees them)."""

    length: int
    slots: torch.Tensor
    node: CacheNode
    dropped: Dropped = Dropped()


class CacheObserver(Protocol):
    """Watches a cache's nodes (block timings, KV events). Each call comes after the change and
    names the nodes it touched; an observer reads them and never changes the cache."""

    def inserted(self, node: ObservedNode) -> None:
        """`node`, a new leaf below `node.parent`, holds `node.key`."""

    def split(self, upper: ObservedNode, lower: ObservedNode) -> None:
        """`upper`, new, took over the first len(upper.key) tokens of `lower`, now its child:
        the same pages stay resident."""

    def locked(self, nodes: Sequence[ObservedNode]) -> None:
        """A request took these nodes, which no request held."""

    def released(self, nodes: Sequence[ObservedNode]) -> None:
        """The last request holding these nodes let go of them."""

    def evicted(self, nodes: Sequence[ObservedNode]) -> None:
        """These nodes were dropped by `evict`, in this order."""

    def cleared(self, nodes: Sequence[ObservedNode]) -> None:
        """`reset` dropped these nodes, which were every node but the root."""


class CacheEventSink(Protocol):
    """Listener of which pages a cache holds (KV events, `observability/kv_events.py`), fed by
    the `KVEventHashes` observer: every whole page that becomes resident, every page dropped
    and a reset; a page is named by its block hash, chained on the hash of the page before it."""

    def stored(self, parent_hash: int | None, token_ids: list[int]) -> list[int]:
        """`token_ids` (whole pages) became resident after the page hashed `parent_hash` (None:
        they start the sequence); returns the hashes of their pages, in order."""
        ...

    def removed(self, block_hashes: list[int]) -> None:
        """The pages of these hashes were freed."""
        ...

    def cleared(self) -> None:
        """Every page was freed."""
        ...

    def flush(self) -> None:
        """Hand on what was reported since the last flush (the scheduler calls it each loop)."""
        ...

    def close(self) -> None:
        """Flush, then release the sink's resources."""
        ...


class PrefixCache(ABC):
    """Pages of cached prefixes, in pages of the `allocator` (read here, never changed: the
    caller takes and frees pages). Sizes are in tokens, whole pages.

    Accounting contract (checked by `cache.invariants`): every token the cache holds is either
    evictable (no running request locks it) or protected (locked); `total_size()` counts them by
    walking the structure and must equal the sum of the two counters.
    """

    def __init__(self, allocator: PageAllocator, timings: KVBlockTimings | None = None) -> None:
        self.allocator = allocator
        self.page_size = allocator.page_size
        # vLLM's kv_block_* histograms (empty if nothing is kept)
        self.block_timings = timings or KVBlockTimings(self.page_size)
        assert self.block_timings.page_size == self.page_size
        self.observers: list[CacheObserver] = [self.block_timings]
        self._kv_events: KVEventHashes | None = None

    @property
    def event_sink(self) -> CacheEventSink | None:
        """Where KV events go; None (the default) costs nothing. Set it while the cache is
        still empty: a `KVEventHashes` observer then reports to it."""
        return None if self._kv_events is None else self._kv_events.sink

    @event_sink.setter
    def event_sink(self, sink: CacheEventSink | None) -> None:
        if self._kv_events is not None:
            self.observers.remove(self._kv_events)
        self._kv_events = None if sink is None else KVEventHashes(sink, self.page_size)
        if self._kv_events is not None:
            self.observers.append(self._kv_events)

    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """The longest cached prefix of `key`, cut to whole pages; refreshes its access time
        (and may restructure the cache so that a node ends at the match)."""

    @abstractmethod
    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Offer `value` (int64 [len(key)], whole pages) as the slots of `key`. Returns p: the
        cache already held key[:p], so the caller keeps value[:p] (and frees those slots if
        they are not the cache's own); the cache takes value[p:]. A cache that keeps nothing
        returns len(key): the caller keeps everything."""

    @abstractmethod
    def publish(self, key: list[int], slots: torch.Tensor, held: int, node: CacheNode) -> Published:
        """Offer the K/V of `key` (whole pages; `slots` int64 [len(key)] its slots). The first
        `held` positions are already the cache's (borrowed through the lock on `node`), the
        rest the caller's own pages. The cache takes what it keeps, moves the caller's lock to
        the returned node, and says which leading positions the caller now borrows; of the
        rest, the caller's copies of what the cache held already come back as `dropped` (the
        caller frees them) and slots[length:] stay the caller's."""

    def continuation(self, node: CacheNode, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` cached tokens that follow `tokens` read from the end of `node` (a node
        the caller holds locked), along the most recently used branches; [] where the cache
        holds no such path. Reads only. A cache that shares nothing has none."""
        return []

    @abstractmethod
    def inc_lock_ref(self, node: CacheNode) -> int:
        """Lock `node`'s prefix (counted: one unlock per lock); returns tokens newly locked."""

    @abstractmethod
    def dec_lock_ref(self, node: CacheNode) -> int:
        """Undo one `inc_lock_ref(node)`; returns the tokens that became evictable."""

    @abstractmethod
    def unlocked_tokens(self, node: CacheNode) -> int:
        """Tokens of `node`'s prefix that no request locks: what `inc_lock_ref(node)` would
        take out of the evictable ones. Reads only."""

    @abstractmethod
    def evict(self, num_tokens: int) -> Dropped:
        """Drop unlocked pages, least recently used first, until `num_tokens` are dropped or
        nothing evictable is left; returns their slots, which the caller frees."""

    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens held and not locked."""

    @abstractmethod
    def protected_size(self) -> int:
        """Tokens held and locked by running requests."""

    @abstractmethod
    def total_size(self) -> int:
        """Tokens held, counted by walking the structure (a check for the two counters)."""

    @abstractmethod
    def cached_slots(self) -> torch.Tensor:
        """Every slot the cache owns, int64 [total_size()] (for invariant checks)."""

    @abstractmethod
    def reset(self) -> Dropped:
        """Drop everything held (nothing may be locked); returns the slots, which the caller
        frees."""

    def flush_events(self) -> None:
        """Send the KV events of the changes since the last flush, if there is a sink."""
        if self.event_sink is not None:
            self.event_sink.flush()

    def close_events(self) -> None:
        """Flush and close the event sink, if there is one."""
        if self.event_sink is not None:
            self.event_sink.close()
            self.event_sink = None


# kind -> "module:Class", imported lazily.
_KINDS = {
    "radix": "radixrt.cache.radix_cache:RadixCache",
    "none": "radixrt.cache.no_sharing:NoSharingCache",
}


def create_prefix_cache(kind: str, allocator: PageAllocator) -> PrefixCache:
    """The cache of a kind: "radix" (the default), or "none" (shares nothing:
    `--disable-radix-cache`)."""
    if kind not in _KINDS:
        raise ValueError(f"prefix cache kind must be one of {sorted(_KINDS)}, got {kind!r}")
    module_name, cls_name = _KINDS[kind].split(":")
    cls: Callable[[PageAllocator], PrefixCache] = getattr(
        importlib.import_module(module_name), cls_name
    )
    return cls(allocator)
