"""KVManager.truncate (a rejected jump-forward proposal): the request keeps exactly its first
`length` slots, whole private pages past them go back, and the accounting stays exact."""

from __future__ import annotations

import pytest

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.invariants import check_kv_accounting
from radixrt.cache.radix_cache import RadixCache
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.req import Req


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("cut", [0, 1, 3, 17])
def test_truncate_frees_whole_pages_past_the_cut(page_size, cut):
    allocator = PageAllocator(64, page_size)
    cache = RadixCache(allocator, page_size)
    table = ReqToTokenTable(2, 128, "cpu")
    kv = KVManager(allocator, cache, table)
    req = Req("r", list(range(40)), SamplingParams())
    match = cache.match_prefix([])
    assert kv.fits(req, match, 40)
    kv.admit(req, match, 40)
    req.kv_len = 40

    def slots_of(r: Req) -> list[int]:
        return table.read(r.table_row, 0, r.num_slots).tolist()

    slots = slots_of(req)
    kv.truncate(req, 40 - cut)
    assert req.kv_len == 40 - cut and slots_of(req) == slots[: 40 - cut]
    held = req.private_pages(page_size)
    assert held == -(-(40 - cut) // page_size)
    check_kv_accounting(allocator, cache, held)
    assert kv.alloc(req, cut + 5)  # growing again continues in the kept page
    assert slots_of(req)[: 40 - cut] == slots[: 40 - cut]
    assert len(set(slots_of(req))) == req.num_slots == 45
    check_kv_accounting(allocator, cache, req.private_pages(page_size))
