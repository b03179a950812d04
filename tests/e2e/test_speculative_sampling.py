"""Sampling with speculation keeps the model's distribution: on a tiny model (320 tokens),
many unseeded samples with and without drafts agree by a chi-squared test, and the same test
rejects a biased acceptance rule (every draft kept), so it has the power to catch one."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

import radixrt
import radixrt.scheduler.output as output
import radixrt.scheduler.speculation as speculation

SAMPLES = 400
NEW = 6
LEVEL = 0.001  # the test's significance level; the runs are seeded, so it never flakes
CATEGORIES = 8  # the 7 tokens most often seen at the position, and all others


def _samples(path: str, spec: bool, patch: pytest.MonkeyPatch) -> list[list[int]]:
    patch.setattr(speculation, "draft_size", lambda cost, rate, limit, batch: limit)
    kwargs = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 5} if spec else {}
    engine = radixrt.Engine(
        model_path=path,
        dtype="float32",
        in_process=True,
        enable_kv_checks=True,
        skip_tokenizer_init=True,
        log_level="warning",
        **kwargs,
    )
    try:
        # A prompt whose tokens repeat (8 distinct): every step finds something to draft.
        rng = random.Random(3)
        prompt = [rng.randrange(40, 48) for _ in range(60)]
        params = {"temperature": 1.3, "max_new_tokens": NEW, "ignore_eos": True}
        outs = engine.generate(input_ids=[prompt] * SAMPLES, sampling_params=params)
        if spec:
            assert engine.get_stats(check_kv=True)["spec_draft_tokens"] > SAMPLES
        return [o["output_ids"] for o in outs]
    finally:
        engine.shutdown()


def _p_value(a: list[int], b: list[int]) -> float:
    """Two-sample chi-squared test of homogeneity on the tokens a and b, in CATEGORIES
    categories; the p-value by the Wilson-Hilferty approximation of the chi-squared tail."""
    top = [t for t, _ in Counter(a + b).most_common(CATEGORIES - 1)]

    def table(xs):
        return [sum(x == t for x in xs) for t in top] + [sum(x not in top for x in xs)]

    rows = [table(a), table(b)]
    total = len(a) + len(b)
    stat = 0.0
    for j in range(CATEGORIES):
        column = rows[0][j] + rows[1][j]
        for row, n in zip(rows, (len(a), len(b)), strict=True):
            expected = n * column / total
            if expected > 0:
                stat += (row[j] - expected) ** 2 / expected
    df = CATEGORIES - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.fixture(scope="module")
def model_path(tiny_model_dir) -> str:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def plain(model_path) -> list[list[int]]:
    with pytest.MonkeyPatch.context() as patch:
        return _samples(model_path, False, patch)


def test_speculative_samples_follow_the_models_distribution(model_path, plain):
    with pytest.MonkeyPatch.context() as patch:
        spec = _samples(model_path, True, patch)
    for position in range(1, NEW):  # the first token comes from the prompt, without drafts
        p = _p_value([o[position] for o in plain], [o[position] for o in spec])
        assert p > LEVEL, (position, p)


def test_the_test_catches_a_biased_acceptance_rule(model_path, plain):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(output, "kept_drafts", lambda picks, drafts: len(drafts))
        biased = _samples(model_path, True, patch)
    p = min(
        _p_value([o[position] for o in plain], [o[position] for o in biased])
        for position in range(1, NEW)
    )
    assert p < LEVEL, p
