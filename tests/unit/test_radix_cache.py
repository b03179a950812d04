"""RadixCache: splitting, paged matching, insert ownership, locking, LRU eviction, accounting;
the cache never frees a page itself (what it drops comes back to the caller)."""

import pytest
import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import Dropped, create_prefix_cache
from radixrt.cache.invariants import check_kv_accounting
from radixrt.cache.radix_cache import RadixCache

A, B, C, D, X, Y, Z = range(7)


def make(page_size: int = 1, num_pages: int = 64) -> tuple[PageAllocator, RadixCache]:
    alloc = PageAllocator(num_pages, page_size)
    return alloc, RadixCache(alloc, page_size)


def put(cache: RadixCache, key: list[int]) -> torch.Tensor:
    """Insert `key` with fresh slots (freeing the part already cached); returns the slots."""
    slots = cache.allocator.alloc_slots(len(key), None)
    assert slots is not None
    present = cache.insert(key, slots)
    cache.allocator.free_slots(slots[:present])
    return slots


def give_back(alloc: PageAllocator, dropped: Dropped) -> int:
    """Free what the cache dropped, as the KVManager does; returns the tokens."""
    for span in dropped.spans:
        alloc.free_slots(span)
    return dropped.tokens


def evict(cache: RadixCache, n: int) -> int:
    return give_back(cache.allocator, cache.evict(n))


def test_insert_splits_node_at_divergence() -> None:
    _, cache = make()
    put(cache, [A, B, C, D])
    assert cache.insert([A, B, X, Y], torch.tensor([10, 11, 12, 13])) == 2
    (shared,) = cache.root.children.values()
    assert shared.key == [A, B]
    assert sorted(child.key for child in shared.children.values()) == [[C, D], [X, Y]]
    assert cache.total_size() == 6


def test_match_ending_mid_node_splits_it() -> None:
    alloc, cache = make()
    slots = put(cache, [A, B, C, D])
    m = cache.match_prefix([A, B, Z])
    assert m.indices.tolist() == slots[:2].tolist()
    assert m.last_node.key == [A, B]
    assert [c.key for c in m.last_node.children.values()] == [[C, D]]
    assert cache.match_prefix([A, B, C, D]).indices.tolist() == slots.tolist()
    check_kv_accounting(alloc, cache, 0)


def test_match_nothing_returns_root() -> None:
    _, cache = make()
    put(cache, [A, B])
    m = cache.match_prefix([C])
    assert m.indices.numel() == 0 and m.last_node is cache.root
    assert cache.match_prefix([]).last_node is cache.root


def test_paged_match_is_page_aligned() -> None:
    alloc, cache = make(page_size=4)
    key = [A, B, C, D, A, B, C, D]
    slots = put(cache, key)
    assert cache.match_prefix(key[:7]).indices.tolist() == slots[:4].tolist()
    diverged = cache.match_prefix(key[:6] + [Z, Z])
    assert diverged.indices.tolist() == slots[:4].tolist()
    assert len(diverged.last_node.key) == 4  # split at the page boundary
    assert cache.match_prefix(key[:3]).indices.numel() == 0
    check_kv_accounting(alloc, cache, 0)


def test_paged_insert_splits_only_at_page_boundaries() -> None:
    alloc, cache = make(page_size=4)
    put(cache, [A, B, C, D, A, B, C, D])
    slots = alloc.alloc_slots(8, None)
    # diverges at position 5: the shared part is the first page only
    assert cache.insert([A, B, C, D, A, X, C, D], slots) == 4
    alloc.free_slots(slots[:4])
    (shared,) = cache.root.children.values()
    assert shared.key == [A, B, C, D]
    assert all(len(c.key) == 4 for c in shared.children.values())
    check_kv_accounting(alloc, cache, 0)


def test_paged_insert_requires_aligned_key() -> None:
    _, cache = make(page_size=4)
    with pytest.raises(AssertionError):
        cache.insert([A, B, C], torch.tensor([0, 1, 2]))


def test_insert_returns_already_present_length() -> None:
    _, cache = make()
    assert cache.insert([A, B, C], torch.tensor([0, 1, 2])) == 0
    assert cache.insert([A, B, C], torch.tensor([5, 6, 7])) == 3
    assert cache.insert([A, B, C, D], torch.tensor([5, 6, 7, 8])) == 3
    assert cache.insert([A, B], torch.tensor([5, 6])) == 2
    # the tree kept its own slots for the shared part and took only the new tail
    assert cache.match_prefix([A, B, C, D]).indices.tolist() == [0, 1, 2, 8]


