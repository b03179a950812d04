"""Page allocator for the KV pool.

The pool's `num_pages * page_size` token slots are handed out a page at a time: page p owns
slots p*page_size .. p*page_size+page_size-1 (see kv_pool.py). A sequence's private slots always
start on a fresh page, so every page belongs wholly to one owner (a request or the radix tree)
and giving slots back means giving back the pages that contain them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PageAllocator:
    """A stack of free page ids plus an `is_free` table that catches double frees.

    All operations cost O(pages touched), except `reset`, which is O(num_pages). Tensors live on
    the CPU: the scheduler owns this bookkeeping, the device only sees the resulting slot ids.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        assert num_pages > 0 and page_size > 0, (num_pages, page_size)
        self.num_pages = num_pages
        self.page_size = page_size
        # offsets of the slots inside one page, [page_size]; reused by every allocation
        self._offsets = torch.arange(page_size, dtype=torch.int64)
        self.reset()

    def reset(self) -> None:
        """Mark every page free."""
        # The free stack, [num_pages]; entries [0, _num_free) are free page ids. It is filled in
        # descending order so that a fresh allocator hands out pages 0, 1, 2, ... (easier to read
        # in tests and debug dumps).
        self._stack = torch.arange(self.num_pages - 1, -1, -1, dtype=torch.int64)
        self._num_free = self.num_pages
        self._is_free = torch.ones(self.num_pages, dtype=torch.bool)

    @property
    def num_free_pages(self) -> int:
        return self._num_free

    @property
    def available_tokens(self) -> int:
        """Tokens that fit in the free pages."""
        return self._num_free * self.page_size

    @property
    def is_free(self) -> torch.Tensor:
        """Read-only view of the per-page free flags, bool [num_pages] (for invariant checks)."""
        return self._is_free

    def alloc_pages(self, n: int) -> torch.Tensor | None:
        """Take `n` free pages; returns their ids (int64 [n]) or None, taking nothing, if fewer
        than `n` are free."""
        assert n >= 0, n
        if n > self._num_free:
            return None
        top = self._num_free
        pages = self._stack[top - n : top].flip(0)  # flip: a copy, and ascending on a fresh pool
        self._num_free = top - n
        self._is_free[pages] = False
        return pages

    def alloc_slots(self, num_tokens: int, last_slot: int | None) -> torch.Tensor | None:
        """Slots for `num_tokens` new positions of one sequence, in position order (int64).

        `last_slot` is the sequence's last private slot, or None if it has none (or its last slot
        is borrowed from the radix tree). The rest of last_slot's page is used first, then fresh
        whole pages. Returns None, taking nothing, if not enough pages are free.
        """
        assert num_tokens >= 0, num_tokens
        head = self._rest_of_page(last_slot, num_tokens)
        need = num_tokens - head.numel()
        pages = self.alloc_pages(-(-need // self.page_size))
        if pages is None:
            return None
        fresh = (pages[:, None] * self.page_size + self._offsets).flatten()[:need]
        return torch.cat((head, fresh)) if head.numel() else fresh

    def _rest_of_page(self, last_slot: int | None, num_tokens: int) -> torch.Tensor:
        """Up to `num_tokens` slots following `last_slot` inside its page."""
        if last_slot is None:
            return self._offsets[:0]
        assert not self._is_free[last_slot // self.page_size], f"slot {last_slot} is on a free page"
        used = last_slot % self.page_size + 1
        count = min(self.page_size - used, num_tokens)
        return torch.arange(last_slot + 1, last_slot + 1 + count, dtype=torch.int64)

    def free_slots(self, slots: torch.Tensor) -> None:
        """Give back the pages that contain `slots`; the caller must own those pages wholly."""
        if slots.numel():
            self.free_pages(torch.unique(slots // self.page_size))

    def free_pages(self, page_ids: torch.Tensor | Sequence[int]) -> None:
        """Give back pages by id. Freeing a page that is already free is a bug (AssertionError)."""
        # the bookkeeping lives on the CPU even if the caller's page table is on the device
        pages = torch.as_tensor(page_ids, dtype=torch.int64).flatten().cpu()
        n = pages.numel()
        if n == 0:
            return
        assert not self._is_free[pages].any(), f"double free of pages {self._double(pages)}"
        assert torch.unique(pages).numel() == n, f"page listed twice in one free: {pages.tolist()}"
        self._is_free[pages] = True
        self._stack[self._num_free : self._num_free + n] = pages
        self._num_free += n

    def _double(self, pages: torch.Tensor) -> list[int]:
        return pages[self._is_free[pages]].tolist()
