"""One answer per request in the default dtype: a request's tokens and logprobs are bit for bit
what it gets alone on an empty server, whatever its batch, prefill chunks, pages, cache hits,
preemption, speculation or a prefill/decode pair did (docs/determinism.md).

The default dtype is bfloat16 with int8 activations for packed weights, so the tiny models are
packed at load (int4) and the default model runs its own Q4_1 file, all with dtype "auto".
Each check compares with `==`: no tolerance, no near-tie excuse.
"""

from __future__ import annotations

import concurrent.futures
import random

import pytest
from launch_helpers import free_port

import radixrt
import radixrt.scheduler.speculation as speculation

NEW = 10
ARCHS = ["llama", "qwen2", "mistral", "qwen3", "gemma3", "qwen3_moe", "smollm3", "phi3"]
TINY_OVERRIDES = {"qwen3": dict(head_dim=32, tie_word_embeddings=True)}


def engine_for(path: str, tokenizer: dict, **args) -> radixrt.Engine:
    return radixrt.Engine(
        model_path=path,
        device="cpu",
        in_process=True,
        enable_kv_checks=True,
        log_level="warning",
        **tokenizer,
        **args,
    )


def answers(engine: radixrt.Engine, prompts, params: dict, **fields) -> list[tuple]:
    """(output ids, output logprobs, top logprobs) of each prompt, sent as one batch."""
    outs = engine.generate(
        input_ids=prompts,
        sampling_params=params,
        return_logprob=True,
        top_logprobs_num=2,
        **fields,
    )
    return [
        (
            o["output_ids"],
            [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]],
            o["meta_info"]["output_top_logprobs"],
        )
        for o in outs
    ]


def alone(engine: radixrt.Engine, prompts, params: dict) -> list[tuple]:
    """Each prompt by itself on an empty cache."""
    results = []
    for prompt in prompts:
        assert engine.flush_cache()
        results.append(answers(engine, [prompt], params)[0])
    return results


