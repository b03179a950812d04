"""KV accounting checks, run after every scheduler step when the debug flag is on (and in tests).

Every page of the pool is in exactly one of three places: the allocator's free list, the prefix
cache (evictable or protected), or a running request's private pages. A leak or a double owner
shows up here as a count that does not add up.
"""

from __future__ import annotations

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import PrefixCache


def check_kv_accounting(
    allocator: PageAllocator, cache: PrefixCache, held_private_pages: int
) -> None:
    """Assert free + tree + held pages == num_pages, the cache's size counters agree with its
    tree, and no tree slot lies on a free page. Raises AssertionError naming the numbers.

    Cost: O(tree nodes + tree tokens); meant for debug mode and tests, not the hot path.
    """
    page_size = allocator.page_size
    evictable, protected = cache.evictable_size(), cache.protected_size()
    total = cache.total_size()
    assert evictable + protected == total, (
        f"cache counters disagree with its tree: evictable {evictable} + protected {protected}"
        f" != total {total} tokens"
    )
    assert total % page_size == 0, f"tree holds {total} tokens, not whole pages of {page_size}"
    free, tree_pages = allocator.num_free_pages, total // page_size
    assert free + tree_pages + held_private_pages == allocator.num_pages, (
        f"KV pages leaked or double counted: free {free} + tree {tree_pages}"
        f" + held {held_private_pages} != pool {allocator.num_pages}"
    )
    assert int(allocator.is_free.sum()) == free, "allocator's free table and free count disagree"
    _check_tree_pages(allocator, cache, tree_pages)


def _check_tree_pages(allocator: PageAllocator, cache: PrefixCache, tree_pages: int) -> None:
    """The tree's pages are distinct (no two nodes share one) and none of them is free."""
    pages = torch.unique(cache.cached_slots().cpu() // allocator.page_size)
    assert pages.numel() == tree_pages, (
        f"tree slots span {pages.numel()} distinct pages, expected {tree_pages}"
    )
    on_free = pages[allocator.is_free[pages]]
    assert on_free.numel() == 0, f"tree holds slots on free pages {on_free.tolist()[:16]}"
