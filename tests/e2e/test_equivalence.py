"""Greedy output equals Hugging Face transformers' (float32, one prompt at a time), whatever the
batching, caching, chunking, paging, preemption or speculation did, with dense weights
(--quantization none).

Speculative decoding (NGRAM, drafting as deep as it may at every step) is on in half of the
runs, alternating over models and settings: every setting runs with and without it, and so
does every model."""

from __future__ import annotations

import random

import pytest
from hf_reference import assert_same_greedy, hf_greedy

import radixrt
import radixrt.scheduler.speculation as speculation

MAX_NEW = 12
SETTINGS = {
    "page1": dict(page_size=1),
    "page16": dict(page_size=16),
    "chunked": dict(chunked_prefill_size=5, page_size=1),
    "chunked-page16": dict(chunked_prefill_size=7, page_size=16),
    # Prompt groups of ~200 tokens in all in a 96-token pool, admitted without headroom
    # (conservativeness 0): running decodes must run out of pages and be preempted.
    "preempt": dict(max_total_tokens=96, page_size=1, schedule_conservativeness=0.0),
    "preempt-page16": dict(max_total_tokens=96, page_size=16, schedule_conservativeness=0.0),
}
# Scheduling variants, checked on the tiny models: the policies on two, a plain one and one
# with sliding-window layers; no radix cache on all of them.
SCHEDULING_MODELS = ("llama", "gemma3")
TINY_ONLY = {
    "no-radix-cache": dict(disable_radix_cache=True, chunked_prefill_size=9),
    "fcfs": dict(schedule_policy="fcfs"),
    "dfs-weight": dict(schedule_policy="dfs-weight", page_size=16),
    "lof": dict(schedule_policy="lof", max_total_tokens=96, schedule_conservativeness=0.0),
    "random": dict(schedule_policy="random", chunked_prefill_size=3),
}


def prompt_sets(vocab: int, encode=None) -> dict[str, list[list[int]]]:
    """Prompt groups: mixed lengths, the same prompt twice, a long shared prefix."""
    rng = random.Random(0)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    if encode is not None:
        base = encode(
            "Here are some facts about the world. Paris is the capital of France. "
            "The Nile is a long river in Africa. Mount Everest is very high. "
        )
        mixed = [
            encode(t)
            for t in (
                "The capital of France is",
                "def add(a, b):",
                "Write a haiku about autumn leaves falling on a pond",
                "1, 2, 3, 4,",
            )
        ]
        shared = [
            base + encode(q)
            for q in (
                "Q: What is the capital of France? A:",
                "Q: Where is the Nile? A:",
                "Q: Name a high mountain. A:",
            )
        ]
    else:
        mixed = [rand(n) for n in (3, 17, 40, 29)]
        prefix = rand(45)
        shared = [prefix + rand(n) for n in (4, 9, 13)]
    return {"mixed": mixed, "shared": shared, "twice": [mixed[2]]}


# Qwen3 as its small releases are: tied embeddings, head_dim set apart from hidden / heads.
TINY_OVERRIDES = {"qwen3": dict(head_dim=32, tie_word_embeddings=True)}


MODELS = ["llama", "qwen2", "mistral", "qwen3", "gemma3", "qwen3_moe", "smollm3", "phi3", "default"]


@pytest.fixture(scope="module", params=MODELS)
def model_case(request, tiny_model_dir) -> tuple[str, str, dict]:
    """(name, model path, the engine's tokenizer arguments)."""
    if request.param == "default":
        from radixrt.loader.default_model import default_model_path

        tokenizer_dir = request.getfixturevalue("default_tokenizer_dir")
        return request.param, default_model_path(), {"tokenizer_path": tokenizer_dir}
    overrides = TINY_OVERRIDES.get(request.param, {})
    path = str(tiny_model_dir(request.param, **overrides))
    return request.param, path, {"skip_tokenizer_init": True}


def speculates(model: str, setting: str) -> bool:
    settings = list(SETTINGS) + list(TINY_ONLY)
    return (MODELS.index(model) + settings.index(setting)) % 2 == 1


