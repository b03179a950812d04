"""PageAllocator: page and slot allocation, partial pages, exhaustion, double free."""

import pytest
import torch

from radixrt.cache.allocator import PageAllocator


def test_alloc_pages_distinct_and_counted() -> None:
    alloc = PageAllocator(num_pages=8, page_size=4)
    a = alloc.alloc_pages(3)
    b = alloc.alloc_pages(5)
    assert a is not None and b is not None
    assert a.dtype == torch.int64
    assert sorted(torch.cat((a, b)).tolist()) == list(range(8))
    assert alloc.num_free_pages == 0
    assert alloc.available_tokens == 0


def test_alloc_pages_none_when_short_takes_nothing() -> None:
    alloc = PageAllocator(num_pages=4, page_size=2)
    assert alloc.alloc_pages(3) is not None
    assert alloc.alloc_pages(2) is None
    assert alloc.num_free_pages == 1
    assert alloc.alloc_pages(1) is not None


def test_free_pages_returns_them() -> None:
    alloc = PageAllocator(num_pages=4, page_size=2)
    pages = alloc.alloc_pages(4)
    alloc.free_pages(pages[:2])
    assert alloc.num_free_pages == 2
    again = alloc.alloc_pages(2)
    assert sorted(again.tolist()) == sorted(pages[:2].tolist())


def test_alloc_slots_page_size_one() -> None:
    alloc = PageAllocator(num_pages=5, page_size=1)
    slots = alloc.alloc_slots(3, None)
    assert slots is not None and len(set(slots.tolist())) == 3
    more = alloc.alloc_slots(2, int(slots[-1]))
    assert more is not None
    assert sorted(torch.cat((slots, more)).tolist()) == list(range(5))
    assert alloc.alloc_slots(1, None) is None


def test_alloc_slots_fresh_pages_are_whole_and_in_order() -> None:
    alloc = PageAllocator(num_pages=4, page_size=4)
    slots = alloc.alloc_slots(6, None)
    assert slots is not None and slots.numel() == 6
    assert int(slots[0]) % 4 == 0  # private slots start on a fresh page
    assert (slots[:4] - slots[0]).tolist() == [0, 1, 2, 3]
    assert int(slots[4]) % 4 == 0 and int(slots[5]) == int(slots[4]) + 1
    assert alloc.num_free_pages == 2


def test_alloc_slots_continues_partial_page() -> None:
    alloc = PageAllocator(num_pages=4, page_size=4)
    first = alloc.alloc_slots(3, None)
    base = int(first[0])
    more = alloc.alloc_slots(3, int(first[-1]))
    assert more is not None
    assert int(more[0]) == base + 3  # the rest of the partial page first
    assert int(more[1]) % 4 == 0 and int(more[1]) // 4 != base // 4
    assert int(more[2]) == int(more[1]) + 1
    assert alloc.num_free_pages == 2


def test_alloc_slots_within_partial_page_takes_no_page() -> None:
    alloc = PageAllocator(num_pages=2, page_size=4)
    first = alloc.alloc_slots(1, None)
    free_before = alloc.num_free_pages
    more = alloc.alloc_slots(2, int(first[-1]))
    assert more.tolist() == [int(first[0]) + 1, int(first[0]) + 2]
    assert alloc.num_free_pages == free_before


def test_alloc_slots_after_full_page_takes_fresh_page() -> None:
    alloc = PageAllocator(num_pages=2, page_size=4)
    first = alloc.alloc_slots(4, None)
    more = alloc.alloc_slots(1, int(first[-1]))
    assert int(more[0]) % 4 == 0 and int(more[0]) // 4 != int(first[0]) // 4


def test_alloc_slots_none_when_short_takes_nothing() -> None:
    alloc = PageAllocator(num_pages=3, page_size=4)
    first = alloc.alloc_slots(5, None)  # two pages, second one partly used
    assert alloc.alloc_slots(8, int(first[-1])) is None  # 3 fit in the partial page, 5 need 2
    assert alloc.num_free_pages == 1
    ok = alloc.alloc_slots(7, int(first[-1]))  # 3 in the partial page + 4 in the last page
    assert ok is not None and ok.numel() == 7
    assert alloc.num_free_pages == 0


def test_alloc_slots_zero_tokens() -> None:
    alloc = PageAllocator(num_pages=1, page_size=4)
    assert alloc.alloc_slots(0, None).numel() == 0
    assert alloc.num_free_pages == 1


def test_free_slots_frees_containing_pages() -> None:
    alloc = PageAllocator(num_pages=4, page_size=4)
    slots = alloc.alloc_slots(6, None)
    alloc.free_slots(slots)
    assert alloc.num_free_pages == 4
    assert alloc.is_free.all()


def test_double_free_asserts() -> None:
    alloc = PageAllocator(num_pages=4, page_size=4)
    slots = alloc.alloc_slots(4, None)
    alloc.free_slots(slots)
    with pytest.raises(AssertionError, match="double free"):
        alloc.free_slots(slots)
    with pytest.raises(AssertionError, match="double free"):
        alloc.free_pages([3])  # never allocated
    assert alloc.num_free_pages == 4


def test_free_same_page_twice_in_one_call_asserts() -> None:
    alloc = PageAllocator(num_pages=4, page_size=1)
    alloc.alloc_pages(4)
    with pytest.raises(AssertionError):
        alloc.free_pages([1, 1])


def test_reset_frees_everything() -> None:
    alloc = PageAllocator(num_pages=4, page_size=2)
    alloc.alloc_pages(3)
    alloc.reset()
    assert alloc.num_free_pages == 4 and alloc.available_tokens == 8
    assert alloc.alloc_pages(4) is not None
