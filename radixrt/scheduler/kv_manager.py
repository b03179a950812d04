"""Request-level KV operations: match a prefix, take slots, hand KV to the radix tree, release.

The radix tree owns the slots of cached prefixes; a request borrows them (locking the tree path)
and owns its private pages. These functions move slots between the two without losing any.
"""

from __future__ import annotations

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.radix_cache import MatchResult, RadixCache
from radixrt.scheduler.req import Req


class KVManager:
    def __init__(self, allocator: PageAllocator, cache: RadixCache, page_size: int) -> None:
        self.allocator = allocator
        self.cache = cache
        self.page_size = page_size
        self.disabled = cache.disable

    # -- capacity ---------------------------------------------------------------------------
    def available_tokens(self) -> int:
        """Tokens that can be had now: free pages plus unlocked cached pages."""
        return self.allocator.available_tokens + self.cache.evictable_size()

    def tokens_needed(self, req: Req, n: int) -> int:
        """Pool tokens (whole pages) that growing `req` by n positions takes."""
        private = req.kv_slots.numel() - req.tree_len
        room = (-private) % self.page_size  # free slots left in the last private page
        extra = max(n - room, 0)
        return -(-extra // self.page_size) * self.page_size

    def ensure_free(self, tokens: int) -> bool:
        short = tokens - self.allocator.available_tokens
        if short > 0:
            self.cache.evict(short)
        return self.allocator.available_tokens >= tokens

    # -- request lifecycle ------------------------------------------------------------------
    def match(self, req: Req) -> MatchResult:
        limit = req.max_prefix_reuse // self.page_size * self.page_size
        result = self.cache.match_prefix(req.fill_ids[:limit])
        req.prefix_match_len = result.indices.numel()
        return result

    def admit(self, req: Req, match: MatchResult) -> None:
        """Borrow the matched prefix: the request's page table starts with the tree's slots."""
        req.kv_slots = match.indices.clone()
        req.tree_len = req.kv_len = match.indices.numel()
        req.last_node = match.last_node
        self.cache.inc_lock_ref(match.last_node)
        if req.num_retractions == 0:
            req.cached_tokens = req.kv_len

    def alloc(self, req: Req, n: int) -> bool:
        """Extend the request's page table by n slots, evicting cached pages if needed."""
        if not self.ensure_free(self.tokens_needed(req, n)):
            return False
        private = req.kv_slots.numel() > req.tree_len
        last = int(req.kv_slots[-1]) if private else None
        slots = self.allocator.alloc_slots(n, last)
        assert slots is not None, "allocator refused after ensure_free succeeded"
        req.kv_slots = torch.cat([req.kv_slots, slots])
        return True

    def truncate(self, req: Req, length: int) -> None:
        """Forget the request's K/V from position `length` on (a rejected jump-forward
        proposal): whole private pages past it go back to the allocator."""
        assert req.tree_len <= length <= req.kv_slots.numel()
        keep = req.tree_len + -(-(length - req.tree_len) // self.page_size) * self.page_size
        if req.kv_slots.numel() > keep:
            self.allocator.free_slots(req.kv_slots[keep:])
        req.kv_slots = req.kv_slots[:length]
        req.kv_len = min(req.kv_len, length)

    def cache_unfinished(self, req: Req) -> None:
        """Publish the computed, page-aligned part of a request still running (after a prefill
        chunk), so that requests waiting on the same prefix can reuse it next step."""
        if self.disabled:
            return
        self._insert_computed(req)

    def release(self, req: Req, publish: bool = True) -> None:
        """Give back everything the request holds (finished, aborted or retracted): its computed
        pages go to the tree (unlocked, so evictable), the rest to the allocator. Without
        `publish` (a request that failed midway), all its private pages go to the allocator."""
        keep = req.tree_len if self.disabled or not publish else self._insert_computed(req)
        if req.kv_slots.numel() > keep:
            self.allocator.free_slots(req.kv_slots[keep:])
        if req.last_node is not None:
            self.cache.dec_lock_ref(req.last_node)
        req.kv_slots = torch.empty(0, dtype=torch.int64)
        req.tree_len = req.kv_len = 0
        req.last_node = None

    def _insert_computed(self, req: Req) -> int:
        aligned = req.kv_len // self.page_size * self.page_size
        if aligned <= req.tree_len:
            return req.tree_len
        key = req.fill_ids[:aligned]
        present = self.cache.insert(key, req.kv_slots[:aligned])
        if present > req.tree_len:
            # Someone cached [tree_len, present) meanwhile: our copies there are duplicates.
            self.allocator.free_slots(req.kv_slots[req.tree_len:present])
        match = self.cache.match_prefix(key)
        assert match.indices.numel() == aligned
        req.kv_slots = torch.cat([match.indices, req.kv_slots[aligned:]])
        self.cache.inc_lock_ref(match.last_node)
        if req.last_node is not None:
            self.cache.dec_lock_ref(req.last_node)
        req.last_node = match.last_node
        req.tree_len = aligned
        return aligned