@pytest.mark.parametrize("setting", list(SETTINGS) + list(TINY_ONLY))
def test_greedy_matches_transformers(model_case, setting, hf_loader, monkeypatch):
    name, path, tokenizer_args = model_case
    if setting in TINY_ONLY and name not in SCHEDULING_MODELS and setting != "no-radix-cache":
        pytest.skip(
            "scheduling policies run on a plain and a sliding-window tiny model only (they "
            "do not depend on the architecture), to keep the suite short"
        )
    hf = hf_loader(path)
    args = {"max_total_tokens": 8192, **(SETTINGS.get(setting) or TINY_ONLY[setting])}
    if setting.startswith("preempt") and name == "default":
        args["max_total_tokens"] = 64  # its text prompts are shorter than the tiny models'
    if speculates(name, setting):
        monkeypatch.setattr(speculation, "draft_size", lambda cost, rate, limit, batch: limit)
        args.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=5)
    # The scheduler runs on a thread here (quicker to start); test_engine_api covers the
    # default child-process mode.
    engine = radixrt.Engine(
        model_path=path,
        dtype="float32",
        quantization="none",  # packed weights: test_quantized_equivalence.py
        device="cpu",
        in_process=True,
        enable_kv_checks=True,
        **tokenizer_args,
        **args,
    )
    try:
        encode = engine.tokenizer.encode if engine.tokenizer else None
        sets = prompt_sets(engine.info.vocab_size, encode)
        params = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
        for group in ("mixed", "shared"):
            outs = engine.generate(input_ids=sets[group], sampling_params=params)
            for i, (prompt, out) in enumerate(zip(sets[group], outs, strict=True)):
                ref = hf_greedy(hf, prompt, MAX_NEW)
                assert_same_greedy(out["output_ids"], ref, f"{name}/{setting}/{group}[{i}]")
        twice = sets["twice"][0]
        ref = hf_greedy(hf, twice, MAX_NEW)
        for attempt in range(2):
            out = engine.generate(input_ids=twice, sampling_params=params)
            assert_same_greedy(out["output_ids"], ref, f"{name}/{setting}/twice[{attempt}]")
        ps = engine.server_args.page_size
        if engine.server_args.disable_radix_cache:
            assert out["meta_info"]["cached_tokens"] == 0
        elif engine.server_args.schedule_conservativeness == 0.0 and not speculates(name, setting):
            # (Speculation may finish the decodes in fewer steps, before the pool runs short:
            # preemption with drafts is checked by tests/reliability/test_churn.py.)
            assert engine.get_stats()["num_preemptions"] > 0, "the pool never ran short"
        else:
            assert out["meta_info"]["cached_tokens"] == (len(twice) - 1) // ps * ps
        stats = engine.get_stats(check_kv=True)
        assert (stats["spec_draft_tokens"] > 0) == speculates(name, setting)
    finally:
        engine.shutdown()


def test_logprobs_match_transformers(model_case, hf_loader):
    _, path, tokenizer_args = model_case
    hf = hf_loader(path)
    engine = radixrt.Engine(
        model_path=path,
        dtype="float32",
        quantization="none",  # packed weights: test_quantized_equivalence.py
        device="cpu",
        in_process=True,
        enable_kv_checks=True,
        chunked_prefill_size=8,
        max_total_tokens=8192,
        **tokenizer_args,
    )
    try:
        encode = engine.tokenizer.encode if engine.tokenizer else None
        prompts = prompt_sets(engine.info.vocab_size, encode)["shared"]
        engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 1})
        params = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
        outs = engine.generate(
            input_ids=prompts,
            sampling_params=params,
            return_logprob=True,
            logprob_start_len=0,
            top_logprobs_num=3,
        )
        for prompt, out in zip(prompts, outs, strict=True):
            ref = hf_greedy(hf, prompt, 6)
            meta = out["meta_info"]
            inputs = meta["input_token_logprobs"]
            assert inputs[0][0] is None and [t for _, t, _ in inputs] == prompt
            ours = [lp for lp, _, _ in inputs[1:]]
            assert max(abs(a - b) for a, b in zip(ours, ref.prompt_logprobs, strict=True)) < 1e-4
            outs_lp = [lp for lp, _, _ in meta["output_token_logprobs"]]
            assert max(abs(a - b) for a, b in zip(outs_lp, ref.output_logprobs, strict=True)) < 1e-4
            tops = meta["output_top_logprobs"]
            assert len(tops) == 6 and all(len(t) == 3 for t in tops)
            assert all(t[0][1] == tok for t, tok in zip(tops, out["output_ids"], strict=True))
    finally:
        engine.shutdown()
