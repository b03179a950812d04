"""The grammar backend and jump-forward proposals on the default model's tokenizer, with real
xgrammar matchers: the forced text is proposed as the tokenizer would write it, the matcher
stays in the state the tokens imply, `room` caps the proposal, the compile cache reuses and
retries, and the scheduler's mask (StructuredGeneration.mask) masks exactly the forbidden
tokens of the constrained rows. (That the model's check of a proposal keeps the output equal
to masked decoding is tested end to end in tests/e2e/test_structured.py.)"""

from __future__ import annotations

import pytest
import torch

from radixrt.grammar.backend import GrammarBackend
from radixrt.grammar.jump_forward import propose

VOCAB = 49152  # SmolLM2's


@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


@pytest.fixture(scope="module")
def backend(tokenizer):
    b = GrammarBackend(tokenizer, VOCAB)
    yield b
    b.close()


def matcher_for(backend, regex: str):
    return backend.matcher(backend.compile("regex", regex).result(timeout=30))


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def fed(backend, regex: str, ids: list[int]):
    """A fresh matcher that accepted `ids` (each must be accepted)."""
    m = matcher_for(backend, regex)
    for t in ids:
        assert m.accept_token(t), f"token {t} refused"
    return m


def assert_same_state(backend, regex: str, used, ids: list[int]) -> None:
    """`used` is in the state a fresh matcher reaches on `ids`: same forced text, same mask."""
    fresh = fed(backend, regex, ids)
    assert used.find_jump_forward_string() == fresh.find_jump_forward_string()
    masks = backend.xgr.allocate_token_bitmask(2, VOCAB)
    used.fill_next_token_bitmask(masks, 0)
    fresh.fill_next_token_bitmask(masks, 1)
    assert torch.equal(masks[0], masks[1])


def finish(tokenizer, matcher, text: str) -> None:
    for t in ids_of(tokenizer, text):
        assert matcher.accept_token(t), f"continuation token {tokenizer.decode([t])!r} refused"
    assert matcher.accept_token(tokenizer.eos_token_id) and matcher.is_terminated()


def test_forced_text_is_proposed_and_the_matcher_follows(tokenizer, backend):
    regex = r"The capital of France is [A-Z][a-z]+\."
    ids = ids_of(tokenizer, "The")
    m = fed(backend, regex, ids)
    proposal = propose(m, tokenizer, room=64)
    assert proposal == ids_of(tokenizer, " capital of France is ")  # the tokenizer's own
    ids += proposal
    assert tokenizer.decode(ids) == "The capital of France is "
    assert_same_state(backend, regex, m, ids)
    finish(tokenizer, m, "Paris.")


def test_the_sampled_token_is_never_merged_into_the_proposal(tokenizer, backend):
    # "{" was sampled; the tokenizer would write '{"name": ' with another first token, but the
    # model chose "{": the proposal continues after it, and the model checks the rest.
    regex = r'\{"name": [0-9]{1,3}\}'
    ids = ids_of(tokenizer, "{")
    assert ids_of(tokenizer, '{"name": ')[0] != ids[0], "premise: the tokenizer would merge"
    m = fed(backend, regex, ids)
    proposal = propose(m, tokenizer, room=64)
    assert proposal == ids_of(tokenizer, '"name": ')
    assert tokenizer.decode(ids + proposal) == '{"name": '
    assert_same_state(backend, regex, m, ids + proposal)
    finish(tokenizer, m, "42}")


def test_room_caps_the_proposal(tokenizer, backend):
    regex = r"The capital of France is [A-Z][a-z]+\."
    start = ids_of(tokenizer, "The")
    full = propose(fed(backend, regex, start), tokenizer, room=64)
    for room in (0, 1, 2):
        m = fed(backend, regex, start)
        proposal = propose(m, tokenizer, room=room)
        assert proposal == full[:room]
        assert_same_state(backend, regex, m, start + proposal)
        rest = m.find_jump_forward_string()
        assert tokenizer.decode(start + proposal) + rest == "The capital of France is "
        finish(tokenizer, m, rest + "Paris.")


def test_nothing_forced_proposes_nothing(tokenizer, backend):
    ids = ids_of(tokenizer, "ab")
    assert propose(fed(backend, r"[a-z]+", ids), tokenizer, room=8) == []


def test_compile_cache_reuses_by_text_and_retries_failures(backend):
    first = backend.compile("regex", r"[0-9]+")
    assert backend.compile("regex", r"[0-9]+") is first
    assert backend.compile("ebnf", r"[0-9]+") is not first  # the kind is part of the key
    bad = backend.compile("regex", "(unclosed")
    with pytest.raises(Exception):  # noqa: B017 - xgrammar's own error type
        bad.result(timeout=30)
    again = backend.compile("regex", "(unclosed")
    assert again is not bad  # a failed compile is not cached
    with pytest.raises(Exception):  # noqa: B017
        again.result(timeout=30)


def test_the_scheduler_masks_exactly_the_forbidden_tokens_of_constrained_rows(tokenizer):
    from radixrt.protocol.sampling_params import SamplingParams
    from radixrt.scheduler.req import GrammarState, Req
    from radixrt.scheduler.structured import StructuredGeneration

    structured = StructuredGeneration(tokenizer, VOCAB, [], compile_timeout_s=30)
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    original = logits.clone()
    reqs = [Req(f"r{i}", [1], SamplingParams()) for i in range(3)]
    for req, regex in ((reqs[0], r"[0-9]"), (reqs[2], r"(Yes|No)")):
        req.grammar = GrammarState("regex", matcher_for(structured.backend, regex))

    def guard(req, doing, fn, *args):
        fn(*args)
        return True

    structured.mask(reqs, [0, 0, 0], logits, guard)
    assert torch.equal(logits[1], original[1])  # an unconstrained row is untouched
    for row, ok in (
        (0, lambda s: len(s) == 1 and s.isdigit()),
        (2, lambda s: s and ("Yes".startswith(s) or "No".startswith(s))),
    ):
        kept = torch.isfinite(logits[row])
        assert torch.equal(logits[row][kept], original[row][kept])
        assert torch.all(logits[row][~kept] == float("-inf"))
        allowed = kept.nonzero().flatten().tolist()
        texts = [tokenizer.decode([t]) for t in allowed]
        assert allowed and all(ok(s) for s in texts), texts
    assert {tokenizer.decode([t]) for t in kept_ids(logits[0])} == set("0123456789")


def kept_ids(row: torch.Tensor) -> list[int]:
    return torch.isfinite(row).nonzero().flatten().tolist()