def test_eviction_is_lru() -> None:
    alloc, cache = make()
    put(cache, [A, A])
    put(cache, [B, B])
    put(cache, [C, C])
    cache.match_prefix([A, A])  # A is now the most recently used
    assert evict(cache, 2) == 2
    assert cache.match_prefix([B, B]).indices.numel() == 0
    assert cache.match_prefix([C, C]).indices.numel() == 2
    assert evict(cache, 2) == 2  # C was touched above, after A: A goes next
    assert cache.match_prefix([A, A]).indices.numel() == 0
    assert cache.total_size() == 2
    check_kv_accounting(alloc, cache, 0)


def test_locked_nodes_never_evicted() -> None:
    alloc, cache = make()
    put(cache, [A, B, C])
    put(cache, [X, Y])
    m = cache.match_prefix([A, B])  # splits: locked [A, B], unlocked leaf [C]
    cache.inc_lock_ref(m.last_node)
    assert cache.protected_size() == 2 and cache.evictable_size() == 3
    assert evict(cache, 1000) == 3
    assert cache.match_prefix([A, B, C]).indices.numel() == 2
    assert cache.evictable_size() == 0 and cache.protected_size() == 2
    check_kv_accounting(alloc, cache, 0)
    cache.dec_lock_ref(m.last_node)
    assert evict(cache, 1000) == 2
    assert cache.total_size() == 0 and alloc.num_free_pages == alloc.num_pages


def test_lock_counts_follow_the_path() -> None:
    _, cache = make()
    put(cache, [A, B, C, D])
    upper = cache.match_prefix([A, B]).last_node
    lower = cache.match_prefix([A, B, C, D]).last_node
    assert cache.inc_lock_ref(lower) == 4
    assert cache.inc_lock_ref(upper) == 0  # already protected through `lower`
    assert upper.lock_ref == 2 and lower.lock_ref == 1
    assert cache.dec_lock_ref(lower) == 2
    assert (cache.evictable_size(), cache.protected_size()) == (2, 2)
    assert cache.dec_lock_ref(upper) == 2
    with pytest.raises(AssertionError):
        cache.dec_lock_ref(upper)


def test_split_of_locked_node_keeps_lock() -> None:
    alloc, cache = make()
    put(cache, [A, B, C, D])
    node = cache.match_prefix([A, B, C, D]).last_node
    cache.inc_lock_ref(node)
    cache.match_prefix([A, B])  # splits the locked node
    assert cache.protected_size() == 4 and evict(cache, 100) == 0
    cache.dec_lock_ref(node)
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    check_kv_accounting(alloc, cache, 0)


def test_evict_frees_parents_that_become_leaves() -> None:
    alloc, cache = make()
    put(cache, [A, B, C, D])
    put(cache, [A, B, X, Y])
    put(cache, [Z])
    cache.match_prefix([Z])  # Z is newest; the [A, B] subtree is older
    # [C, D] and [X, Y] free 4 tokens; their parent [A, B] is then an unlocked leaf and goes
    # next, before the newer [Z]; that makes 6 >= 5
    assert evict(cache, 5) == 6
    assert cache.match_prefix([A]).indices.numel() == 0
    assert cache.total_size() == 1
    check_kv_accounting(alloc, cache, 0)


def test_evict_paged_returns_pages() -> None:
    alloc, cache = make(page_size=4, num_pages=4)
    put(cache, [A] * 8)
    put(cache, [B] * 4)
    assert alloc.num_free_pages == 1
    assert evict(cache, 1) == 8  # whole LRU leaf
    assert alloc.num_free_pages == 3
    check_kv_accounting(alloc, cache, 0)


def test_no_sharing_cache_caches_nothing() -> None:
    alloc = PageAllocator(8, 1)
    cache = create_prefix_cache("none", alloc)
    slots = alloc.alloc_slots(2, None)
    m = cache.match_prefix([A, B])
    assert m.indices.numel() == 0
    published = cache.publish([A, B], slots, 0, m.last_node)
    assert published.length == 0 and published.slots.numel() == 0  # the caller keeps all
    assert cache.insert([A, B], slots) == 2  # it takes nothing: the caller keeps both
    assert cache.match_prefix([A, B]).indices.numel() == 0
    assert cache.total_size() == 0 and cache.evict(10).tokens == 0
    assert cache.reset().tokens == 0 and cache.unlocked_tokens(m.last_node) == 0
    check_kv_accounting(alloc, cache, held_private_pages=2)
    with pytest.raises(ValueError, match="prefix cache kind"):
        create_prefix_cache("lru", alloc)


