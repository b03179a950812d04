"""Radix prefix cache: a radix tree over token ids whose nodes own KV slots of the pool.

A request walks the tree with its prompt (`match_prefix`), borrows the KV of the longest cached
prefix, locks that path while it runs (`inc_lock_ref`), and when it finishes (or between prefill
chunks) hands its KV to the tree (`insert`). When the pool runs short the scheduler calls
`evict`, which drops unlocked leaves least-recently-used first and returns their slots: the tree
never takes or frees pages itself (the scheduler's KVManager does).

With page_size > 1 the tree works in whole pages: every node's key length is a multiple of
page_size, nodes split only at page boundaries, and each page-sized chunk of a node's value is
one whole pool page, so freeing a node's slots frees exactly its pages.

Block timings and KV events are observers (`base.CacheObserver`): the tree tells them which
nodes it inserted, split, locked, released and dropped, and keeps nothing for them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator, Sequence

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import CacheNode, Dropped, MatchResult, PrefixCache, Published
from radixrt.cache.block_timings import KVBlockTimings

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    """One edge of the radix tree: a token span and the slots holding its KV.

    `key` (list[int]) and `value` (int64 [len(key)]) are the span and its slots; `children` maps
    a child's first token (page_size 1) or first page as a tuple (page_size > 1) to the child.
    """

    _ids = itertools.count()

    def __init__(self, key: list[int], value: torch.Tensor, parent: TreeNode | None) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[Hashable, TreeNode] = {}
        self.lock_ref = 0
        self.last_access_time = 0
        # heap tie-breaker, observers' key, and a name in pretty_print
        self.id = next(TreeNode._ids)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref})"


class RadixCache(PrefixCache):
    """Radix tree of cached prefixes over a `PageAllocator`'s pages.

    Sizes are in tokens. A node's tokens count as protected while its lock_ref > 0 and as
    evictable otherwise; both counts are kept incrementally. The root has an empty key, is never
    evicted, and is treated as permanently locked.
    """

    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int | None = None,
        timings: KVBlockTimings | None = None,
    ) -> None:
        assert page_size in (None, allocator.page_size), (page_size, allocator.page_size)
        super().__init__(allocator, timings)
        # A counter, not wall time: strictly ordered and deterministic (tests rely on both).
        self._clock = itertools.count(1)
        self._init_tree()

    def _init_tree(self) -> None:
        self.root = TreeNode([], _EMPTY, None)
        self.root.lock_ref = 1
        self._evictable = 0
        self._protected = 0

    # ---- lookup and insertion -------------------------------------------------------------

    def match_prefix(self, key: list[int]) -> MatchResult:
        """Slots of the longest cached prefix of `key`, cut to a multiple of page_size.

        Mutates the tree: a match ending inside a node splits it, so `last_node` ends exactly at
        the match; every node on the path gets a fresh access time.
        """
        key = key[: len(key) // self.page_size * self.page_size]
        if not key:
            return MatchResult(_EMPTY, self.root)
        now = next(self._clock)
        node, values, pos = self.root, [], 0
        node.last_access_time = now
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            values.append(child.value)
            node, pos = child, pos + n
        return MatchResult(torch.cat(values) if values else _EMPTY, node)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Cache `value` (int64 [len(key)]) as the slots of `key`; len(key) % page_size == 0.

        Returns p, the length of key's prefix that was already cached. The tree takes ownership
        of value[p:]; the caller keeps value[:p] and must free those slots if they are not the
        tree's own (e.g. two requests computed the same prefix).
        """
        assert len(key) % self.page_size == 0, f"key length {len(key)} is not page aligned"
        assert value.numel() == len(key), (value.numel(), len(key))
        now = next(self._clock)
        node, pos = self.root, 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                self._add_leaf(node, key[pos:], value[pos:], now)
                return pos
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            node, pos = child, pos + n
        return pos

    def publish(self, key: list[int], slots: torch.Tensor, held: int, node: CacheNode) -> Published:
        """Insert `key`; the caller's copies of pages someone cached meanwhile come back as
        dropped, and its lock moves to the node where `key` ends (see PrefixCache.publish)."""
        if len(key) <= held:
            return Published(held, slots[:held], node)
        present = self.insert(key, slots)
        # Someone cached [held, present) meanwhile: the caller's copies are duplicates.
        dropped = Dropped((slots[held:present],)) if present > held else Dropped()
        match = self.match_prefix(key)
        assert match.indices.numel() == len(key), (match.indices.numel(), len(key))
        self.inc_lock_ref(match.last_node)
        self.dec_lock_ref(node)
        return Published(len(key), match.indices, match.last_node, dropped)

    def continuation(self, node: CacheNode, tokens: list[int], limit: int) -> list[int]:
        """See PrefixCache.continuation. Follows `tokens` down from `node` without splitting
        or touching access times; a path ending inside an edge continues along it."""
        assert isinstance(node, TreeNode), f"{node!r} is not a radix tree node"
        pos, out = 0, []
        while pos < len(tokens):
            child = self._child_starting(node, tokens[pos : pos + self.page_size])
            if child is None:
                return []
            n = min(len(child.key), len(tokens) - pos)
            if child.key[:n] != tokens[pos : pos + n]:
                return []
            node, pos = child, pos + n
            if n < len(child.key):
                out = child.key[n : n + limit]
                break
        while len(out) < limit and node.children:
            node = max(node.children.values(), key=lambda c: c.last_access_time)
            out.extend(node.key[: limit - len(out)])
        return out

    def _child_starting(self, node: TreeNode, head: list[int]) -> TreeNode | None:
        """The child whose key starts with `head` (a page, or less at the end of a key)."""
        if len(head) == self.page_size:
            return node.children.get(self._child_key(head, 0))
        for child in node.children.values():
            if child.key[: len(head)] == head:
                return child
        return None

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor, now: int) -> None:
        assert _whole_pages(value, self.page_size), "inserted slots must fill whole pages"
        # clone: the caller's page table row is reused after the request ends
        leaf = TreeNode(list(key), value.to(torch.int64).clone(), parent)
        leaf.last_access_time = now
        parent.children[self._child_key(key, 0)] = leaf
        self._evictable += len(key)
        for observer in self.observers:
            observer.inserted(leaf)

    def _child_key(self, key: list[int], pos: int) -> Hashable:
        if self.page_size == 1:
            return key[pos]
        return tuple(key[pos : pos + self.page_size])

    def _match_len(self, node_key: list[int], key: list[int], pos: int) -> int:
        """Length of the common prefix of node_key and key[pos:], cut to whole pages."""
        n = 0
        limit = min(len(node_key), len(key) - pos)
        while n < limit and node_key[n] == key[pos + n]:
            n += 1
        return n - n % self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child` after its first n tokens; returns the new upper node.

        The upper node copies child's lock_ref and access time: every lock holding child also
        holds the whole path above it, so the protected/evictable sizes do not change.
        """
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key) and n % self.page_size == 0
        upper = TreeNode(child.key[:n], child.value[:n], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access_time = child.last_access_time
        parent.children[self._child_key(upper.key, 0)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[self._child_key(child.key, 0)] = child
        for observer in self.observers:
            observer.split(upper, child)
        return upper

    # ---- locking --------------------------------------------------------------------------

    def inc_lock_ref(self, node: CacheNode) -> int:
        """Lock every node from `node` up to the root; returns the tokens that became protected."""
        taken = []
        for n in self._path(node):
            if n.lock_ref == 0:
                taken.append(n)
            n.lock_ref += 1
        moved = _tokens(taken)
        self._evictable -= moved
        self._protected += moved
        if taken:
            for observer in self.observers:
                observer.locked(taken)
        return moved

    def dec_lock_ref(self, node: CacheNode) -> int:
        """Undo one `inc_lock_ref(node)`; returns the tokens that became evictable."""
        let_go = []
        for n in self._path(node):
            assert n.lock_ref > 0, f"unlock of unlocked {n!r}"
            n.lock_ref -= 1
            if n.lock_ref == 0:
                let_go.append(n)
        moved = _tokens(let_go)
        self._evictable += moved
        self._protected -= moved
        if let_go:
            for observer in self.observers:
                observer.released(let_go)
        return moved

    def unlocked_tokens(self, node: CacheNode) -> int:
        """Tokens on `node`'s path with lock_ref 0. A lock holds the whole path above its node,
        so the walk stops at the first locked one."""
        tokens = 0
        for n in self._path(node):
            if n.lock_ref > 0:
                break
            tokens += len(n.key)
        return tokens

    def _path(self, node: CacheNode) -> Iterator[TreeNode]:
        """`node` and its ancestors, the root excluded; `node` must be one of this tree's."""
        assert isinstance(node, TreeNode), f"{node!r} is not a radix tree node"
        while node is not self.root:
            yield node
            node = _parent(node)

    # ---- eviction and sizes ---------------------------------------------------------------

    def evict(self, num_tokens: int) -> Dropped:
        """Drop unlocked leaves, least recently used first, until at least `num_tokens` tokens
        are dropped or nothing evictable remains; parents that become unlocked leaves join the
        queue. Returns the dropped leaves' slots, in the order dropped."""
        if num_tokens <= 0:
            return Dropped()
        heap = [(n.last_access_time, n.id, n) for n in self._nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        dropped: list[TreeNode] = []
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            freed += self._delete_leaf(leaf)
            dropped.append(leaf)
            parent = _parent(leaf)
            if self._evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        if dropped:
            for observer in self.observers:
                observer.evicted(dropped)
        return Dropped(tuple(leaf.value for leaf in dropped))

    def _evictable_leaf(self, node: TreeNode) -> bool:
        return node is not self.root and node.lock_ref == 0 and not node.children

    def _delete_leaf(self, leaf: TreeNode) -> int:
        del _parent(leaf).children[self._child_key(leaf.key, 0)]
        self._evictable -= len(leaf.key)
        return len(leaf.key)

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes (lock_ref > 0)."""
        return self._protected

    def total_size(self) -> int:
        """Tokens held by the tree, counted by walking it (O(nodes); a check for the counters)."""
        return sum(len(n.key) for n in self._nodes())

    def cached_slots(self) -> torch.Tensor:
        """Every slot the tree owns, int64 [total_size()] (O(nodes); for invariant checks)."""
        values = [n.value for n in self._nodes() if n is not self.root]
        return torch.cat(values) if values else _EMPTY

    def reset(self) -> Dropped:
        """Empty the tree (nothing may be locked); returns every slot it held."""
        assert self._protected == 0, f"reset with {self._protected} locked tokens"
        nodes = [node for node in self._nodes() if node is not self.root]
        slots = self.cached_slots()
        self._init_tree()
        for observer in self.observers:
            observer.cleared(nodes)
        return Dropped((slots,))

    def _nodes(self) -> Iterator[TreeNode]:
        """Every node, root included, depth first."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ---- debugging ------------------------------------------------------------------------

    def format_tree(self, max_tokens: int = 8) -> str:
        """The tree as indented text: one line per node with its key, size, lock and time."""
        lines = [f"root (evictable={self._evictable}, protected={self._protected})"]
        self._format(self.root, 1, max_tokens, lines)
        return "\n".join(lines)

    def _format(self, node: TreeNode, depth: int, max_tokens: int, lines: list[str]) -> None:
        for child in node.children.values():
            shown = child.key[:max_tokens] + (["..."] if len(child.key) > max_tokens else [])
            lines.append(
                f"{'  ' * depth}#{child.id} {shown} len={len(child.key)} "
                f"lock={child.lock_ref} t={child.last_access_time}"
            )
            self._format(child, depth + 1, max_tokens, lines)

    def pretty_print(self) -> None:
        """Print `format_tree()`."""
        print(self.format_tree())


def _parent(node: TreeNode) -> TreeNode:
    """The parent of a node that is not the root (the only node without one)."""
    assert node.parent is not None, f"{node!r} is the root"
    return node.parent


def _tokens(nodes: Sequence[TreeNode]) -> int:
    return sum(len(n.key) for n in nodes)


def _whole_pages(value: torch.Tensor, page_size: int) -> bool:
    """True if each page_size-chunk of value is one whole page, in slot order."""
    if page_size == 1:
        return True
    rows = value.reshape(-1, page_size)
    offsets = torch.arange(page_size, dtype=value.dtype)
    return bool(((rows[:, 0] % page_size == 0) & (rows - rows[:, :1] == offsets).all(1)).all())
