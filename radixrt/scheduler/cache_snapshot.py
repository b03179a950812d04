"""A bounded picture of the prefix cache and the scheduler's queues, for `GET /cache_tree` and
the dashboard page.

The scheduler builds it between two steps (the control message is handled in its loop), so
it must stay cheap however large the tree is: subtree sizes come from a breadth-first walk of
at most SIZE_WALK_BUDGET nodes, and at most `max_nodes` nodes, no deeper than `depth`, are
described. What is left out is summarised per parent ("+K more nodes, T tokens"). Nodes are
chosen biggest subtree first, so a large tree shows where its tokens are.

The token ids of a node's preview are sent as ids: the HTTP process decodes them with its
tokenizer (the scheduler need not have one).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixrt.cache.base import PrefixCache
from radixrt.cache.radix_cache import RadixCache, TreeNode
from radixrt.protocol.messages import MAX_CACHE_TREE_DEPTH, MAX_CACHE_TREE_NODES
from radixrt.scheduler.req import Req

# Nodes the size walk visits at most: about 10 ms of Python on a slow CPU. A tree with more
# nodes is counted down to that many (its deeper sizes are then lower bounds: `complete` false).
SIZE_WALK_BUDGET = 10_000
PREVIEW_TOKENS = 24  # token ids of a node's key shipped for its text preview
MAX_LISTED_REQUESTS = 64  # per queue; the counts are always exact


@dataclass(frozen=True)
class _Sizes:
    """Subtree token and node counts by node id, for the nodes the walk reached."""

    tokens: dict[int, int]
    nodes: dict[int, int]
    expanded: set[int]  # nodes whose children were counted too
    complete: bool  # every node of the tree was counted

    def of(self, node: TreeNode) -> tuple[int, int]:
        """(subtree tokens, subtree nodes) of a counted node."""
        return self.tokens[node.id], self.nodes[node.id]


def cache_snapshot(
    cache: PrefixCache,
    running: Sequence[Req],
    waiting: Sequence[Req],
    stats: Mapping[str, Any],
    *,
    depth: int,
    max_nodes: int,
) -> dict[str, Any]:
    """The snapshot: tree (None without a radix cache), KV pool, requests and the scalars of
    `stats` (the scheduler's get_stats()). `depth` and `max_nodes` are clamped to their
    allowed ranges. Reads only: the tree, the allocator and the requests are left as they are."""
    depth = min(max(depth, 0), MAX_CACHE_TREE_DEPTH)
    max_nodes = min(max(max_nodes, 1), MAX_CACHE_TREE_NODES)
    return {
        "radix_cache": isinstance(cache, RadixCache),
        "tree": tree_snapshot(cache, depth, max_nodes) if isinstance(cache, RadixCache) else None,
        "kv_pool": kv_pool_snapshot(cache, running),
        "requests": requests_snapshot(running, waiting),
        # The scalar counters: the histograms are /metrics' business, and large.
        "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str))},
    }


def tree_snapshot(cache: RadixCache, depth: int, max_nodes: int) -> dict[str, Any]:
    """The root as a nested node description, with the walk's totals beside it."""
    sizes = _subtree_sizes(cache.root, SIZE_WALK_BUDGET)
    shown = _choose_nodes(cache.root, sizes, depth, max_nodes)
    timings = cache.block_timings
    now = timings.clock()  # the clock the nodes' stamps were taken with

    def idle_s(node: TreeNode) -> float:
        return now - timings.idle_since(node)

    return {
        "root": _describe(cache.root, sizes, shown, idle_s),
        "nodes_shown": len(shown),
        "total_nodes": sizes.nodes[cache.root.id] - 1,  # the root is not a cached span
        "total_tokens": cache.evictable_size() + cache.protected_size(),
        "complete": sizes.complete,
        "depth": depth,
        "max_nodes": max_nodes,
    }


def _subtree_sizes(root: TreeNode, budget: int) -> _Sizes:
    """Breadth first from the root, expanding nodes while fewer than `budget` are listed, then
    sizes bottom up. A node's children are either all counted or (beyond the budget) none."""
    order = [root]
    expanded = 0
    while expanded < len(order) and len(order) < budget:
        order.extend(order[expanded].children.values())
        expanded += 1
    complete = all(not node.children for node in order[expanded:])
    tokens: dict[int, int] = {}
    nodes: dict[int, int] = {}
    for i in range(len(order) - 1, -1, -1):
        node = order[i]
        t, n = len(node.key), 1
        if i < expanded:
            for child in node.children.values():
                t += tokens[child.id]
                n += nodes[child.id]
        tokens[node.id], nodes[node.id] = t, n
    return _Sizes(tokens, nodes, {node.id for node in order[:expanded]}, complete)


def _choose_nodes(root: TreeNode, sizes: _Sizes, depth: int, max_nodes: int) -> set[int]:
    """Ids of the nodes to describe: best first by subtree tokens, each under a shown parent,
    at most `depth` levels below the root, at most `max_nodes` of them (the root aside)."""
    shown: set[int] = set()
    heap: list[tuple[int, int, int, TreeNode]] = []

    def offer_children(node: TreeNode, level: int) -> None:
        if level > depth:
            return
        if node.id not in sizes.expanded:  # its children lie beyond the size walk
            return
        for child in node.children.values():
            heapq.heappush(heap, (-sizes.of(child)[0], child.id, level, child))

    offer_children(root, 1)
    while heap and len(shown) < max_nodes:
        _, node_id, level, node = heapq.heappop(heap)
        shown.add(node_id)
        offer_children(node, level + 1)
    return shown


def _describe(
    node: TreeNode, sizes: _Sizes, shown: set[int], idle_s: Callable[[TreeNode], float]
) -> dict[str, Any]:
    """One node and its shown children (biggest subtree first); the others as `more`. A node
    whose children lie beyond the size walk is `counted: false` and counts only itself."""
    counted = node.id in sizes.expanded
    children = node.children.values() if counted else ()
    kids = sorted((c for c in children if c.id in shown), key=lambda c: (-sizes.of(c)[0], c.id))
    hidden = [sizes.of(c) for c in children if c.id not in shown]
    subtree_tokens, subtree_nodes = sizes.of(node)
    is_root = node.parent is None
    return {
        "id": node.id,
        "tokens": len(node.key),
        "preview_ids": node.key[:PREVIEW_TOKENS],
        "lock_ref": node.lock_ref,
        "evictable": not is_root and node.lock_ref == 0,
        "last_access_s": _seconds_since_access(node, idle_s),
        "subtree_tokens": subtree_tokens,
        "subtree_nodes": subtree_nodes,
        "counted": counted or not node.children,
        "children": [_describe(c, sizes, shown, idle_s) for c in kids],
        "more": (
            {"nodes": sum(n for _, n in hidden), "tokens": sum(t for t, _ in hidden)}
            if hidden
            else None
        ),
    }


def _seconds_since_access(node: TreeNode, idle_s: Callable[[TreeNode], float]) -> float | None:
    """Seconds since a request last held the node: 0 while one does, else since the last one
    let go of it (or since its insertion); None for the root. `last_access_time` itself is a
    logical clock, so the block-timing stamps (monotonic seconds) are used."""
    if node.parent is None:
        return None
    if node.lock_ref > 0:
        return 0.0
    return round(max(idle_s(node), 0.0), 3)


def kv_pool_snapshot(cache: PrefixCache, running: Sequence[Req]) -> dict[str, Any]:
    """The pool's pages in three parts: in use by running requests (their private pages and
    the cached prefixes they lock), cached (evictable) and free; they add up to `pages`."""
    allocator = cache.allocator
    page_size = allocator.page_size
    cached = cache.evictable_size() // page_size
    free = allocator.num_free_pages
    in_use = allocator.num_pages - free - cached
    return {
        "page_size": page_size,
        "pages": allocator.num_pages,
        "in_use_pages": in_use,
        "cached_pages": cached,
        "free_pages": free,
        "locked_cache_pages": cache.protected_size() // page_size,
        "private_pages": sum(r.private_pages(page_size) for r in running),
        "tokens": allocator.num_pages * page_size,
        "in_use_tokens": in_use * page_size,
        "cached_tokens": cached * page_size,
        "free_tokens": free * page_size,
    }


def requests_snapshot(running: Sequence[Req], waiting: Sequence[Req]) -> dict[str, Any]:
    """The first MAX_LISTED_REQUESTS of each queue, with exact counts."""
    return {
        "num_running": len(running),
        "num_queued": len(waiting),
        "running_output_tokens": sum(len(r.output_ids) for r in running),
        "running": [_request(r, r.cached_tokens) for r in running[:MAX_LISTED_REQUESTS]],
        # A queued request has no cached tokens yet: its last prefix match stands in.
        "queued": [_request(r, r.prefix_match_len) for r in waiting[:MAX_LISTED_REQUESTS]],
    }


def _request(req: Req, cached: int) -> dict[str, Any]:
    return {
        "rid": req.rid,
        "prompt_tokens": len(req.origin_input_ids),
        "cached_tokens": cached,
        "output_tokens": len(req.output_ids),
    }
