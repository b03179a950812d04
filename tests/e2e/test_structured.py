"""Structured generation on the default model: sampled outputs always validate, constraints
that already hold leave greedy output alone, jump-forward changes steps but not text, bad
constraints are clear errors, and n > 1, the radix cache and preemption keep outputs valid."""

from __future__ import annotations

import re

import pytest
from structured_cases import CASES, DATE, JSON_CASES, chat

import radixrt

pytestmark = pytest.mark.slow

SEEDS = (0, 1)
MAX_NEW = 192  # every case ends in under ~110 tokens; hitting this limit is a failure
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}


def _engine(**kwargs) -> radixrt.Engine:
    # float32: runs are compared token for token (bfloat16 is not batch-invariant).
    return radixrt.Engine(
        dtype="float32",
        enable_kv_checks=True,
        log_level="warning",
        max_total_tokens=16384,
        **kwargs,
    )


@pytest.fixture(scope="module")
def engine():
    with _engine() as eng:
        yield eng


@pytest.fixture(scope="module")
def plain():
    """Plain masked decoding: jump-forward off."""
    with _engine(disable_jump_forward=True) as eng:
        yield eng


def pool_is_whole(engine) -> bool:
    stats = engine.get_stats(check_kv=True)
    free_or_cached = stats["free_tokens"] + stats["evictable_tokens"]
    return free_or_cached == stats["pool_tokens"] and stats["protected_tokens"] == 0


def assert_valid(case, out) -> None:
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "stop", f"{case.name}: finished by {reason}: {out['text']!r}"
    problem = case.violation(out["text"])
    assert problem is None, f"{case.name}: {problem}"


def test_sampled_outputs_always_validate(engine):
    runs = [(case, seed) for case in CASES for seed in SEEDS]
    assert len(CASES) >= 20
    outs = engine.generate(
        [c.prompt for c, _ in runs],
        [c.params(temperature=1.0, seed=s, max_new_tokens=MAX_NEW) for c, s in runs],
    )
    for (case, _), out in zip(runs, outs, strict=True):
        assert_valid(case, out)
    assert engine.get_stats()["jump_forward_tokens"] > 0
    assert pool_is_whole(engine)


# (question, regex): the model's unconstrained greedy answer is a full match (checked below).
ALREADY_HOLDS = [
    # Jump-forward proposes "he capital of France is " with a trailing space token, where the
    # model writes " Paris": the model's check keeps its own token.
    ("What is the capital of France?", r"The capital of France is [A-Z][a-z]+\."),
    ("What is 2+2?", r"The answer is \d+\."),  # " 4" is no token: " " + "4" as well
    ("Is the sky blue? Answer yes or no.", r"(Yes|No)\."),
]


@pytest.mark.parametrize("which", ["engine", "plain"])
@pytest.mark.parametrize("question,regex", ALREADY_HOLDS)
def test_greedy_output_unchanged_when_the_constraint_already_holds(request, which, question, regex):
    engine = request.getfixturevalue(which)
    free = engine.generate(chat(question), GREEDY)
    assert free["meta_info"]["finish_reason"]["type"] == "stop", "premise: the model stops"
    assert re.fullmatch(regex, free["text"]), f"premise: {free['text']!r} matches {regex!r}"
    constrained = engine.generate(chat(question), {**GREEDY, "regex": regex})
    assert constrained["output_ids"] == free["output_ids"], (
        f"{constrained['text']!r} != {free['text']!r}"
    )


def _greedy_json(engine) -> list[str]:
    outs = engine.generate([c.prompt for c in JSON_CASES], [c.params(**GREEDY) for c in JSON_CASES])
    for case, out in zip(JSON_CASES, outs, strict=True):
        assert_valid(case, out)
    return [o["text"] for o in outs]


def _steps_for_one(engine, case) -> tuple[int, str]:
    before = engine.get_stats()["steps"]
    text = engine.generate(case.prompt, case.params(**GREEDY))["text"]
    return engine.get_stats()["steps"] - before, text


def test_jump_forward_same_text_fewer_steps(engine, plain):
    nested = next(c for c in JSON_CASES if c.name == "nested")
    steps_on, text_on = _steps_for_one(engine, nested)
    steps_off, text_off = _steps_for_one(plain, nested)
    assert text_on == text_off
    assert steps_on < steps_off, f"jump-forward took {steps_on} steps, masked {steps_off}"
    jumped, masked = _greedy_json(engine), _greedy_json(plain)
    assert plain.get_stats()["jump_forward_tokens"] == 0
    assert pool_is_whole(plain)
    differ = {c.name: (a, b) for c, a, b in zip(JSON_CASES, jumped, masked, strict=True) if a != b}
    assert not differ, f"jump-forward != masked decoding: {differ}"


