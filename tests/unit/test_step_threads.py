"""The per-step thread choice (radixrt/executor/step_threads.py), driven by simulated step times:
it must settle on the faster count, come back when the load changes, and keep the time spent
re-trying a much slower count to a few percent."""

from __future__ import annotations

import torch

from radixrt.executor.step_threads import MAX_RETRY, StepThreads


def run(policy: StepThreads, steps: int, cost: dict[int, float], tokens: int = 1) -> list[int]:
    """Drive `steps` steps whose time is cost[threads]; the thread counts chosen."""
    chosen = []
    for _ in range(steps):
        n = policy.choose(tokens)
        policy.record(tokens, n, cost[n])
        chosen.append(n)
    return chosen


QUIET = {1: 0.040, 2: 0.022}  # all threads faster
BUSY = {1: 0.045, 2: 0.900}  # another process holds a core: one thread 20x faster


def test_settles_on_the_faster_count_and_keeps_retries_rare():
    policy = StepThreads(2)
    quiet = run(policy, 2000, QUIET)
    assert quiet[-100:].count(2) >= 95
    busy = run(policy, 4000, BUSY)
    assert busy[-1000:].count(1) >= 998
    wasted = busy.count(2) * BUSY[2]
    assert wasted / (len(busy) * BUSY[1]) < 0.10  # time lost to retries, after a change


def test_comes_back_when_the_load_goes_away():
    policy = StepThreads(2)
    run(policy, 5000, BUSY)  # the retries have backed off to their longest interval
    back = run(policy, MAX_RETRY + 50, QUIET)
    assert back[-40:].count(2) >= 38


def test_step_sizes_are_timed_apart():
    policy = StepThreads(4)
    run(policy, 300, {1: 0.01, 4: 0.05}, tokens=1)
    run(policy, 300, {1: 0.50, 4: 0.10}, tokens=16)
    assert policy.choose(1) == 1 and policy.choose(16) == 4


def test_one_thread_available_means_one():
    policy = StepThreads(1)
    assert run(policy, 10, {1: 0.01}) == [1] * 10


def test_the_model_runner_restores_the_thread_count_after_each_step(monkeypatch):
    from radixrt.executor.model_runner import ModelRunner

    class Step:
        input_ids = [5]

    runner = ModelRunner.__new__(ModelRunner)
    runner.step_threads = StepThreads(2)
    seen = []
    monkeypatch.setattr(runner, "_forward", lambda step: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for _ in range(3):
            runner.forward(Step())  # type: ignore[arg-type]
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert sorted(set(seen)) == [1, 2]  # the first two steps try each count
