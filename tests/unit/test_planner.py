"""Scheduling decisions without a model: admission, in-batch prefix sharing, policies,
preemption. A fake 'forward' just advances kv_len as the scheduler would."""

from __future__ import annotations

import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.invariants import check_kv_accounting
from radixrt.cache.radix_cache import RadixCache
from radixrt.sampling_params import SamplingParams
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.planner import Planner
from radixrt.scheduler.policy import SchedulePolicy
from radixrt.scheduler.req import Req


def make_kv(pages: int = 64, page_size: int = 1) -> KVManager:
    alloc = PageAllocator(pages, page_size)
    return KVManager(alloc, RadixCache(alloc, page_size), page_size)


def make_planner(kv: KVManager, policy: str = "lpm", **kw) -> Planner:
    args = dict(max_prefill_tokens=1024, chunked_prefill_size=-1, max_running_requests=64,
                conservativeness=1.0)
    args.update(kw)
    return Planner(kv, SchedulePolicy(policy, kv), **args)


def req(ids: list[int], order: int, max_new: int = 4) -> Req:
    return Req(f"r{order}", ids, SamplingParams(max_new_tokens=max_new), arrival_order=order)


def run_step(planner: Planner, running: list[Req], waiting: list[Req]):
    plan = planner.plan(running, waiting)
    for r, n in plan:
        r.kv_len += n
        if r.kv_len == r.seq_len:
            r.output_ids.append(7)
        elif n > 1:
            planner.kv.cache_unfinished(r)
    for r, n in plan:
        if n > 1 and r.kv_len == r.seq_len - 1:
            planner.kv.cache_unfinished(r)
    for r in [r for r in running if len(r.output_ids) >= r.sampling_params.max_new_tokens]:
        planner.kv.release(r)
        running.remove(r)
    held = sum(r.private_pages(planner.kv.page_size) for r in running)
    check_kv_accounting(planner.kv.allocator, planner.kv.cache, held)
    return plan


def test_siblings_wait_for_shared_prefix_then_hit_cache():
    kv = make_kv(256)
    planner = make_planner(kv)
    prefix = list(range(100, 160))
    waiting = [req(prefix + [i], i) for i in range(3)]
    running: list[Req] = []
    first = run_step(planner, running, waiting)
    assert [r.rid for r, _ in first] == ["r0"], "siblings must wait one step"
    second = run_step(planner, running, waiting)
    admitted = {r.rid: n for r, n in second if r.rid != "r0"}
    assert admitted == {"r1": 1, "r2": 1}, "siblings compute only their own last token"
    assert all(r.cached_tokens == 60 for r in running if r.rid != "r0")


def test_chunked_prefill_interleaves_with_decode():
    kv = make_kv(512)
    planner = make_planner(kv, chunked_prefill_size=16)
    running: list[Req] = []
    waiting = [req([1, 2, 3], 0, max_new=20)]
    run_step(planner, running, waiting)
    waiting.append(req(list(range(10, 60)), 1))
    steps = [run_step(planner, running, waiting) for _ in range(4)]
    for plan in steps[:3]:
        kinds = sorted(n for _, n in plan)
        assert kinds[0] == 1 and kinds[-1] <= 16 and len(kinds) == 2


def test_preemption_when_pool_runs_out_and_accounting_holds():
    kv = make_kv(40)
    planner = make_planner(kv, conservativeness=0.0)  # admit greedily: decodes must run out
    running: list[Req] = []
    waiting = [req([i] * 8, i, max_new=20) for i in range(1, 5)]
    for _ in range(200):
        if not running and not waiting:
            break
        run_step(planner, running, waiting)
    assert not running and not waiting
    assert planner.num_preemptions > 0
    kv.cache.reset()
    assert kv.allocator.num_free_pages == 40


def test_dfs_weight_groups_requests_by_cached_prefix():
    kv = make_kv(256)
    for prefix in ([1] * 10, [2] * 10):
        slots = kv.allocator.alloc_slots(10, None)
        kv.cache.insert(prefix, slots)
    reqs = [req([1] * 10 + [5], 0), req([2] * 10 + [5], 1), req([2] * 10 + [6], 2),
            req([1] * 10 + [6], 3), req([2] * 10 + [7], 4)]
    order = [r.rid for r in SchedulePolicy("dfs-weight", kv).order(reqs)]
    assert order[:3] == ["r1", "r2", "r4"] and sorted(order[3:]) == ["r0", "r3"]
    lpm = SchedulePolicy("lpm", kv).order([req([9, 9], 9)] + reqs[:1])
    assert lpm[0].rid == "r0"
    assert [r.rid for r in SchedulePolicy("lof", kv).order(
        [req([1], 0, 4), req([1], 1, 9)])] == ["r1", "r0"]
    assert torch.equal(kv.match(reqs[0]).indices, kv.cache.match_prefix([1] * 10).indices)


def test_token_slice_spans_prompt_and_output():
    r = req([1, 2, 3], 0)
    r.output_ids = [4, 5]
    for start in range(6):
        for end in range(start, 6):
            assert r.token_slice(start, end) == r.fill_ids[start:end]
