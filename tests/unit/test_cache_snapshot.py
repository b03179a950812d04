"""cache_snapshot: the /cache_tree picture of a RadixCache is bounded (depth, max_nodes, the size
walk), ordered biggest subtree first, and its token counts add up to what the tree holds."""

from __future__ import annotations

import random
from typing import Any

import pytest

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import create_prefix_cache
from radixrt.cache.radix_cache import RadixCache
from radixrt.protocol.messages import MAX_CACHE_TREE_DEPTH, MAX_CACHE_TREE_NODES
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler import cache_snapshot as snap
from radixrt.scheduler.req import Req


def put(cache: RadixCache, key: list[int]) -> None:
    slots = cache.allocator.alloc_slots(len(key), None)
    assert slots is not None
    present = cache.insert(key, slots)
    cache.allocator.free_slots(slots[:present])


def random_tree(seed: int = 0, prompts: int = 60, page_size: int = 1) -> RadixCache:
    """Prompts that share prefixes of random lengths: a bushy tree several levels deep."""
    rng = random.Random(seed)
    cache = RadixCache(PageAllocator(20_000 // page_size, page_size))
    stems: list[list[int]] = [[]]
    for _ in range(prompts):
        stem = rng.choice(stems)
        key = stem[: rng.randint(0, len(stem))] + [rng.randrange(100) for _ in range(12)]
        key = key[: len(key) // page_size * page_size]
        put(cache, key)
        stems.append(key)
    return cache


def nodes_of(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node] + [n for child in node["children"] for n in nodes_of(child)]


def depth_of(node: dict[str, Any]) -> int:
    return 1 + max((depth_of(c) for c in node["children"]), default=-1)


def take(cache: RadixCache, depth: int = 6, max_nodes: int = 200, **kw: Any) -> dict[str, Any]:
    return snap.cache_snapshot(cache, [], [], {"steps": 1}, depth=depth, max_nodes=max_nodes, **kw)


def check_sums(node: dict[str, Any]) -> None:
    """Every described node's subtree = its tokens + its shown children + its summary."""
    more = node["more"] or {"tokens": 0, "nodes": 0}
    assert node["subtree_tokens"] == node["tokens"] + more["tokens"] + sum(
        c["subtree_tokens"] for c in node["children"]
    )
    assert node["subtree_nodes"] == 1 + more["nodes"] + sum(
        c["subtree_nodes"] for c in node["children"]
    )
    for child in node["children"]:
        check_sums(child)


@pytest.mark.parametrize("page_size", [1, 4])
def test_whole_small_tree_is_described_and_adds_up(page_size: int) -> None:
    cache = random_tree(prompts=15, page_size=page_size)
    tree = take(cache, depth=MAX_CACHE_TREE_DEPTH, max_nodes=MAX_CACHE_TREE_NODES)["tree"]
    shown = nodes_of(tree["root"])[1:]
    assert tree["complete"] and tree["total_nodes"] == len(shown) == tree["nodes_shown"]
    assert tree["root"]["subtree_tokens"] == cache.total_size() == tree["total_tokens"]
    assert sum(n["tokens"] for n in shown) == cache.total_size()
    assert all(n["more"] is None for n in shown)
    check_sums(tree["root"])


def test_max_nodes_and_depth_bound_it_and_the_rest_is_summarised() -> None:
    cache = random_tree()
    full = take(cache, depth=64, max_nodes=1000)["tree"]
    assert full["total_nodes"] > 40 and depth_of(full["root"]) > 3, "the test needs a big tree"
    for depth, max_nodes in [(2, 2000), (64, 10), (3, 7), (1, 1)]:
        tree = take(cache, depth=depth, max_nodes=max_nodes)["tree"]
        assert tree["nodes_shown"] == len(nodes_of(tree["root"])) - 1 <= max_nodes
        assert depth_of(tree["root"]) <= depth
        assert tree["root"]["subtree_tokens"] == cache.total_size()
        assert any(n["more"] for n in nodes_of(tree["root"])), "something must be left out"
        check_sums(tree["root"])


def test_children_come_biggest_subtree_first_and_the_biggest_are_chosen() -> None:
    cache = random_tree(seed=3)
    tree = take(cache, depth=64, max_nodes=12)["tree"]
    for node in nodes_of(tree["root"]):
        sizes = [c["subtree_tokens"] for c in node["children"]]
        assert sizes == sorted(sizes, reverse=True)
    # Best first: no hidden child of a shown node outweighs a shown node below the root.
    full = {n["id"]: n for n in nodes_of(take(cache, depth=64, max_nodes=1000)["tree"]["root"])}
    shown = nodes_of(tree["root"])[1:]
    smallest = min(n["subtree_tokens"] for n in shown)
    for node in nodes_of(tree["root"]):
        listed = {c["id"] for c in node["children"]}
        hidden = [c for c in full[node["id"]]["children"] if c["id"] not in listed]
        assert all(c["subtree_tokens"] <= smallest for c in hidden)


def test_the_size_walk_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = random_tree()
    total = take(cache, depth=64, max_nodes=1000)["tree"]["total_nodes"]
    monkeypatch.setattr(snap, "SIZE_WALK_BUDGET", 10)
    tree = take(cache, depth=64, max_nodes=1000)["tree"]
    assert not tree["complete"]
    assert tree["total_nodes"] < total and tree["nodes_shown"] <= tree["total_nodes"]
    assert any(not n["counted"] for n in nodes_of(tree["root"]))
    check_sums(tree["root"])  # consistent, as lower bounds


def test_node_fields_locks_and_previews() -> None:
    cache = random_tree(prompts=5)
    long_key = list(range(200, 260))
    put(cache, long_key)
    match = cache.match_prefix(long_key)
    cache.inc_lock_ref(match.last_node)
    tree = take(cache, depth=64, max_nodes=1000)["tree"]
    (node,) = [n for n in nodes_of(tree["root"]) if n["preview_ids"][:1] == [200]]
    assert node["preview_ids"] == long_key[: snap.PREVIEW_TOKENS] and node["tokens"] == 60
    assert node["lock_ref"] == 1 and not node["evictable"] and node["last_access_s"] == 0.0
    others = [n for n in nodes_of(tree["root"])[1:] if n is not node]
    assert all(n["evictable"] and n["last_access_s"] >= 0 for n in others)
    assert tree["root"]["evictable"] is False and tree["root"]["last_access_s"] is None


def test_kv_pool_parts_add_up_and_requests_are_listed() -> None:
    cache = RadixCache(PageAllocator(64, 4))
    put(cache, list(range(16)))  # 4 cached pages
    match = cache.match_prefix(list(range(8)))
    cache.inc_lock_ref(match.last_node)  # 2 of them locked by a running request
    req = Req("run-1", list(range(11)), SamplingParams(), output_ids=[5, 6])
    req.num_slots, req.tree_len, req.cached_tokens = 13, 8, 8
    assert cache.allocator.alloc_pages(req.private_pages(4)) is not None
    queued = Req("wait-1", list(range(30)), SamplingParams(), prefix_match_len=16)
    out = snap.cache_snapshot(cache, [req], [queued], {}, depth=6, max_nodes=200)
    pool = out["kv_pool"]
    assert pool["in_use_pages"] + pool["cached_pages"] + pool["free_pages"] == pool["pages"] == 64
    assert (pool["cached_pages"], pool["locked_cache_pages"], pool["private_pages"]) == (2, 2, 2)
    assert pool["in_use_pages"] == 4 and pool["in_use_tokens"] == 16 and pool["page_size"] == 4
    reqs = out["requests"]
    assert reqs["running"] == [
        {"rid": "run-1", "prompt_tokens": 11, "cached_tokens": 8, "output_tokens": 2}
    ]
    assert reqs["queued"][0]["cached_tokens"] == 16 and reqs["num_queued"] == 1
    assert reqs["running_output_tokens"] == 2


def test_no_sharing_cache_has_no_tree_and_bad_bounds_are_clamped() -> None:
    cache = create_prefix_cache("none", PageAllocator(8, 1))
    stats = {"steps": 3, "histograms": {"lifetime": [1, 2]}}
    out = snap.cache_snapshot(cache, [], [], stats, depth=-5, max_nodes=10**9)
    assert out["radix_cache"] is False and out["tree"] is None and out["stats"] == {"steps": 3}
    assert out["kv_pool"]["free_pages"] == 8
    tree = take(random_tree(), depth=10**6, max_nodes=0)["tree"]
    assert (tree["depth"], tree["max_nodes"]) == (MAX_CACHE_TREE_DEPTH, 1)
    assert tree["nodes_shown"] == 1


def test_snapshot_leaves_the_tree_as_it_was() -> None:
    cache = random_tree(seed=5)
    before = (cache.format_tree(), cache.evictable_size(), cache.protected_size())
    take(cache, depth=3, max_nodes=5)
    assert (cache.format_tree(), cache.evictable_size(), cache.protected_size()) == before
