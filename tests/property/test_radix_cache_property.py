"""Property test: RadixCache + PageAllocator driven like a scheduler, against a reference model.

The reference is a dict from every cached page-aligned token prefix (as a tuple) to the slots
of its last page (the tree's unit: with page_size 4, [0,0,0,0] and [0,0,0,1] share no node).
Requests are simulated the way the scheduler runs them: match and lock a prefix, take private
slots (growing them a few tokens at a time, like decode), then insert the page-aligned part and
free what the tree did not take, or abort. Eviction is not predicted node by node; it is checked
for what it must guarantee: only unlocked entries go, the dropped slots are exactly theirs, enough
is dropped, and LRU order holds (no evicted node is newer than a surviving unlocked leaf). The
tree never frees a page: the machine frees what it drops, as the KVManager does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.invariants import check_kv_accounting
from radixrt.cache.radix_cache import RadixCache, TreeNode

MAX_KEY = 12
MAX_PENDING = 3


@dataclass
class Req:
    key: list[int]
    matched: torch.Tensor  # slots borrowed from the tree, [m], m a multiple of page_size
    node: TreeNode  # locked while the request runs
    private: torch.Tensor  # the request's own slots for positions m .. len(key)-1


def tree_nodes(cache: RadixCache) -> list[tuple[tuple[int, ...], TreeNode]]:
    """Every non-root node with the token path up to its end (read-only walk)."""
    out, stack = [], [((), cache.root)]
    while stack:
        path, node = stack.pop()
        for child in node.children.values():
            child_path = path + tuple(child.key)
            out.append((child_path, child))
            stack.append((child_path, child))
    return out


def tree_contents(cache: RadixCache) -> dict[tuple[int, ...], list[int]]:
    """Cached page-aligned prefix -> slots of its last page."""
    ps, contents = cache.page_size, {}
    for path, node in tree_nodes(cache):
        start, slots = len(path) - len(node.key), node.value.tolist()
        for j in range(0, len(slots), ps):
            contents[path[: start + j + ps]] = slots[j : j + ps]
    return contents


def node_path(node: TreeNode) -> list[int]:
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return [tok for part in reversed(parts) for tok in part]


class CacheMachine(RuleBasedStateMachine):
    PAGE_SIZE = 1
    NUM_PAGES = 40
    ALPHABET = 4

    def __init__(self) -> None:
        super().__init__()
        ps = self.PAGE_SIZE
        self.alloc = PageAllocator(self.NUM_PAGES, ps)
        self.cache = RadixCache(self.alloc, ps)
        self.ref: dict[tuple[int, ...], list[int]] = {}
        self.pending: list[Req] = []
        self.history: list[list[int]] = []

    # ---- helpers ----------------------------------------------------------------------------

    def draw_key(self, data: st.DataObject) -> list[int]:
        """A random key, often an earlier key's prefix plus a new tail, so prefixes are shared."""
        tokens = st.integers(0, self.ALPHABET - 1)
        if self.history and data.draw(st.booleans()):
            base = data.draw(st.sampled_from(tuple(self.history)))
            cut = data.draw(st.integers(0, len(base)))
            key = base[:cut] + data.draw(st.lists(tokens, max_size=MAX_KEY - cut))
        else:
            key = data.draw(st.lists(tokens, min_size=1, max_size=MAX_KEY))
        key = key or [0]
        self.history = (self.history + [key])[-16:]
        return key

    def aligned(self, n: int) -> int:
        return n // self.PAGE_SIZE * self.PAGE_SIZE

    def expected_len(self, key: list[int]) -> int:
        """Longest page-aligned prefix of key present in the reference."""
        n, ps = 0, self.PAGE_SIZE
        while n + ps <= len(key) and tuple(key[: n + ps]) in self.ref:
            n += ps
        return n

    def expected_slots(self, key: list[int], n: int) -> list[int]:
        ps = self.PAGE_SIZE
        return [s for j in range(0, n, ps) for s in self.ref[tuple(key[: j + ps])]]

    def locked_prefixes(self) -> set[tuple[int, ...]]:
        ps = self.PAGE_SIZE
        return {
            tuple(r.key[: j + ps]) for r in self.pending for j in range(0, r.matched.numel(), ps)
        }

    def held_pages(self) -> int:
        return sum(-(-r.private.numel() // self.PAGE_SIZE) for r in self.pending)

    def alloc_or_evict(self, n: int, last_slot: int | None = None) -> torch.Tensor | None:
        slots = self.alloc.alloc_slots(n, last_slot)
        if slots is None:
            self.evict_and_check(n)
            slots = self.alloc.alloc_slots(n, last_slot)
        if slots is not None and last_slot is not None and (last_slot + 1) % self.PAGE_SIZE:
            assert n == 0 or int(slots[0]) == last_slot + 1, "partial page not continued"
        return slots

    def evict_and_check(self, n: int) -> None:
        before = tree_contents(self.cache)
        times = {path: node.last_access_time for path, node in tree_nodes(self.cache)}
        free_before = self.alloc.num_free_pages
        dropped = self.cache.evict(n)
        assert self.alloc.num_free_pages == free_before, "the tree freed pages itself"
        freed = dropped.tokens
        after = tree_contents(self.cache)
        assert after.items() <= before.items(), "eviction changed surviving slots"
        removed = before.keys() - after.keys()
        assert len(removed) * self.PAGE_SIZE == freed
        removed_slots = sorted(s for path in removed for s in before[path])
        assert sorted(torch.cat(dropped.spans).tolist() if freed else []) == removed_slots
        for span in dropped.spans:
            self.alloc.free_slots(span)
        assert freed >= n or self.cache.evictable_size() == 0, "stopped while evictable left"
        assert not removed & self.locked_prefixes(), "a locked prefix was evicted"
        self.check_lru(removed, times)
        for path in removed:
            del self.ref[path]

    def check_lru(self, removed: set, times: dict[tuple[int, ...], int]) -> None:
        """No evicted node is newer than an unlocked leaf that survived."""
        removed_times = [t for path, t in times.items() if path in removed]
        if not removed_times:
            return
        newest_evicted = max(removed_times)
        for _, node in tree_nodes(self.cache):
            if node.lock_ref == 0 and not node.children:
                assert node.last_access_time >= newest_evicted, "eviction not LRU"

    def match_and_check(self, key: list[int]):
        want = self.expected_len(key)
        m = self.cache.match_prefix(key)
        assert m.indices.tolist() == self.expected_slots(key, want)
        assert node_path(m.last_node) == key[:want], "last_node does not end at the match"
        self.check_touched(m.last_node)
        return m

    def check_touched(self, node: TreeNode) -> None:
        """The path just walked is the most recently used one."""
        newest = max((n.last_access_time for _, n in tree_nodes(self.cache)), default=0)
        while node.parent is not None:
            assert node.last_access_time == newest, "matched path not touched"
            node = node.parent

    def add_to_ref(self, key: list[int], value: torch.Tensor, start: int) -> None:
        ps, slots = self.PAGE_SIZE, value.tolist()
        for j in range(start, len(key), ps):
            self.ref[tuple(key[: j + ps])] = slots[j : j + ps]

    # ---- operations -------------------------------------------------------------------------

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        self.match_and_check(self.draw_key(data))

    @rule(data=st.data())
    def insert_fresh(self, data: st.DataObject) -> None:
        """A prefix computed without using the cache: all of it on fresh slots."""
        key = self.draw_key(data)
        key = key[: self.aligned(len(key))]
        slots = self.alloc_or_evict(len(key)) if key else None
        if slots is None:
            return
        want = self.expected_len(key)
        present = self.cache.insert(key, slots)
        assert present == want
        self.alloc.free_slots(slots[:present])
        self.add_to_ref(key, slots, present)

    @rule(data=st.data())
    def start_request(self, data: st.DataObject) -> None:
        if len(self.pending) >= MAX_PENDING:
            return
        key = self.draw_key(data)
        m = self.match_and_check(key)
        self.cache.inc_lock_ref(m.last_node)
        private = self.alloc_or_evict(len(key) - m.indices.numel())
        if private is None:
            self.cache.dec_lock_ref(m.last_node)
            return
        self.pending.append(Req(key, m.indices, m.last_node, private))

    @rule(data=st.data())
    def grow_request(self, data: st.DataObject) -> None:
        """Decode-like growth: new slots continue the request's last partial page."""
        if not self.pending:
            return
        req = data.draw(st.sampled_from(self.pending))
        tokens = data.draw(st.lists(st.integers(0, self.ALPHABET - 1), min_size=1, max_size=5))
        last = int(req.private[-1]) if req.private.numel() else None
        more = self.alloc_or_evict(len(tokens), last)
        if more is not None:
            req.key = req.key + tokens
            req.private = torch.cat((req.private, more))

    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        """Insert the page-aligned part; free duplicates and the unaligned tail; unlock."""
        if not self.pending:
            return
        req = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        n, m = self.aligned(len(req.key)), req.matched.numel()
        value = torch.cat((req.matched, req.private))[:n]
        want = self.expected_len(req.key[:n])
        assert want >= m, "a locked prefix disappeared"
        present = self.cache.insert(req.key[:n], value)
        assert present == want
        assert self.cache.match_prefix(req.key[:m]).indices.tolist() == req.matched.tolist()
        self.alloc.free_slots(value[m:present])
        self.alloc.free_slots(req.private[n - m :])
        self.add_to_ref(req.key[:n], value, present)
        self.cache.dec_lock_ref(req.node)

    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        if not self.pending:
            return
        req = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        self.alloc.free_slots(req.private)
        self.cache.dec_lock_ref(req.node)

    @rule(n=st.integers(0, 24))
    def evict(self, n: int) -> None:
        self.evict_and_check(n)

    # ---- checked after every step -----------------------------------------------------------

    @invariant()
    def tree_matches_reference(self) -> None:
        assert tree_contents(self.cache) == self.ref

    @invariant()
    def accounting_holds(self) -> None:
        check_kv_accounting(self.alloc, self.cache, self.held_pages())
        locked_tokens = len(self.locked_prefixes()) * self.PAGE_SIZE
        assert self.cache.protected_size() == locked_tokens

    @invariant()
    def requests_own_their_slots(self) -> None:
        """Locked prefixes keep their slots; private pages are neither free nor the tree's."""
        tree_pages = set((self.cache.cached_slots() // self.PAGE_SIZE).tolist())
        seen: set[int] = set()
        for req in self.pending:
            m = req.matched.numel()
            assert self.expected_slots(req.key, m) == req.matched.tolist()
            pages = set((req.private // self.PAGE_SIZE).tolist())
            assert not pages & tree_pages and not pages & seen
            assert not self.alloc.is_free[sorted(pages)].any()
            seen |= pages

    def teardown(self) -> None:
        # everything goes back: unlock all, evict all, and the pool must be whole again
        for req in self.pending:
            self.alloc.free_slots(req.private)
            self.cache.dec_lock_ref(req.node)
        self.pending.clear()
        for span in self.cache.evict(self.cache.total_size()).spans:
            self.alloc.free_slots(span)
        assert self.cache.total_size() == 0
        assert self.alloc.num_free_pages == self.alloc.num_pages


class PagedCacheMachine(CacheMachine):
    PAGE_SIZE = 4
    NUM_PAGES = 12
    ALPHABET = 2  # small, so that whole 4-token pages are shared often


_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestRadixCachePageSize1 = CacheMachine.TestCase
TestRadixCachePageSize1.settings = _SETTINGS
TestRadixCachePageSize4 = PagedCacheMachine.TestCase
TestRadixCachePageSize4.settings = _SETTINGS