def test_publish_drops_duplicates_and_moves_the_lock() -> None:
    """Two requests computed the same pages: the second one's copies come back as dropped (the
    caller frees them) and its table points at the first one's; its lock moves from the node
    it borrowed to the new one."""
    alloc, cache = make(page_size=2, num_pages=16)
    first = put(cache, [A, B, C, D])
    root = cache.match_prefix([]).last_node
    mine = alloc.alloc_slots(6, None)
    free_before = alloc.num_free_pages
    published = cache.publish([A, B, C, D, X, Y], mine, 0, root)
    assert published.length == 6
    assert published.slots[:4].tolist() == first.tolist()  # the cached copies, not mine
    assert published.slots[4:].tolist() == mine[4:].tolist()
    assert alloc.num_free_pages == free_before  # the cache freed nothing itself
    assert [s.tolist() for s in published.dropped.spans] == [mine[:4].tolist()]
    give_back(alloc, published.dropped)  # my two duplicate pages
    assert cache.protected_size() == 6 and published.node.lock_ref == 1
    cache.dec_lock_ref(published.node)
    check_kv_accounting(alloc, cache, 0)


def test_reset_drops_all_and_refuses_when_locked() -> None:
    alloc, cache = make(page_size=2, num_pages=8)
    slots = put(cache, [A, B, C, D])
    node = cache.match_prefix([A, B]).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(AssertionError):
        cache.reset()
    cache.dec_lock_ref(node)
    dropped = cache.reset()
    assert sorted(torch.cat(dropped.spans).tolist()) == slots.tolist()
    assert alloc.num_free_pages == 6 and cache.total_size() == 0  # the caller frees them
    give_back(alloc, dropped)
    assert alloc.num_free_pages == 8
    check_kv_accounting(alloc, cache, 0)


def test_accounting_detects_leaks_and_overlap() -> None:
    alloc, cache = make(page_size=2, num_pages=8)
    slots = put(cache, [A, B, C, D])
    private = alloc.alloc_slots(3, None)
    check_kv_accounting(alloc, cache, held_private_pages=2)
    with pytest.raises(AssertionError, match="free 4 \\+ tree 2 \\+ held 1 != pool 8"):
        check_kv_accounting(alloc, cache, held_private_pages=1)
    alloc.free_slots(private)
    alloc.free_slots(slots[:2])  # a tree page wrongly freed behind the tree's back
    with pytest.raises(AssertionError):
        check_kv_accounting(alloc, cache, held_private_pages=-1)  # counts balance, pages overlap


class SealedAllocator(PageAllocator):
    """An allocator the cache may read but not change: any take or give back fails."""

    def alloc_pages(self, n: int) -> torch.Tensor | None:
        raise AssertionError("the cache took pages")

    def free_pages(self, page_ids: object) -> None:
        raise AssertionError("the cache gave pages back")


def test_the_tree_never_takes_or_frees_pages() -> None:
    """One owner: every page the tree lets go of comes back as `Dropped`, and the caller
    (the KVManager) frees it. Whatever the tree does, its allocator is left alone."""
    pool = PageAllocator(32, 2)
    cache = RadixCache(SealedAllocator(32, 2), 2)
    for key in ([A, B, C, D], [A, B, X, Y], [Z, Z]):
        slots = pool.alloc_slots(len(key), None)
        assert slots is not None
        pool.free_slots(slots[: cache.insert(key, slots)])
    mine = pool.alloc_slots(6, None)
    assert mine is not None
    published = cache.publish([A, B, C, D, Z, Z], mine, 0, cache.root)
    cache.dec_lock_ref(published.node)
    for dropped in (published.dropped, cache.evict(4), cache.reset()):
        give_back(pool, dropped)
    assert pool.num_free_pages == pool.num_pages and cache.total_size() == 0


def test_unlocked_tokens_is_what_a_lock_would_protect() -> None:
    _, cache = make()
    put(cache, [A, B, C, D])
    upper = cache.match_prefix([A, B]).last_node
    lower = cache.match_prefix([A, B, C, D]).last_node
    assert cache.unlocked_tokens(lower) == 4 and cache.unlocked_tokens(cache.root) == 0
    cache.inc_lock_ref(upper)
    assert cache.unlocked_tokens(lower) == 2 == cache.inc_lock_ref(lower)
    assert cache.unlocked_tokens(lower) == 0


def test_format_tree_lists_nodes() -> None:
    _, cache = make()
    put(cache, [A, B, C])
    put(cache, [A, X])
    text = cache.format_tree()
    assert "len=1" in text and "len=2" in text and text.count("\n") == 3
