"""Speculative decoding (NGRAM) changes nothing but the speed: on the default model in float32,
greedy and seeded outputs, logprobs, stops, grammars and n > 1 equal those of an engine
without it; drafts are made and verified; the pool is whole afterwards."""

from __future__ import annotations

import json

import pytest

import radixrt
import radixrt.scheduler.speculation as speculation

CODE = "\n".join(f"def step_{i}(value):\n    return value * {i} + {3 * i}\n" for i in range(8))
PROMPTS = [
    f"Copy this code exactly, then stop:\n{CODE}",
    "Repeat after me three times: the quick brown fox jumps over the lazy dog.",
    "List the numbers from 1 to 30, separated by commas:",
]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _engine(**kwargs) -> radixrt.Engine:
    return radixrt.Engine(
        dtype="float32",
        enable_kv_checks=True,
        log_level="warning",
        in_process=True,
        max_total_tokens=16384,
        **kwargs,
    )


@pytest.fixture(scope="module")
def engines():
    """(without, with speculation); the second drafts as deep as it may at every step (the
    adaptive depth is tested in tests/unit/test_speculative_drafts.py), so that every step
    verifies drafts and many are rejected."""
    patch = pytest.MonkeyPatch()
    patch.setattr(speculation, "draft_size", lambda cost, rate, limit, batch: limit)
    plain = _engine()
    spec = _engine(speculative_algorithm="NGRAM", speculative_num_draft_tokens=6)
    yield plain, spec
    for engine in (plain, spec):
        engine.shutdown()
    patch.undo()


def _both(engines, prompts, params, **kwargs):
    return [engine.generate(prompts, params, **kwargs) for engine in engines]


def _ids(outs):
    return [o["output_ids"] for o in outs]


def test_greedy_output_is_the_same_and_drafts_are_kept(engines):
    params = {"temperature": 0, "max_new_tokens": 64}
    plain, spec = _both(engines, PROMPTS, params)
    assert _ids(spec) == _ids(plain)
    meta = spec[0]["meta_info"]
    assert meta["spec_num_correct_drafts"] > 30, meta  # the code is copied
    assert meta["spec_accept_length"] > 2.0, meta
    assert meta["spec_verify_ct"] < meta["completion_tokens"]
    assert "spec_verify_ct" not in plain[0]["meta_info"]
    stats = engines[1].get_stats(check_kv=True)
    assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]  # some were rejected
    assert stats["histograms"]["spec_accept_length"]["sum"] > 0


def test_seeded_sampling_and_n_are_the_same(engines):
    params = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 7, "max_new_tokens": 40}
    plain, spec = _both(engines, PROMPTS[:2], {**params, "n": 2})
    assert _ids(spec) == _ids(plain)
    penalized = {**params, "repetition_penalty": 1.2, "frequency_penalty": 0.3}
    plain, spec = _both(engines, PROMPTS[:1], penalized)
    assert _ids(spec) == _ids(plain)
    assert spec[0]["meta_info"]["spec_num_proposed_drafts"] > 0


def test_logprobs_are_the_models(engines):
    params = {"temperature": 0, "max_new_tokens": 40}
    kwargs = dict(return_logprob=True, top_logprobs_num=3)
    plain, spec = _both(engines, PROMPTS[:1], params, **kwargs)
    assert _ids(spec) == _ids(plain)
    ours, theirs = (o[0]["meta_info"] for o in (spec, plain))
    assert ours["spec_num_correct_drafts"] > 10
    assert len(ours["output_token_logprobs"]) == len(theirs["output_token_logprobs"]) == 40
    for a, b in zip(ours["output_token_logprobs"], theirs["output_token_logprobs"], strict=True):
        assert a[1] == b[1] and a[0] == pytest.approx(b[0], abs=1e-4)
    for a, b in zip(ours["output_top_logprobs"], theirs["output_top_logprobs"], strict=True):
        assert [t[1] for t in a] == [t[1] for t in b]


def test_stops_inside_an_accepted_run_end_it_there(engines):
    greedy = {"temperature": 0, "max_new_tokens": 80}
    full = engines[0].generate(PROMPTS[0], greedy)
    assert full["text"].count("step_") >= 3, full["text"]
    stop = "step_" + full["text"].split("step_")[2][:2]  # the second function's name
    for params in (
        {**greedy, "stop": stop},
        {**greedy, "stop_token_ids": [full["output_ids"][30]]},
        {**greedy, "max_new_tokens": 37},
        {
            **greedy,
            "max_new_tokens": 37,
            "min_new_tokens": 30,
            "stop_token_ids": [full["output_ids"][5]],
        },
        {**greedy, "stop_regex": r"return value \* \d+ \+ \d+\n\ndef"},
    ):
        plain, spec = _both(engines, PROMPTS[0], params)
        assert spec["output_ids"] == plain["output_ids"], params
        assert spec["text"] == plain["text"]
        assert spec["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
    assert len(spec["output_ids"]) < 80


def test_a_grammar_masks_every_draft_row(engines):
    prompt = "Give the name and age of a person as JSON. Name: Ada Lovelace, age 36."
    params = {"temperature": 0, "max_new_tokens": 60, "json_schema": json.dumps(PERSON)}
    plain, spec = _both(engines, [prompt, PROMPTS[1]], params)
    assert _ids(spec) == _ids(plain)
    for out in spec:
        assert set(json.loads(out["text"])) == {"name", "age"}


def test_streams_show_only_verified_tokens(engines):
    params = {"temperature": 0, "max_new_tokens": 64}
    whole = engines[1].generate(PROMPTS[0], params)
    chunks = list(engines[1].generate(PROMPTS[0], params, stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    stats = engines[1].get_stats(check_kv=True)
    assert stats["free_tokens"] + stats["evictable_tokens"] == stats["pool_tokens"]


def test_the_radix_cache_drafts_a_repeated_request(engines):
    spec = engines[1]
    params = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    prompt = "Tell me a short story about a lighthouse keeper."
    first = spec.generate(prompt, params)
    again = spec.generate(prompt, params)
    assert again["output_ids"] == first["output_ids"]
    # The whole first answer is a cached branch: the second run drafts all of it from there.
    assert again["meta_info"]["spec_accept_length"] > 4.0, again["meta_info"]


def test_a_dsl_program_says_the_same(engines):
    import radixrt.lang as rt

    @rt.function
    def rewrite(s, code):
        s += rt.user("Copy this code exactly:\n" + code)
        s += rt.assistant(rt.gen("copy", max_tokens=48))
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += rt.user(f"Now copy it once more, version {i}.")
            f += rt.assistant(rt.gen("again", max_tokens=24))
        s += "Done: " + rt.select("verdict", choices=["yes", "no"])
        return [f["again"] for f in forks]

    results = []
    accepted_before = engines[1].get_stats()["spec_accepted_tokens"]
    for engine in engines:
        state = rewrite.run(code=CODE[:200], temperature=0, backend=rt.EngineBackend(engine))
        results.append((state["copy"], state.ret_value, state["verdict"]))
    assert results[1] == results[0]
    assert engines[1].get_stats()["spec_accepted_tokens"] > accepted_before
