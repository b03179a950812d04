"""Where drafts come from and how deep they go: prompt lookup, the radix cache's continuation,
the acceptance estimate, the step-cost fit and the draft length it allows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.radix_cache import RadixCache
from radixrt.speculative.adaptive import PRIOR_JUMP, Acceptance, StepCost, draft_length
from radixrt.speculative.ngram import TokenHistory, prompt_lookup


def lookup(tokens: list[int], low: int = 1, high: int = 12, limit: int = 5) -> list[int]:
    return prompt_lookup(np.array(tokens, dtype=np.int64), low, high, limit).draft


def test_the_longest_tail_wins_then_the_latest_occurrence():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [1, 2, 3, 9, 7, 2, 3, 8, 6, 5, 1, 2, 3]
    assert lookup(tokens) == [9, 7, 2, 3, 8]  # "1 2 3" at 0 beats "2 3" at 5, nearer
    assert lookup([4, 2, 3, 8, 5, 2, 3, 6, 7, 2, 3]) == [6, 7, 2, 3, 6]  # latest "2 3", on
    assert lookup(tokens, limit=2) == [9, 7]
    assert lookup(tokens, low=4) == []  # "1 2 3" is the longest tail that occurred
    assert lookup([5, 6, 7]) == []
    assert lookup([7, 7, 7, 7], high=2) == [7] * 5  # a loop: the draft goes on with it
    assert lookup([1, 2, 3, 1, 2, 3], limit=7) == [1, 2, 3, 1, 2, 3, 1]
    assert lookup(tokens, limit=0) == []
    assert prompt_lookup(np.array(tokens), 1, 12, 5).matched == 3
    assert prompt_lookup(np.array(tokens), 1, 2, 5).matched == 2


def test_lookup_windows_bound_the_match():
    tokens = [4, 1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3]
    assert lookup(tokens, high=2) == [8, 1, 2, 3, 8]  # "2 3": its latest occurrence
    assert lookup(tokens, high=3) == [9, 5, 2, 3, 8]  # "1 2 3"


def test_history_grows_and_is_cut():
    history = TokenHistory([1, 2])
    history.extend(list(range(100)))
    assert len(history) == 102 and history.tokens[-1] == 99
    history.truncate(3)
    assert history.tokens.tolist() == [1, 2, 0]
    with pytest.raises(AssertionError):
        history.truncate(4)


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_radix_cache_continues_a_cached_path(page_size):
    cache = RadixCache(PageAllocator(256, page_size))
    a = list(range(10, 26))
    b = a[:8] + list(range(50, 58))
    cache.insert(a, torch.arange(16))
    cache.insert(b, torch.arange(100, 116))
    cache.match_prefix(b)  # b is now the most recently used branch
    root = cache.root
    assert cache.continuation(root, a[:5], 3) == a[5:8]  # inside an edge
    assert cache.continuation(root, a[:5], 4) == a[5:8] + b[8:9]  # on down the latest branch
    assert cache.continuation(root, a[:8], 3) == b[8:11]  # at the fork: the latest branch
    assert cache.continuation(root, a[:10], 20) == a[10:]  # to the end of the path
    assert cache.continuation(root, a[:4] + [99], 4) == []  # not a cached path
    assert cache.continuation(root, a, 4) == []  # nothing after it
    node = cache.match_prefix(a[:8]).last_node
    assert cache.continuation(node, a[8:10], 2) == a[10:12]  # from a node held
    assert cache.evictable_size() == 24  # reading changed nothing


def test_acceptance_follows_the_text_within_a_few_verifications():
    acc = Acceptance()
    assert acc.rate == pytest.approx(0.3)
    for _ in range(10):
        acc.record(11, 11)  # a copied run: every draft kept
    assert acc.rate > 0.85
    rates = []
    for _ in range(3):
        acc.record(11, 0)  # the copy ended: the first draft is rejected
        rates.append(acc.rate)
    assert rates[0] < 0.65 and rates[-1] < 0.35  # shallow drafts within three steps
    acc.record(0, 0)  # no draft, no trial
    assert acc.rate == rates[-1]
    for _ in range(30):
        acc.record(4, 2)  # kept 2 of 4: the next one has a 2 in 3 chance
    assert acc.rate == pytest.approx(2 / 3, abs=0.01)


def test_the_cost_fit_finds_the_line_and_sizes_drafts_by_batch():
    cost = StepCost()
    assert cost.threshold(1) == pytest.approx(0.07)  # the prior before any step
    for n in [1, 5, 9, 2, 12, 7] * 20:
        cost.record(n, 0.010 + 0.001 * n)
    a, b, jump = cost.fit()
    assert a == pytest.approx(0.010, rel=0.05) and b == pytest.approx(0.001, rel=0.05)
    # These steps cost nothing extra for verifying: what is left is the prior's pull (its 4
    # pseudo-steps against ~46 decayed real ones), a fifth of the prior's jump at most.
    assert jump < 0.2 * PRIOR_JUMP * 0.011
    assert cost.threshold(1) < cost.threshold(16) < cost.threshold(128) < 1
    assert draft_length(0.9, cost.threshold(1), 11) == 11  # 0.9^11 = 0.31 > 0.09
    assert draft_length(0.9, cost.threshold(16), 11) == 4  # 0.9^i > 0.61
    assert draft_length(0.5, cost.threshold(128), 11) == 0
    assert draft_length(1.0, 0.5, 7) == 7 and draft_length(0.0, 0.0, 7) == 0


def test_the_cost_fit_finds_the_jump_and_weak_drafts_do_not_pay_for_it():
    # A Xeon-like step: 10 ms to decode, 3 ms more to verify at all, 1 ms per drafted token.
    cost = StepCost()
    for n in [1, 1, 2, 5, 1, 9, 3, 12] * 20:
        cost.record(n, 0.010 + (0.003 + 0.001 * (n - 1) if n > 1 else 0.0))
    a, b, jump = cost.fit()
    assert jump == pytest.approx(0.003, rel=0.1) and b == pytest.approx(0.001, rel=0.1)
    # One token kept with chance 0.3 is worth 3 ms of a 10 ms step, less than its 3 + 1 ms.
    assert draft_length(0.3, cost.threshold(1), 11) == 1 and not cost.pays(0.3, 1, 1)
    assert cost.pays(0.6, draft_length(0.6, cost.threshold(1), 11), 1)  # 4 tokens, ~1.3 kept


def test_steps_of_one_size_keep_the_priors_slope():
    cost = StepCost()
    for _ in range(500):
        cost.record(16, 0.030)
    a, b, _ = cost.fit()
    assert b > 0 and a > 0  # the slope does not collapse to 0 (which would draft anything)
    assert cost.threshold(16) > 0.3


def test_one_time_costs_do_not_set_the_jump():
    # A first step (and a first verification) pays one-time costs (oneDNN builds kernels per
    # row count): the prior follows the fastest step and an outlier counts 3x the fit at most,
    # so one slow step cannot make drafts look too dear ever to be tried (and measured) again.
    cost = StepCost()
    cost.record(1, 0.050)  # 10x a normal decode
    for _ in range(30):
        cost.record(1, 0.005)
    a, _, jump = cost.fit()
    assert a < 0.01 and jump < 0.4 * PRIOR_JUMP * 0.050  # not the prior of a 50 ms unit
    cost.record(2, 0.200, drafted=True)  # 40x: counted as 3x what the fit expects
    assert cost.fit().jump < 1.5 * 0.005  # unclamped, this one step would make it 0.09
    assert cost.pays(0.9, 8, 1)  # a copied run is still worth verifying
