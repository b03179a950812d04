"""The prefix cache that shares nothing (`--disable-radix-cache`): every request computes its
whole prompt and gives all its pages back when it ends. The baseline the radix cache is
measured against, and the cache for workloads without shared prefixes."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import CacheNode, Dropped, MatchResult, PrefixCache, Published

_EMPTY = torch.empty(0, dtype=torch.int64)


class _Root:
    """The node every match ends at: a tree of one node (as the policies walk it)."""

    parent: None = None
    children: dict[Hashable, CacheNode] = {}


_ROOT = _Root()  # locking it holds nothing


class NoSharingCache(PrefixCache):
    """Holds no tokens: matches are empty, publishing keeps nothing, nothing is evictable."""

    def __init__(self, allocator: PageAllocator) -> None:
        super().__init__(allocator)  # its observers never hear of a node: nothing is kept
        self.root = _ROOT

    def match_prefix(self, key: list[int]) -> MatchResult:
        return MatchResult(_EMPTY, _ROOT)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        return len(key)

    def publish(self, key: list[int], slots: torch.Tensor, held: int, node: CacheNode) -> Published:
        assert held == 0, "this cache lends nothing"
        return Published(0, _EMPTY, node)  # the caller keeps (and frees) every slot

    def inc_lock_ref(self, node: CacheNode) -> int:
        return 0

    def dec_lock_ref(self, node: CacheNode) -> int:
        return 0

    def unlocked_tokens(self, node: CacheNode) -> int:
        return 0

    def evict(self, num_tokens: int) -> Dropped:
        return Dropped()

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def cached_slots(self) -> torch.Tensor:
        return _EMPTY

    def reset(self) -> Dropped:
        return Dropped()
