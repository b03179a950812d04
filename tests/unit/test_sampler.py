"""Sampler, penalties and logprobs on small hand-made logits (CPU)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from radixrt.executor.logprobs import compute_logprobs
from radixrt.executor.penalties import build_penalties, token_counts
from radixrt.executor.sampler import NO_TOKEN, SamplingBatch, sample
from radixrt.protocol.sampling_params import SamplingParams

V = 16


def params(**kw: object) -> SamplingParams:
    p = SamplingParams.from_dict(kw)
    p.verify(vocab_size=1000)
    return p


def make_batch(
    ps: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
    outputs: list[list[int]] | None = None,
    prompts: list[list[int]] | None = None,
    vocab: int = V,
    eos: tuple[int, ...] = (),
) -> SamplingBatch:
    n = len(ps)
    return SamplingBatch.build(
        ps,
        generators if generators is not None else [None] * n,
        outputs if outputs is not None else [[] for _ in range(n)],
        prompts if prompts is not None else [[] for _ in range(n)],
        vocab,
        "cpu",
        eos_token_ids=eos,
    )


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_logits(rows: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=gen(seed)) * 3


# ---- greedy and filters -------------------------------------------------------------------


def test_greedy_equals_argmax() -> None:
    logits = random_logits(6)
    batch = make_batch([params(temperature=0.0) for _ in range(6)])
    assert batch.all_greedy and batch.penalties is None
    assert torch.equal(sample(logits, batch), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_with_nothing_to_draw_get_no_token(temperature: float) -> None:
    logits = random_logits(4)
    logits[1] = float("-inf")  # everything masked
    logits[2, 7] = float("nan")  # a broken row
    logits[3, :-1] = float("-inf")  # one token left
    batch = make_batch([params(temperature=temperature, seed=1) for _ in range(4)])
    ids = sample(logits, batch).tolist()
    assert ids[1] == ids[2] == NO_TOKEN
    assert ids[3] == V - 1 and ids[0] != NO_TOKEN


def test_mixed_batch_greedy_rows_take_argmax() -> None:
    logits = random_logits(4)
    ps = [params(temperature=0.0), params(), params(top_k=1), params(temperature=2.0)]
    out = sample(logits, make_batch(ps))
    assert out.dtype == torch.int64 and out.shape == (4,)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_top_k_1_equals_greedy() -> None:
    logits = random_logits(8, seed=1)
    batch = make_batch([params(top_k=1, temperature=1.5) for _ in range(8)])
    for _ in range(5):
        assert torch.equal(sample(logits, batch), logits.argmax(-1))


def test_top_k_draws_only_from_the_k_best() -> None:
    logits = torch.zeros(2000, V)  # flat: without the filter every token would appear
    logits[:, 5], logits[:, 9], logits[:, 2] = 0.3, 0.2, 0.1
    batch = make_batch([params(top_k=3)] * 2000, generators=[gen(i) for i in range(2000)])
    assert set(sample(logits, batch).tolist()) == {5, 9, 2}


def test_tiny_top_p_equals_greedy() -> None:
    logits = random_logits(500, seed=2)
    batch = make_batch([params(top_p=1e-6)] * 500, generators=[gen(i) for i in range(500)])
    assert batch.need_top_p
    assert torch.equal(sample(logits, batch), logits.argmax(-1))


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(4000, 4).contiguous()
    batch = make_batch([params(top_p=0.7)] * 4000, generators=[gen(i) for i in range(4000)])
    assert set(sample(logits, batch).tolist()) == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3


def test_min_p_removes_low_tokens() -> None:
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = probs.log().expand(5000, 6).contiguous()
    min_p = 0.3  # threshold 0.12: tokens 3, 4, 5 must never appear
    batch = make_batch([params(min_p=min_p)] * 5000, generators=[gen(i) for i in range(5000)])
    drawn = set(sample(logits, batch).tolist())
    assert drawn == {0, 1, 2}
    # Without min_p the low tokens do appear, so the check above can fail.
    free = make_batch([params()] * 5000, generators=[gen(i) for i in range(5000)])
    assert {3, 4, 5} <= set(sample(logits, free).tolist())


def test_sample_does_not_modify_callers_logits() -> None:
    logits = random_logits(3)
    before = logits.clone()
    ps = [params(repetition_penalty=2.0, logit_bias={"1": 5.0}), params(), params(min_p=0.2)]
    sample(logits, make_batch(ps, outputs=[[1, 2], [3], []], prompts=[[4], [5], [6]]))
    assert torch.equal(logits, before)


# ---- randomness: distribution and seeds ---------------------------------------------------


def chi_square(counts: Counter, probs: torch.Tensor, n: int) -> float:
    expected = probs * n
    observed = torch.tensor([counts.get(i, 0) for i in range(len(probs))], dtype=torch.float32)
    return float(((observed - expected) ** 2 / expected).sum())


def test_temperature_1_matches_softmax_seeded_rows() -> None:
    logits = torch.tensor([0.0, 0.5, 1.0, 2.0])
    probs = torch.softmax(logits, -1)
    n = 4000
    batch = make_batch([params()] * n, generators=[gen(i) for i in range(n)], vocab=4)
    counts = Counter(sample(logits.expand(n, 4).contiguous(), batch).tolist())
    assert chi_square(counts, probs, n) < 16.27  # chi2(df=3) at p = 0.001


def test_temperature_1_matches_softmax_default_generator() -> None:
    logits = torch.tensor([1.0, -1.0, 0.0, 0.7])
    probs = torch.softmax(logits, -1)
    n = 20000
    batch = make_batch([params()] * n, vocab=4)
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        counts = Counter(sample(logits.expand(n, 4).contiguous(), batch).tolist())
    assert chi_square(counts, probs, n) < 16.27


def test_temperature_sharpens() -> None:
    logits = torch.tensor([0.0, 1.0]).expand(4000, 2).contiguous()
    gens = [gen(i) for i in range(4000)]
    hot = sample(logits, make_batch([params(temperature=4.0)] * 4000, gens, vocab=2))
    gens = [gen(i) for i in range(4000)]
    cold = sample(logits, make_batch([params(temperature=0.25)] * 4000, gens, vocab=2))
    assert hot.float().mean() < 0.6 < 0.95 < cold.float().mean()  # p(1) = 0.56 vs 0.98


def draw_sequence(seed: int, others: list[SamplingParams], steps: int = 20) -> list[int]:
    """Tokens of one seeded request (row 0) over `steps` steps, sharing its batch with others."""
    target = params(temperature=1.0, top_p=0.9, seed=seed)
    row_gens = [gen(seed)] + [
        gen(100 + i) if p.seed is not None else None for i, p in enumerate(others)
    ]
    tokens = []
    for step in range(steps):
        logits = random_logits(1 + len(others), vocab=64, seed=step) * 0.3  # nearly flat
        batch = make_batch([target, *others], row_gens, vocab=64)
        tokens.append(int(sample(logits, batch)[0]))
    return tokens


def test_seeded_request_repeats_across_runs_and_batches() -> None:
    alone = draw_sequence(7, [])
    assert draw_sequence(7, []) == alone
    others = [params(), params(temperature=0.0), params(top_k=5, seed=3)]
    with torch.random.fork_rng():
        torch.manual_seed(99)  # the unseeded neighbour draws from the default generator
        assert draw_sequence(7, others) == alone
    assert len(set(alone)) > 5  # really sampled, not stuck on one token


def test_rows_sharing_a_generator_draw_as_consecutive_steps() -> None:
    """A request's draft rows share its generator (scheduler/draft_rows.py): drawn in one
    call they take the tokens one call per row would, even when one row draws among its top
    candidates and the next over its whole row (a 2,000-token vocabulary, top-p)."""
    vocab = 2000
    logits = torch.randn(4, vocab, generator=gen(4))
    logits[1, :3] += 12.0  # top-p keeps a few tokens: drawn among the candidates
    logits[3, :2] += 12.0
    p = params(temperature=1.0, top_p=0.9, seed=11)
    together = sample(logits, make_batch([p] * 4, [gen(11)] * 4, vocab=vocab))
    g = gen(11)
    one_by_one = [
        int(sample(logits[i : i + 1], make_batch([p], [g], vocab=vocab))[0]) for i in range(4)
    ]
    assert together.tolist() == one_by_one


def test_different_seeds_differ() -> None:
    assert draw_sequence(1, []) != draw_sequence(2, [])


# ---- penalties ----------------------------------------------------------------------------


def penalized(
    p: SamplingParams,
    logits: list[float],
    prompt: list[int],
    output: list[int],
    eos: tuple[int, ...] = (),
) -> list[float]:
    state = build_penalties([p], [output], [prompt], len(logits), "cpu", eos)
    assert state is not None
    x = torch.tensor([logits])
    state.apply(x)
    return x[0].tolist()


LOGITS = [1.0, -1.0, 2.0, 0.5, -0.5]


def test_frequency_penalty_exact() -> None:
    got = penalized(params(frequency_penalty=0.5), LOGITS, prompt=[3], output=[0, 0, 1])
    assert got == pytest.approx([0.0, -1.5, 2.0, 0.5, -0.5])  # prompt token 3 untouched


def test_presence_penalty_exact() -> None:
    got = penalized(params(presence_penalty=0.25), LOGITS, prompt=[3], output=[0, 0, 1])
    assert got == pytest.approx([0.75, -1.25, 2.0, 0.5, -0.5])


def test_repetition_penalty_exact() -> None:
    got = penalized(params(repetition_penalty=2.0), LOGITS, prompt=[3], output=[0, 1])
    assert got == pytest.approx([0.5, -2.0, 2.0, 0.25, -0.5])  # prompt counts too


def test_penalties_combined_exact() -> None:
    p = params(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0)
    got = penalized(p, LOGITS, prompt=[3], output=[0, 0, 1])
    # Repetition first (0.5, -2.0, _, 0.25), then -0.5 * count - 0.25 on output tokens.
    assert got == pytest.approx([-0.75, -2.75, 2.0, 0.25, -0.5])


def test_logit_bias_exact() -> None:
    got = penalized(params(logit_bias={"2": -3.0, "4": 1.5}), LOGITS, prompt=[], output=[])
    assert got == pytest.approx([1.0, -1.0, -1.0, 0.5, 1.0])


def test_min_new_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.tensor([[0.0, 0.0, 9.0, 8.0, 1.0]]).expand(2, 5).contiguous()
    p = params(min_new_tokens=3, stop_token_ids=[3], temperature=0.0)
    batch = make_batch([p, p], outputs=[[0, 1], [0, 1, 4]], eos=(2,), vocab=5)
    # Row 0 has 2 < 3 output tokens: EOS (2) and stop id 3 are banned; row 1 is free.
    assert sample(logits, batch).tolist() == [4, 2]


def test_no_penalty_state_when_unused() -> None:
    assert build_penalties([params(), params(top_k=3)], [[1], [2]], [[3], [4]], V, "cpu") is None
    state = build_penalties(
        [params(), params(presence_penalty=1.0)], [[1], [2]], [[3], [4]], V, "cpu"
    )
    assert state is not None and state.seen is None and state.mask_rows is None


def test_token_counts_ragged() -> None:
    counts = token_counts([[1, 1, 3], [], [0]], 4, "cpu")
    assert counts.tolist() == [[0, 2, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]]


# ---- logprobs -----------------------------------------------------------------------------


def test_logprobs_match_log_softmax_and_top_k_sorted() -> None:
    logits = random_logits(5, seed=3)
    tokens = torch.tensor([0, 3, 7, 15, 2])
    res = compute_logprobs(logits, tokens, top_k=4)
    ref = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(res.token_logprobs, ref[torch.arange(5), tokens])
    assert res.top_values.shape == (5, 4) and res.top_indices.dtype == torch.int64
    assert torch.all(res.top_values[:, :-1] >= res.top_values[:, 1:])
    assert torch.equal(res.top_indices[:, 0], logits.argmax(-1))
    assert torch.allclose(res.top_values, ref.gather(1, res.top_indices))
    assert torch.allclose(res.all_logprobs, ref)
    token_logprobs, top_values, top_indices, _ = compute_logprobs(logits, tokens, top_k=0)
    assert top_values.shape == (5, 0) and token_logprobs.dtype == torch.float32


@pytest.mark.parametrize(
    "params",
    [
        dict(top_k=64),
        dict(top_k=1024),
        dict(top_p=0.9),
        dict(top_p=0.5, top_k=200),
        dict(min_p=0.05),
        dict(top_p=0.95, min_p=0.01),
        dict(top_p=0.999999),  # more mass than the candidates hold: the whole row is sorted
        dict(top_k=2000),  # more than the candidates and not all: sorted
        dict(),  # no filter: sorted
    ],
)
def test_candidates_keep_what_filter_probs_keeps(params):
    """A large vocabulary's rows drawn among their top candidates keep exactly the tokens and
    probabilities that the whole-row filters keep; where they cannot tell, they step aside."""
    from radixrt.executor.sampler import CANDIDATES, filter_probs, filtered_candidates

    torch.manual_seed(0)
    vocab = 50_000
    logits = torch.randn(3, vocab) * 6  # peaked: top-p 0.9 ends within the top 1024
    rows = [SamplingParams(temperature=0.8, **params), SamplingParams(temperature=0.0)]
    rows.append(SamplingParams(temperature=1.3, **params))
    batch = SamplingBatch.build(rows, [None] * 3, [[]] * 3, [[]] * 3, vocab, "cpu")
    probs = torch.softmax(logits / batch.temperatures, dim=-1)
    whole = filter_probs(probs, batch)
    candidates = filtered_candidates(probs, batch)
    if candidates is None:
        assert not params
        return
    values, ids, covered = candidates
    scattered = torch.zeros_like(probs).scatter_(1, ids, values)
    for i in (0, 2):  # the sampled rows (row 1 is greedy)
        kept = int((whole[i] > 0).sum())
        if not covered[i]:  # it keeps more, or cannot tell: the row is sorted whole
            assert kept > CANDIDATES or params.get("top_k") == 2000
            continue
        assert kept <= CANDIDATES
        assert torch.equal(scattered[i] > 0, whole[i] > 0)
        torch.testing.assert_close(scattered[i], whole[i], rtol=0, atol=1e-7)
