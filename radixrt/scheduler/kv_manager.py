"""Request-level KV operations: match a prefix, take slots, hand KV to the prefix cache, release.

The prefix cache decides which slots of cached prefixes it keeps; a request borrows them
(locking them) and owns its private pages. Its positions' slots are one row of the
request-to-token table. This is the only code that takes pages from the allocator or gives them
back: what the cache drops (`Dropped`, from publish, evict and reset) is freed here, so no page
has two owners. Admission asks `fits` first (reads only) and then commits with `admit`, which
cannot fail: a refused request leaves nothing to undo.

With LongRoPE (`rope_switch`, docs/longrope.md) a request longer than the switch length
computes its K/V with the long frequencies: the cache, which holds short-frequency K/V only,
neither serves nor takes it, and a request whose length crossed the switch since its K/V was
computed is `rope_stale` (the planner has it computed again).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import Dropped, MatchResult, PrefixCache
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.scheduler.req import Req


class KVManager:
    def __init__(
        self,
        allocator: PageAllocator,
        cache: PrefixCache,
        table: ReqToTokenTable,
        rope_switch: int | None = None,
        copy_kv: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    ) -> None:
        """`copy_kv(src, dst)`: copies K/V between pool slots (KVPool.copy_slots), for forks."""
        assert cache.allocator is allocator
        self.allocator = allocator
        self.cache = cache
        self.table = table
        self.page_size = allocator.page_size
        self.rope_switch = rope_switch
        self.copy_kv = copy_kv

    # -- LongRoPE ---------------------------------------------------------------------------
    def long_rope(self, req: Req) -> bool:
        """Whether the request at its length now takes LongRoPE's long frequencies."""
        return self.rope_switch is not None and req.seq_len > self.rope_switch

    def caches(self, req: Req) -> bool:
        """Whether the prefix cache serves and takes this request's K/V (short-frequency)."""
        return not self.long_rope(req)

    def rope_stale(self, req: Req) -> bool:
        """Whether a running request's K/V took the other frequencies than its length asks for
        now (it grew past the switch length): it must be computed again."""
        return req.table_row >= 0 and req.long_rope_kv != self.long_rope(req)

    # -- capacity ---------------------------------------------------------------------------
    def available_tokens(self) -> int:
        """Tokens that can be had now: free pages plus unlocked cached pages."""
        return self.allocator.available_tokens + self.cache.evictable_size()

    def tokens_needed(self, req: Req, n: int) -> int:
        """Pool tokens (whole pages) that growing `req` by n positions takes."""
        private = req.num_slots - req.tree_len
        room = (-private) % self.page_size  # free slots left in the last private page
        return self._whole_pages(max(n - room, 0))

    def ensure_free(self, tokens: int) -> bool:
        """Evict cached pages until `tokens` are free, if it can; says whether they are."""
        short = tokens - self.allocator.available_tokens
        if short > 0:
            self._give_back(self.cache.evict(short))
        return self.allocator.available_tokens >= tokens

    def fits(self, req: Req, match: MatchResult, n: int) -> bool:
        """Whether `admit(req, match, n)` succeeds: a free table row, and pages for n positions
        among the free ones and the cached ones still evictable once the match is locked.
        Reads only: the cache, the allocator, the table and `req` are left as they are."""
        if self.table.num_free_rows == 0:
            return False
        evictable = self.cache.evictable_size() - self.cache.unlocked_tokens(match.last_node)
        return self.allocator.available_tokens + evictable >= self._whole_pages(n)

    def _whole_pages(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    # -- request lifecycle ------------------------------------------------------------------
    def match(self, req: Req) -> MatchResult:
        limit = req.max_prefix_reuse // self.page_size * self.page_size
        if not self.caches(req):
            limit = 0
        result = self.cache.match_prefix(req.fill_ids[:limit])
        req.prefix_match_len = result.indices.numel()
        return result

    def admit(self, req: Req, match: MatchResult, n: int) -> None:
        """Commit what `fits(req, match, n)` said fits: a table row that starts with the matched
        prefix's slots (locked), then slots for the next n positions, evicting if needed."""
        req.table_row = self.table.alloc_row()
        self.table.write(req.table_row, 0, match.indices)
        req.num_slots = req.tree_len = req.kv_len = match.indices.numel()
        req.last_node = match.last_node
        req.long_rope_kv = self.long_rope(req)
        self.cache.inc_lock_ref(match.last_node)
        if req.num_retractions == 0:
            req.cached_tokens = req.kv_len
        allocated = self.alloc(req, n)
        assert allocated, "admitted a request that does not fit: ask fits() first"

    def alloc(self, req: Req, n: int) -> bool:
        """Give the request slots for its next n positions, evicting cached pages if needed."""
        if not self.ensure_free(self.tokens_needed(req, n)):
            return False
        last = None
        if req.num_slots > req.tree_len:  # continue its last private page
            last = int(self.slots(req, req.num_slots - 1, req.num_slots)[0])
        slots = self.allocator.alloc_slots(n, last)
        assert slots is not None, "allocator refused after ensure_free succeeded"
        self.table.write(req.table_row, req.num_slots, slots)
        req.num_slots += n
        return True

    def truncate(self, req: Req, length: int) -> None:
        """Forget the request's K/V from position `length` on (a rejected jump-forward
        proposal): whole private pages past it go back to the allocator."""
        assert req.tree_len <= length <= req.num_slots
        keep = req.tree_len + -(-(length - req.tree_len) // self.page_size) * self.page_size
        if req.num_slots > keep:
            self.allocator.free_slots(self.slots(req, keep, req.num_slots))
        req.num_slots = length
        req.kv_len = min(req.kv_len, length)

    def fork_cost(self, parent: Req) -> int:
        """Pool tokens (whole pages) that `fork(parent, ...)` takes after the parent's
        computed whole pages are published: its private tail, copied."""
        return self._whole_pages(parent.kv_len - parent.tree_len)

    def fork(self, parent: Req, child: Req) -> int:
        """Give `child` the parent's K/V: the part the prefix cache holds is shared (locked
        once more), the private tail (a partial page, once `cache_unfinished` published the
        rest) is copied into pages of the child's own. The caller checked a free row and
        `fork_cost`. Returns how many positions were copied."""
        assert self.copy_kv is not None, "forks need copy_kv"
        child.table_row = self.table.alloc_row()
        shared = parent.tree_len
        self.table.write(child.table_row, 0, self.slots(parent, 0, shared))
        child.tree_len, child.last_node = shared, parent.last_node
        child.long_rope_kv = parent.long_rope_kv
        if child.last_node is not None:
            self.cache.inc_lock_ref(child.last_node)
        copied = parent.kv_len - shared
        child.num_slots = child.kv_len = shared
        if copied:
            allocated = self.alloc(child, copied)
            assert allocated, "forked without room: ask fork_cost() first"
            dst = self.slots(child, shared, shared + copied)
            self.copy_kv(self.slots(parent, shared, shared + copied), dst)
        child.kv_len = parent.kv_len
        return copied

    def cache_unfinished(self, req: Req) -> None:
        """Publish the computed, page-aligned part of a request still running (after a prefill
        chunk), so that requests waiting on the same prefix can reuse it next step."""
        self._publish(req)

    def release(self, req: Req, publish: bool = True) -> None:
        """Give back everything the request holds (finished, aborted or retracted): its computed
        pages go to the cache (unlocked, so evictable), the rest to the allocator. Without
        `publish` (a request that failed midway), all its private pages go to the allocator."""
        keep = self._publish(req) if publish else req.tree_len
        if req.num_slots > keep:
            self.allocator.free_slots(self.slots(req, keep, req.num_slots))
        if req.last_node is not None:
            self.cache.dec_lock_ref(req.last_node)
        self.table.free_row(req.table_row)
        req.table_row = -1
        req.num_slots = req.tree_len = req.kv_len = 0
        req.last_node = None

    def _publish(self, req: Req) -> int:
        """Offer the computed whole pages to the cache; returns the positions it now lends."""
        aligned = req.kv_len // self.page_size * self.page_size
        if aligned <= req.tree_len or req.long_rope_kv:
            return req.tree_len
        published = self.cache.publish(
            req.fill_ids[:aligned], self.slots(req, 0, aligned), req.tree_len, req.last_node
        )
        self._give_back(published.dropped)
        if published.length > req.tree_len:
            # Where someone cached the same pages meanwhile, the table points at theirs now.
            self.table.write(req.table_row, req.tree_len, published.slots[req.tree_len :])
        req.tree_len, req.last_node = published.length, published.node
        return published.length

    def flush_cache(self) -> None:
        """Empty the prefix cache (no request may hold any of it) and free its pages."""
        self._give_back(self.cache.reset())

    def _give_back(self, dropped: Dropped) -> None:
        for span in dropped.spans:  # one at a time: the free stack keeps the cache's order
            self.allocator.free_slots(span)

    def slots(self, req: Req, start: int, end: int) -> torch.Tensor:
        """The pool slots of the request's positions start..end (int64 [end - start])."""
        return self.table.read(req.table_row, start, end)