def assert_same(got: list[tuple], want: list[tuple], what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g[0] == w[0], f"{what}: prompt {i}'s tokens differ"
        assert g[1] == w[1] and g[2] == w[2], f"{what}: prompt {i}'s logprobs differ"


def tiny_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """Lengths across the kernel's chunks of 256 keys, and two sharing a 300-token prefix."""
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    prefix = rand(300)
    return [rand(5), rand(70), rand(255), rand(400), prefix + rand(20), prefix + rand(3)]


GREEDY = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_models_answer_the_same_in_any_batch(arch, tiny_model_dir, monkeypatch):
    """Each architecture packed to int4 in the default dtype: a batch of 16 (the prompts and
    10 others), the same batch again (full radix hits), prefill chunks of 7 on pages of 16,
    and NGRAM speculation drafting at every step all equal each prompt alone."""
    path = str(tiny_model_dir(arch, **TINY_OVERRIDES.get(arch, {})))
    tokenizer = {"skip_tokenizer_init": True}
    engine = engine_for(path, tokenizer, quantization="int4", max_total_tokens=8192)
    try:
        assert engine.info.dtype == "bfloat16"
        prompts = tiny_prompts(engine.info.vocab_size)
        want = alone(engine, prompts, GREEDY)
        others = (
            tiny_prompts(engine.info.vocab_size, seed=1)
            + tiny_prompts(engine.info.vocab_size, seed=2)[:4]
        )
        batch = answers(engine, others[:5] + prompts + others[5:], GREEDY)
        assert_same(batch[5 : 5 + len(prompts)], want, f"{arch} in a batch of 16")
        again = answers(engine, prompts, GREEDY)
        assert_same(again, want, f"{arch} after full radix hits")
        engine.get_stats(check_kv=True)
    finally:
        engine.shutdown()
    monkeypatch.setattr(speculation, "draft_size", lambda cost, rate, limit, batch: limit)
    engine = engine_for(
        path, tokenizer, quantization="int4", max_total_tokens=8192, chunked_prefill_size=7,
        page_size=16, speculative_algorithm="NGRAM", speculative_num_draft_tokens=4,
    )  # fmt: skip
    try:
        assert_same(answers(engine, prompts, GREEDY), want, f"{arch} chunked, paged, speculating")
        assert engine.get_stats(check_kv=True)["spec_draft_tokens"] > 0
    finally:
        engine.shutdown()


@pytest.mark.parametrize("quantization", ["int4", "none"])
@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3_moe"])
def test_float32_answers_the_same_in_any_batch(arch, quantization, tiny_model_dir):
    """float32, packed (the float kernels) or dense: a batch of 16 and prefill chunks of 7 on
    pages of 16 equal each prompt alone, bits and all, as in the default dtype."""
    path = str(tiny_model_dir(arch, **TINY_OVERRIDES.get(arch, {})))
    args = dict(quantization=quantization, dtype="float32", max_total_tokens=8192)
    engine = engine_for(path, {"skip_tokenizer_init": True}, **args)
    try:
        prompts = tiny_prompts(engine.info.vocab_size)
        want = alone(engine, prompts, GREEDY)
        others = tiny_prompts(engine.info.vocab_size, seed=1)
        batch = answers(engine, others[:5] + prompts + others[5:] + others[:5], GREEDY)
        assert_same(batch[5 : 5 + len(prompts)], want, f"{arch} float32 in a batch of 16")
    finally:
        engine.shutdown()
    engine = engine_for(
        path, {"skip_tokenizer_init": True}, chunked_prefill_size=7, page_size=16, **args
    )
    try:
        assert_same(answers(engine, prompts, GREEDY), want, f"{arch} float32 chunked, paged")
    finally:
        engine.shutdown()


def test_a_kernel_chosen_by_row_count_is_caught(tiny_model_dir):
    """The check's power: with int8 activations only up to 31 rows (the default before
    2026-12-07), a prompt prefilled beside others (a step of more rows, the float path) gets
    other bits than alone."""
    path = str(tiny_model_dir("qwen2"))
    engine = engine_for(
        path, {"skip_tokenizer_init": True}, quantization="int4", cpu_gguf_int8_rows=31
    )
    try:
        prompts = tiny_prompts(engine.info.vocab_size)
        want = alone(engine, prompts, GREEDY)
        batch = answers(engine, prompts, GREEDY)
        with pytest.raises(AssertionError, match="differ"):
            assert_same(batch, want, "int8 up to 31 rows")
    finally:
        engine.shutdown()


def test_a_prefill_decode_pair_answers_as_one_engine(tiny_model_dir):
    """Served through a prefill/decode pair (the prompt and first token on one engine, the
    bfloat16 pages moved, the rest decoded on the other), each prompt gets the tokens and
    logprobs it gets alone on a plain engine; the last one after the decode engine's own
    cache held its 300-token prefix (only the rest is sent)."""
    path = str(tiny_model_dir("llama"))
    tokenizer = {"skip_tokenizer_init": True}
    args = dict(quantization="int4", max_total_tokens=8192, page_size=16)
    plain = engine_for(path, tokenizer, **args)
    try:
        assert plain.info.dtype == "bfloat16"
        prompts = tiny_prompts(plain.info.vocab_size)
        want = alone(plain, prompts, GREEDY)
    finally:
        plain.shutdown()
    port = free_port()
    pair = [
        engine_for(path, tokenizer, disaggregation_mode=mode, disaggregation_bootstrap_port=port,
                   **args)
        for mode in ("prefill", "decode")
    ]  # fmt: skip
    try:
        got = through_pair(pair, prompts[:-1], port, room=100)
        got += through_pair(pair, prompts[-1:], port, room=200)
        assert_same(got, want, "through a prefill/decode pair")
        stats = pair[1].get_stats(check_kv=True)
        assert stats["disagg_transfers"] == len(prompts) and stats["disagg_reused_tokens"] > 0
    finally:
        for engine in pair:
            engine.shutdown()


def through_pair(pair: list[radixrt.Engine], prompts, port: int, room: int) -> list[tuple]:
    """The decode engine's answers to one batch sent to both engines at once, as SMG does."""
    boot = dict(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=room)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sent = [pool.submit(answers, engine, prompts, GREEDY, **boot) for engine in pair]
        return [future.result(timeout=600) for future in sent][1]


TEXTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Explain why the sky is blue in two sentences.",
]
FILLER = "The quick brown fox jumps over the lazy dog while the band plays on. "


