"""The real scheduler loop (planner, KV manager, prefix cache, request-to-token table, output
processor, settle) driven step by step with a fake model runner: no model, every decision
visible. The fake runner checks what a real one relies on (lengths committed only after the
forward, every slot of the step mapped, on an allocated page, written once) and answers each
logit row with a one-hot on a token derived from the input, so outputs are predictable."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import create_prefix_cache
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.ipc.transport import queue_pair
from radixrt.layers.config import RopeConfig
from radixrt.protocol.messages import BatchOutput, FlushCacheReq, GenerateReq, decode_from_scheduler
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.components import Components
from radixrt.scheduler.lockstep_base import Lockstep
from radixrt.scheduler.planner import resolve_max_prefill_tokens
from radixrt.scheduler.policy import SchedulePolicy
from radixrt.scheduler.req import Req
from radixrt.scheduler.schedule_batch import ScheduleBatch
from radixrt.scheduler.scheduler import Scheduler
from radixrt.server_args import ServerArgs

VOCAB = 64
EOS = 1


def next_token(token: int) -> int:
    """What the fake model says after `token` (never EOS, so lengths are max_new_tokens)."""
    return 2 + (token * 7 + 3) % (VOCAB - 2)


class FakeRunner:
    def __init__(self, table: ReqToTokenTable, allocator: PageAllocator) -> None:
        self.table = table
        self.allocator = allocator
        self.batches: list[ScheduleBatch] = []
        self.kv_pool = self  # forks copy nothing here: the fake model keeps no K/V

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        pass

    def forward(self, batch: ScheduleBatch) -> torch.Tensor:
        self.batches.append(batch)
        new_slots = []
        for req, prefix, n, row in zip(
            batch.reqs, batch.prefix_lens, batch.extend_lens, batch.table_rows, strict=True
        ):
            assert req.kv_len == prefix, "kv_len is committed after the forward, not before"
            assert req.table_row == row and req.num_slots >= prefix + n
            slots = self.table.read(row, 0, prefix + n)
            pages = slots // self.allocator.page_size
            assert not self.allocator.is_free[pages].any(), "a slot on a free page"
            new_slots.append(slots[prefix:])
        written = torch.cat(new_slots)
        assert torch.unique(written).numel() == written.numel(), "two tokens, one slot"
        logits = torch.zeros(len(batch.logit_rows), VOCAB)
        for i, row in enumerate(batch.logit_rows):
            logits[i, next_token(batch.input_ids[row])] = 10.0
        return logits


def make_scheduler(
    pool_tokens: int = 256,
    page_size: int = 1,
    cache: str = "radix",
    lockstep: Lockstep | None = None,
    **overrides,
) -> tuple[Scheduler, FakeRunner, object]:
    args = ServerArgs(
        page_size=page_size,
        max_total_tokens=pool_tokens,
        enable_kv_checks=True,
        max_running_requests=16,
        **overrides,
    )
    allocator = PageAllocator(pool_tokens // page_size, page_size)
    table = ReqToTokenTable(args.max_running_requests, 512, "cpu")
    runner = FakeRunner(table, allocator)
    parts = Components(
        model_config=SimpleNamespace(eos_token_ids=[EOS], vocab_size=VOCAB, rope=RopeConfig()),
        runner=runner,
        allocator=allocator,
        cache=create_prefix_cache(cache, allocator),
        table=table,
        pool_tokens=pool_tokens,
        dtype=torch.float32,
        device="cpu",
        attention_backend="fake",
        context_length=512,
        tokenizer=None,
    )
    front, back = queue_pair()
    return Scheduler(args, parts, back, lockstep), runner, front


def submit(scheduler: Scheduler, rid: str, ids: list[int], max_new: int = 4) -> None:
    params = {"temperature": 0, "max_new_tokens": max_new}
    scheduler.handle(GenerateReq(rid, ids, params))


def run_until_idle(scheduler: Scheduler, front, max_steps: int = 500) -> dict[str, list[int]]:
    outs: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not (scheduler.running or scheduler.waiting):
            break
        scheduler.step()  # the KV accounting check runs after every step
    assert not scheduler.running and not scheduler.waiting, "the scheduler did not finish"
    for data in front.recv(timeout=0):
        msg = decode_from_scheduler(data)
        if isinstance(msg, BatchOutput):
            for out in msg.outputs:
                outs[out.rid] = outs.get(out.rid, []) + out.new_output_ids
    return outs


def expected(ids: list[int], max_new: int) -> list[int]:
    out = []
    for _ in range(max_new):
        out.append(next_token((ids + out)[-1]))
    return out


def test_outputs_follow_the_model_and_the_pool_is_whole_afterwards():
    scheduler, runner, front = make_scheduler()
    prompts = {f"r{i}": [3 + i] * (5 + 3 * i) for i in range(5)}
    for rid, ids in prompts.items():
        submit(scheduler, rid, ids, max_new=6)
    outs = run_until_idle(scheduler, front)
    assert outs == {rid: expected(ids, 6) for rid, ids in prompts.items()}
    first = runner.batches[0]
    assert first.prefix_lens == (0,) * 5 and sum(first.extend_lens) == sum(
        len(p) for p in prompts.values()
    )
    assert all(n == 1 for n in runner.batches[-1].extend_lens)
    scheduler.handle(FlushCacheReq())
    assert scheduler.parts.allocator.num_free_pages == 256
    assert scheduler.parts.table.num_free_rows == 16


def test_siblings_wait_for_shared_prefix_then_hit_cache():
    scheduler, runner, front = make_scheduler()
    prefix = list(range(10, 50))
    for i in range(3):
        submit(scheduler, f"r{i}", prefix + [60 + i])
    scheduler.step()
    assert [r.rid for r in runner.batches[0].reqs] == ["r0"], "siblings must wait one step"
    scheduler.step()
    admitted = {
        r.rid: (p, n)
        for r, p, n in zip(
            runner.batches[1].reqs,
            runner.batches[1].prefix_lens,
            runner.batches[1].extend_lens,
            strict=True,
        )
    }
    assert admitted["r1"] == (40, 1) and admitted["r2"] == (40, 1)
    outs = run_until_idle(scheduler, front)
    assert outs["r1"] == expected(prefix + [61], 4)


def test_chunked_prefill_interleaves_with_decode():
    scheduler, runner, front = make_scheduler(chunked_prefill_size=16)
    submit(scheduler, "short", [1, 2, 3], max_new=20)
    scheduler.step()
    submit(scheduler, "long", list(range(10, 60)))
    for _ in range(3):
        scheduler.step()
    for batch in runner.batches[1:4]:
        assert sorted(batch.extend_lens) == [1, 16]
    assert [
        b.prefix_lens[b.reqs.index(r)]
        for b in runner.batches[1:4]
        for r in b.reqs
        if r.rid == "long"
    ] == [0, 16, 32]
    outs = run_until_idle(scheduler, front)
    assert outs["long"] == expected(list(range(10, 60)), 4)


@pytest.mark.parametrize(("asked", "budget"), [(None, 2048), (4096, 4096), (100, 100)])
def test_the_prefill_budget_is_2048_tokens_a_step_on_the_cpu_unless_asked(asked, budget):
    scheduler, runner, front = make_scheduler(pool_tokens=8192, max_prefill_tokens=asked)
    prompts = {f"r{i}": [5 + i] * 400 for i in range(8)}  # 3,200 prompt tokens
    for rid, ids in prompts.items():
        submit(scheduler, rid, ids, max_new=2)
    scheduler.step()
    assert sum(runner.batches[0].extend_lens) == min(budget, 3200)
    assert scheduler.ready_message().max_prefill_tokens == budget
    outs = run_until_idle(scheduler, front)
    assert outs == {rid: expected(ids, 2) for rid, ids in prompts.items()}


def test_the_gpu_keeps_a_budget_of_8192_tokens():
    assert resolve_max_prefill_tokens(None, "cuda:0") == 8192
    assert resolve_max_prefill_tokens(None, "cpu") == 2048
    assert resolve_max_prefill_tokens(512, "cuda") == 512


def test_a_prefill_budget_below_one_token_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="max_prefill_tokens must be >= 1, got 0"):
        ServerArgs(max_prefill_tokens=0)


@pytest.mark.parametrize("page_size", [1, 4])
def test_preemption_when_the_pool_runs_out_keeps_outputs_and_accounting(page_size):
    scheduler, _, front = make_scheduler(
        pool_tokens=48, page_size=page_size, schedule_conservativeness=0.0
    )
    prompts = {f"r{i}": [i + 2] * 8 for i in range(4)}
    for rid, ids in prompts.items():
        submit(scheduler, rid, ids, max_new=20)
    outs = run_until_idle(scheduler, front)
    assert scheduler.stats.num_preemptions > 0
    assert outs == {rid: expected(ids, 20) for rid, ids in prompts.items()}
    scheduler.handle(FlushCacheReq())
    assert scheduler.parts.allocator.num_free_pages == 48 // page_size


def test_no_sharing_cache_recomputes_every_prompt_and_frees_everything():
    scheduler, runner, front = make_scheduler(cache="none", page_size=4)
    ids = list(range(5, 30))
    submit(scheduler, "a", ids)
    run_until_idle(scheduler, front)
    submit(scheduler, "b", ids)
    outs = run_until_idle(scheduler, front)
    assert outs["b"] == expected(ids, 4)
    second = [b for b in runner.batches if b.reqs[0].rid == "b"][0]
    assert second.prefix_lens == (0,) and second.extend_lens == (25,)
    assert scheduler.parts.allocator.num_free_pages == 64  # nothing stays cached


def test_dfs_weight_groups_requests_by_cached_prefix():
    scheduler, _, front = make_scheduler()
    for i, prefix in enumerate(([1] * 10, [2] * 10)):
        submit(scheduler, f"warm{i}", prefix + [9], max_new=1)
    run_until_idle(scheduler, front)
    kv = scheduler.kv

    def req(ids: list[int], order: int, max_new: int = 4) -> Req:
        return Req(f"r{order}", ids, SamplingParams(max_new_tokens=max_new), arrival_order=order)

    reqs = [
        req([1] * 10 + [5], 0),
        req([2] * 10 + [5], 1),
        req([2] * 10 + [6], 2),
        req([1] * 10 + [6], 3),
        req([2] * 10 + [7], 4),
    ]
    order = [r.rid for r in SchedulePolicy("dfs-weight", kv).order(reqs)]
    assert order[:3] == ["r1", "r2", "r4"] and sorted(order[3:]) == ["r0", "r3"]
    assert SchedulePolicy("lpm", kv).order([req([9, 9], 9)] + reqs[:1])[0].rid == "r0"
    lof = SchedulePolicy("lof", kv).order([req([1], 0, 4), req([1], 1, 9)])
    assert [r.rid for r in lof] == ["r1", "r0"]
    none = make_scheduler(cache="none")[0].kv
    assert [r.rid for r in SchedulePolicy("dfs-weight", none).order(reqs)] == [r.rid for r in reqs]


def test_token_slice_spans_prompt_and_output():
    r = Req("r", [1, 2, 3], SamplingParams())
    r.output_ids = [4, 5]
    for start in range(6):
        for end in range(start, 6):
            assert r.token_slice(start, end) == r.fill_ids[start:end]


# get_stats() is read by key (/metrics, /v1/loads, /server_info, the dashboard): these keys,
# in this order; "requests" once one was accepted.
STATS_KEYS = [
    "prompt_tokens", "cached_tokens", "generated_tokens", "steps", "num_preemptions",
    "jump_forward_tokens", "failed_requests", "spec_draft_tokens", "spec_accepted_tokens",
    "beam_groups", "beam_forks", "beam_shared_tokens", "beam_copied_tokens",
    "disagg_queue", "disagg_transfers", "disagg_transfer_failures", "disagg_transfer_tokens",
    "disagg_transfer_bytes", "disagg_transfer_seconds", "disagg_reused_tokens",
    "grammar_queue", "cache_hit_rate", "running",
    "queued", "pool_tokens", "free_tokens", "evictable_tokens", "protected_tokens",
    "evicted_tokens", "prefix_cache_queries", "prefix_cache_hits", "histograms",
]  # fmt: skip
HISTOGRAMS = [
    "iteration_tokens_total", "grammar_compile_time_seconds", "spec_accept_length",
    "kv_block_lifetime_seconds",
    "kv_block_idle_before_evict_seconds", "kv_block_reuse_gap_seconds",
]  # fmt: skip


def test_get_stats_keeps_its_keys_and_counts_what_the_loop_did():
    scheduler, _, front = make_scheduler()
    assert list(scheduler.get_stats()) == STATS_KEYS
    prefix = list(range(10, 30))
    submit(scheduler, "a", prefix + [3], max_new=5)
    run_until_idle(scheduler, front)
    submit(scheduler, "b", prefix + [4], max_new=5)
    run_until_idle(scheduler, front)
    stats = scheduler.get_stats()
    assert list(stats) == STATS_KEYS[:4] + ["requests"] + STATS_KEYS[4:]
    assert list(stats["histograms"]) == HISTOGRAMS
    assert stats["requests"] == 2 and stats["prompt_tokens"] == 42
    assert stats["generated_tokens"] == 10 and stats["cached_tokens"] == 20
    assert stats["cache_hit_rate"] == 20 / 42
    assert stats["prefix_cache_queries"] == 42 and stats["prefix_cache_hits"] == 20
    assert stats["steps"] == scheduler.stats.steps > 0
    assert stats["histograms"]["iteration_tokens_total"]["sum"] == 42 - 20 + 2 * 4


def test_the_loop_hands_back_freed_heap_once_each_time_it_goes_idle(monkeypatch):
    import radixrt.scheduler.scheduler as scheduler_module

    trims: list[int] = []
    scheduler, runner, front = make_scheduler()
    monkeypatch.setattr(
        scheduler_module, "release_freed_memory", lambda: trims.append(len(runner.batches))
    )
    submit(scheduler, "a", [3, 4, 5], max_new=3)
    # Idle after the request: one trim, then the (watched) loop sees its parent gone and ends.
    scheduler.run_forever(orphaned=lambda: True)
    assert trims == [len(runner.batches)] and len(runner.batches) >= 3