BAD = [
    ({"regex": "(ab"}, "'regex' is not a valid regular expression"),
    ({"regex": "a{3,1}"}, "'regex' is not a valid regular expression"),
    ({"json_schema": "{bad"}, "'json_schema' is not valid JSON"),
    ({"json_schema": "[1]"}, "'json_schema' must be a JSON object"),
    ({"json_schema": {"type": "foo"}}, "'json_schema' is not a valid JSON schema"),
    (
        {"json_schema": {"type": "integer", "minimum": 5, "maximum": 1}},
        "'json_schema' is not a valid JSON schema",
    ),
    ({"ebnf": "root ::= "}, "'ebnf' is not a valid EBNF grammar"),
    ({"ebnf": 'start ::= "a"'}, "'ebnf' is not a valid EBNF grammar"),
    ({"regex": r"\d+", "json_schema": {"type": "integer"}}, "give at most one of the sampling"),
    ({"regex": r"\d+", "ebnf": 'root ::= "a"'}, "give at most one of the sampling"),
]


def test_bad_constraints_raise_and_leave_the_engine_serving(engine):
    good = next(c for c in CASES if c.name == "phone")
    before = engine.generate(good.prompt, good.params(**GREEDY))
    for bad, message in BAD:
        with pytest.raises(ValueError, match=re.escape(message)):
            engine.generate(good.prompt, {**GREEDY, **bad})
        with pytest.raises(ValueError, match=re.escape(message)):
            engine.generate([good.prompt] * 2, [good.params(**GREEDY), {**GREEDY, **bad}])
    ebnf = engine.generate(chat("Say hi."), {**GREEDY, "ebnf": 'root ::= "hi" | "hello"'})
    assert ebnf["text"] in ("hi", "hello")
    after = engine.generate(good.prompt, good.params(**GREEDY))
    assert after["output_ids"] == before["output_ids"]
    assert_valid(good, after)
    assert pool_is_whole(engine)


def test_n_samples_each_validate(engine):
    case = next(c for c in JSON_CASES if c.name == "person")
    outs = engine.generate(
        case.prompt, case.params(n=3, temperature=1.0, seed=5, max_new_tokens=MAX_NEW)
    )
    assert len(outs) == 3
    for out in outs:
        assert_valid(case, out)
    assert pool_is_whole(engine)


def test_radix_cache_hit_keeps_output_valid(engine):
    assert engine.flush_cache()
    case = next(c for c in CASES if c.name == "phone")
    params = case.params(temperature=1.0, seed=3, max_new_tokens=MAX_NEW)
    first = engine.generate(case.prompt, params)
    second = engine.generate(case.prompt, params)
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] > 0
    assert_valid(case, first)
    assert_valid(case, second)
    assert second["output_ids"] == first["output_ids"]  # same seed, same text
    assert pool_is_whole(engine)


def test_preemption_keeps_constrained_outputs_valid(tiny_model_dir):
    # A random tiny model (byte tokens) on a 96-token pool: six requests of ~64 tokens each
    # run out of pages, so decodes are retracted and recomputed with their matchers' state.
    regex = rf"({DATE} ){{3}}{DATE}"  # 43 characters, one token each
    with radixrt.Engine(
        tiny_model_dir("llama"),
        dtype="float32",
        enable_kv_checks=True,
        log_level="warning",
        max_total_tokens=96,
        page_size=1,
        schedule_conservativeness=0.0,
    ) as tiny:
        params = [
            {"regex": regex, "temperature": 1.0, "seed": i, "max_new_tokens": 48} for i in range(6)
        ]
        outs = tiny.generate([f"Four dates, please ({i}):" for i in range(6)], params)
        assert tiny.get_stats()["num_preemptions"] > 0, "the pool never ran short"
        for out in outs:
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out
            assert re.fullmatch(regex, out["text"]), out["text"]
        assert pool_is_whole(tiny)


@pytest.mark.parametrize("page_size,chunk", [(1, 2048), (16, 4)])
def test_jump_forward_equals_masked_decoding_with_pages_and_chunks(
    tiny_model_dir, page_size, chunk
):
    # Pages of 16 make a rejected proposal give back part of a page; chunks of 4 are shorter
    # than most proposals (which are computed in one step anyway). Greedy: token for token the
    # same; sampled: valid (the same distribution, but the seeded noise is drawn per checked
    # row, not per token, so the draws differ).
    regex = r'\{"id": [0-9]{1,4}, "tags": \["[a-z]{1,6}"(, "[a-z]{1,6}"){0,3}\]\}'
    outs = {}
    for off in (False, True):
        with radixrt.Engine(
            tiny_model_dir("llama"),
            dtype="float32",
            enable_kv_checks=True,
            log_level="warning",
            max_total_tokens=2048,
            page_size=page_size,
            chunked_prefill_size=chunk,
            disable_jump_forward=off,
            in_process=True,
        ) as tiny:
            outs[off] = tiny.generate(
                [f"Record {i}:" for i in range(4)],
                [
                    {"regex": regex, "temperature": t, "seed": 7, "max_new_tokens": 80}
                    for t in (0.0, 0.0, 1.0, 1.0)
                ],
            )
            jumped = tiny.get_stats(check_kv=True)["jump_forward_tokens"]
            assert (jumped == 0) == off
    for i, (with_jump, masked) in enumerate(zip(outs[False], outs[True], strict=True)):
        assert re.fullmatch(regex, with_jump["text"]), with_jump["text"]
        assert re.fullmatch(regex, masked["text"]), masked["text"]
        if i < 2:  # greedy: the same tokens (sampled ones draw their noise in other order)
            assert with_jump["output_ids"] == masked["output_ids"]
