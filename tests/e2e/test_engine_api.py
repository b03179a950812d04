"""The offline Engine's API on the default model: sampling, stops, n > 1, streaming, async,
abort, flush, and bad input that raises a clear error and leaves the engine serving."""

from __future__ import annotations

import asyncio

import pytest

import radixrt

PROMPT = "Once upon a time, in a small village by the sea, there lived"


@pytest.fixture(scope="module")
def engine():
    # float32: bfloat16 (the CPU default) rounds differently with batch shape and cache hits,
    # and these tests compare runs token for token.
    eng = radixrt.Engine(
        dtype="float32", enable_kv_checks=True, log_level="warning", max_total_tokens=16384
    )
    yield eng
    eng.shutdown()


def pool_is_whole(engine) -> bool:
    """With nothing running, every page is free or cached-and-evictable (and the scheduler's
    own accounting check passes)."""
    stats = engine.get_stats(check_kv=True)
    free_or_cached = stats["free_tokens"] + stats["evictable_tokens"]
    return free_or_cached == stats["pool_tokens"] and stats["protected_tokens"] == 0


def test_seeded_sampling_repeats_exactly(engine):
    params = {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "max_new_tokens": 24}
    first = engine.generate(PROMPT, params)["output_ids"]
    again = engine.generate(PROMPT, params)["output_ids"]
    batch = engine.generate(
        ["Hello there", PROMPT, "1 2 3"], [{"max_new_tokens": 5}, params, {"max_new_tokens": 9}]
    )
    assert first == again == batch[1]["output_ids"]
    other = engine.generate(PROMPT, {**params, "seed": 99})["output_ids"]
    assert other != first


def test_stop_string_cuts_text_and_is_never_streamed(engine):
    greedy = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    full = engine.generate(PROMPT, greedy)["text"]
    stop = full[10:14]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    out = engine.generate(PROMPT, {**greedy, "stop": stop})
    assert out["text"] == full[: full.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    chunks = [c["text"] for c in engine.generate(PROMPT, {**greedy, "stop": [stop]}, stream=True)]
    assert "".join(chunks) == out["text"] and len(chunks) > 1
    kept = engine.generate(PROMPT, {**greedy, "stop": stop, "no_stop_trim": True})
    assert kept["text"] == full[: full.index(stop) + len(stop)]


def test_stop_token_ids_and_length(engine):
    greedy = {"temperature": 0, "max_new_tokens": 12}
    ids = engine.generate(PROMPT, greedy)["output_ids"]
    out = engine.generate(PROMPT, {**greedy, "stop_token_ids": [ids[3]]})
    first = ids.index(ids[3])
    assert out["output_ids"] == ids[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[3]}
    assert engine.generate(PROMPT, greedy)["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 12,
    }


def test_n_samples_share_the_prompt(engine):
    engine.flush_cache()
    outs = engine.generate(PROMPT, {"n": 3, "temperature": 0.8, "seed": 7, "max_new_tokens": 8})
    assert len(outs) == 3
    prompt_tokens = outs[0]["meta_info"]["prompt_tokens"]
    cached = sorted(o["meta_info"]["cached_tokens"] for o in outs)
    assert cached == [0, prompt_tokens - 1, prompt_tokens - 1]
    assert len({tuple(o["output_ids"]) for o in outs}) > 1


def test_repeated_prompt_is_a_cache_hit_and_flush_empties(engine):
    engine.generate(PROMPT, {"max_new_tokens": 2})
    out = engine.generate(PROMPT, {"max_new_tokens": 2})
    assert out["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
    assert engine.flush_cache() is True
    out = engine.generate(PROMPT, {"max_new_tokens": 2})
    assert out["meta_info"]["cached_tokens"] == 0


def test_stream_concatenates_to_the_whole_text(engine):
    params = {"temperature": 0, "max_new_tokens": 20}
    whole = engine.generate(PROMPT, params)
    chunks = list(engine.generate(PROMPT, params, stream=True))
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert sum((c["output_ids"] for c in chunks), []) == whole["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_async_generate_and_async_stream(engine):
    params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    engine.flush_cache()
    whole = engine.generate(PROMPT, params)

    async def run():
        engine.flush_cache()
        one = await engine.async_generate(PROMPT, params)
        engine.flush_cache()
        stream = await engine.async_generate(PROMPT, params, stream=True)
        text = "".join([c["text"] async for c in stream])
        both = await asyncio.gather(
            engine.async_generate(PROMPT, params), engine.async_generate("Count: 1, 2,", params)
        )
        return one, both, text

    one, both, text = asyncio.run(run())
    assert one["output_ids"] == whole["output_ids"]
    assert text == whole["text"]
    assert [len(b["output_ids"]) for b in both] == [10, 10]


def test_abandoned_stream_aborts_and_returns_kv(engine):
    stream = engine.generate(PROMPT, {"max_new_tokens": 200, "ignore_eos": True}, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    engine.generate("ok", {"max_new_tokens": 1})  # a step after the abort was handled
    assert pool_is_whole(engine)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(prompt=""), "empty"),
        (dict(input_ids=[1] * 9000), "context_length"),
        (
            dict(input_ids=[1] * 8000, sampling_params={"max_new_tokens": 500}),
            "max_new_tokens to at most 192",
        ),
        (dict(prompt="hi", sampling_params={"max_new_tokens": -1}), "max_new_tokens"),
        (dict(prompt="hi", sampling_params={"temperature": -0.5}), "temperature"),
        (dict(prompt="hi", sampling_params={"top_p": 0}), "top_p"),
        (dict(prompt="hi", sampling_params={"max_new_tokens": 10**9}), "max_new_tokens"),
        (dict(prompt="hi", sampling_params={"temprature": 0.5}), "temprature"),
        (dict(prompt="hi", sampling_params={"n": 0}), "n"),
        (dict(input_ids=[10**7]), "input_ids"),
        (dict(prompt=["a", "b"], sampling_params=[{}]), "sampling_params"),
        (dict(prompt="hi", logprob_start_len=5, return_logprob=True), "logprob_start_len"),
    ],
)
def test_bad_input_raises_and_engine_keeps_serving(engine, kwargs, field):
    with pytest.raises(ValueError, match=field):
        engine.generate(**kwargs)
    assert pool_is_whole(engine)
    assert engine.generate("Hello", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_flush_is_refused_while_requests_run(engine):
    stream = engine.generate(PROMPT, {"max_new_tokens": 50, "ignore_eos": True}, stream=True)
    next(stream)
    assert engine.flush_cache() is False
    stream.close()


def test_streaming_a_batch_interleaves_chunks_by_index(engine):
    prompts = [PROMPT, "The three primary colors are"]
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    whole = engine.generate(prompts, params)
    texts = ["", ""]
    ids: list[list[int]] = [[], []]
    for chunk in engine.generate(prompts, params, stream=True):
        texts[chunk["index"]] += chunk["text"]
        ids[chunk["index"]] += chunk["output_ids"]
    assert ids == [w["output_ids"] for w in whole]
    assert texts == [w["text"] for w in whole]
    seen = {c["index"] for c in engine.generate(PROMPT, {"n": 3, "max_new_tokens": 3}, stream=True)}
    assert seen == {0, 1, 2}
