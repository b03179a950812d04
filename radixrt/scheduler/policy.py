"""Orders the waiting queue each step (SGLang's schedule policies).

- fcfs: arrival order.
- lpm: longest cached prefix first, so hits run while their prefix is still cached.
- dfs-weight: walk the radix tree depth-first, heavier subtrees (more waiting requests) first,
  so requests sharing a prefix run back to back.
- lof: longest output (max_new_tokens) first.
- random: a shuffle.
"""

from __future__ import annotations

import random
from collections import defaultdict

from radixrt.cache.base import CacheNode
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.req import Req

# Matching every waiting request against the tree each step costs O(queue * prompt); past this
# queue length the cache-aware policies fall back to arrival order, as SGLang does.
MAX_QUEUE_FOR_PREFIX_POLICY = 256


class SchedulePolicy:
    def __init__(self, policy: str, kv: KVManager, seed: int = 0) -> None:
        self.policy = policy
        self.kv = kv
        self.rng = random.Random(seed)

    def order(self, waiting: list[Req]) -> list[Req]:
        """Return the waiting requests in the order admission should try them. Cache-aware
        policies also leave each request's `prefix_match_len` up to date."""
        if not waiting:
            return []
        policy = self.policy
        cache_aware = policy in ("lpm", "dfs-weight")
        if cache_aware and len(waiting) > MAX_QUEUE_FOR_PREFIX_POLICY:
            policy = "fcfs"
        by_arrival = sorted(waiting, key=lambda r: r.arrival_order)
        if policy == "fcfs":
            return by_arrival
        if policy == "lof":
            return sorted(by_arrival, key=lambda r: -r.max_new_tokens)
        if policy == "random":
            self.rng.shuffle(by_arrival)
            return by_arrival
        nodes = {id(r): self.kv.match(r).last_node for r in by_arrival}
        if policy == "lpm":
            return sorted(by_arrival, key=lambda r: -r.prefix_match_len)
        return _dfs_weight_order(by_arrival, nodes)


def _dfs_weight_order(reqs: list[Req], nodes: dict[int, CacheNode]) -> list[Req]:
    reqs_at: dict[int, list[Req]] = defaultdict(list)
    weight: dict[int, int] = defaultdict(int)
    node_by_id: dict[int, CacheNode] = {}
    for req in reqs:
        node: CacheNode | None = nodes[id(req)]
        reqs_at[id(node)].append(req)
        while node is not None:  # every ancestor's subtree holds this request
            weight[id(node)] += 1
            node_by_id[id(node)] = node
            node = node.parent
    root = next(n for n in node_by_id.values() if n.parent is None)
    ordered: list[Req] = []
    stack = [root]
    while stack:
        node = stack.pop()
        ordered.extend(reqs_at.get(id(node), []))
        children = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
        children.sort(key=lambda c: weight[id(c)])  # heaviest popped first
        stack.extend(children)
    return ordered