def chat(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


@pytest.fixture(scope="module")
def default_prompts(default_tokenizer_dir) -> dict[str, list[list[int]]]:
    """The prompts under test (short chats, one of ~700 tokens: three chunks of keys and two
    prefill chunks of 512), a shared-prefix pair, and 60 others to fill a batch of 64."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir)
    long = chat(tok, FILLER * 45 + "Summarize the text above.")
    targets = [chat(tok, t) for t in TEXTS] + [long]
    base = chat(tok, FILLER * 5 + "Now name a colour.")
    shared = [base, base[:-6] + tok.encode(" Name a fruit.")]
    others = [chat(tok, f"Count from {i} to {i + 5}.") for i in range(60)]
    return {"targets": targets, "shared": shared, "others": others}


@pytest.fixture(scope="module")
def default_engine_path():
    from radixrt.loader.default_model import default_model_path

    return default_model_path()


def test_default_model_answers_the_same_whatever_the_server_does(
    default_prompts, default_engine_path, default_tokenizer_dir, monkeypatch
):
    """The default model's own Q4_1 file in the default dtype. One engine: each prompt alone,
    then in batches of 8 and 64, after full and partial radix hits, seeded sampling with n = 4
    alone and in a batch, beam search alone and beside other requests. Then engines with
    prefill chunks of 1 (speculating), 16 (pages of 16) and 512, and a pool small enough to
    preempt: the same tokens and logprobs."""
    tokenizer = {"tokenizer_path": default_tokenizer_dir}
    targets, others = default_prompts["targets"], default_prompts["others"]
    engine = engine_for(default_engine_path, tokenizer)
    try:
        assert engine.info.dtype == "bfloat16"
        want = alone(engine, targets, GREEDY)
        shared = alone(engine, default_prompts["shared"], GREEDY)
        for size in (8, 64):
            batch = answers(engine, targets + others[: size - len(targets)], GREEDY)
            assert_same(batch[: len(targets)], want, f"in a batch of {size}")
        assert_same(answers(engine, targets, GREEDY), want, "after full radix hits")
        assert engine.flush_cache()
        answers(engine, default_prompts["shared"][:1], GREEDY)
        assert_same(
            answers(engine, default_prompts["shared"][1:], GREEDY), shared[1:], "partial hit"
        )
        check_sampling_and_beams(engine, targets, others)
        engine.get_stats(check_kv=True)
    finally:
        engine.shutdown()
    monkeypatch.setattr(speculation, "draft_size", lambda cost, rate, limit, batch: limit)
    for args in (
        dict(chunked_prefill_size=1, speculative_algorithm="NGRAM"),
        dict(chunked_prefill_size=16, page_size=16),
        dict(chunked_prefill_size=512),
        dict(max_total_tokens=120, schedule_conservativeness=0.0),  # the short prompts only
    ):
        engine = engine_for(default_engine_path, tokenizer, **args)
        try:
            small = "max_total_tokens" in args
            cases = targets[:4] if small else targets
            got = answers(engine, cases + others[:6], GREEDY)
            assert_same(got[: len(cases)], want[: len(cases)], str(args))
            stats = engine.get_stats(check_kv=True)
            assert not small or stats["num_preemptions"] > 0, "the pool never ran short"
        finally:
            engine.shutdown()


def check_sampling_and_beams(engine: radixrt.Engine, targets, others) -> None:
    """Seeded sampling with n = 4 and beam search: alone, then beside other requests."""
    sampled = {"temperature": 0.9, "top_p": 0.95, "seed": 11, "n": 4, "max_new_tokens": NEW}
    beams = {"beam_width": 3, "n": 2, "temperature": 0, "max_new_tokens": NEW}
    for params in (sampled, beams):
        assert engine.flush_cache()
        single = engine.generate(input_ids=targets[1], sampling_params=params)
        mixed = engine.generate(
            input_ids=[others[0], targets[1], others[1]],
            sampling_params=[GREEDY, params, GREEDY],
        )
        n = params["n"]
        assert [o["output_ids"] for o in mixed[1 : 1 + n]] == [o["output_ids"] for o in single]
        assert len({tuple(o["output_ids"]) for o in single}) > 1, "the n outputs are all equal"
