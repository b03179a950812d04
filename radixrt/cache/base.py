"""The prefix-cache interface the scheduler talks to, and how a cache kind is chosen.

A prefix cache owns the pool pages of the prefixes it keeps. A request matches its prompt
(`match_prefix`), borrows the matched slots while it runs (the node it got is locked), and
hands its computed K/V over with `publish` (between prefill chunks and when it ends). Two kinds
sit behind it: the radix tree (`radix_cache.py`, SGLang's) and a cache that shares nothing
(`no_sharing.py`, `--disable-radix-cache`), so no code tests a `disable` flag.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.block_timings import KVBlockTimings


class CacheNode(Protocol):
    """A node of a prefix cache, as everyone but its own cache sees it: an opaque handle to
    lock and publish through, whose `parent` (None at the root) and `children` the cache-aware
    schedule policies walk. Only the cache that returned a node may be given it back."""

    @property
    def parent(self) -> CacheNode | None: ...
    @property
    def children(self) -> Mapping[Hashable, CacheNode]: ...


@dataclass(frozen=True)
class MatchResult:
    """The slots of the longest cached prefix (int64 [n], CPU) and the node where that prefix
    ends (the cache's root if nothing matched). Lock `last_node` to keep the prefix while it
    is in use. Nodes have `.parent` (None at the root) and `.children` (a dict): the cache-aware
    schedule policies walk them."""

    indices: torch.Tensor
    last_node: CacheNode


@dataclass(frozen=True)
class Published:
    """What a request holds after `publish`: its first `length` positions are the cache's, at
    `slots` (int64 [length], CPU), kept for it by the lock on `node`."""

    length: int
    slots: torch.Tensor
    node: CacheNode


class CacheEventSink(Protocol):
    """Listener of which pages a cache holds (KV events, `observability/kv_events.py`). A cache with
    a sink reports every whole page that becomes resident, every page it frees and a reset;
    a page is named by its block hash, chained on the hash of the page before it."""

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
    """Pages of cached prefixes over a `PageAllocator`. Sizes are in tokens, whole pages.

    Accounting contract (checked by `cache.invariants`): every token the cache holds is either
    evictable (no running request locks it) or protected (locked); `total_size()` counts them by
    walking the structure and must equal the sum of the two counters.
    """

    allocator: PageAllocator
    page_size: int
    block_timings: KVBlockTimings  # vLLM's kv_block_* histograms (empty if nothing is kept)
    # Attach while the cache is still empty; None (the default) costs one `if` per change.
    event_sink: CacheEventSink | None = None

    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """The longest cached prefix of `key`, cut to whole pages; refreshes its access time."""

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
        rest the caller's own pages. The cache takes what it keeps, frees the caller's copies
        of what it held already, moves the caller's lock to the returned node, and says which
        leading positions the caller now borrows; the caller still owns slots[length:]."""

    @abstractmethod
    def inc_lock_ref(self, node: CacheNode) -> int:
        """Lock `node`'s prefix (counted: one unlock per lock); returns tokens newly locked."""

    @abstractmethod
    def dec_lock_ref(self, node: CacheNode) -> int:
        """Undo one `inc_lock_ref(node)`; returns the tokens that became evictable."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free unlocked pages, least recently used first, until `num_tokens` are freed or
        nothing evictable is left; returns the tokens freed."""

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
    def reset(self) -> None:
        """Free everything held; nothing may be locked."""

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
