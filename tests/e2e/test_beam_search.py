"""Beam search equals transformers' generate(num_beams=k, do_sample=False) in float32: the same
sequences in the same order and scores within 1e-4, for beam widths 1 to 8, length penalties
and every early_stopping, with pages of 1 and 16, several groups at once beside ordinary
requests, and a pool small enough that groups wait and are preempted; the pool's count holds
after every step (KV checks on)."""

from __future__ import annotations

import random

import pytest
import torch

import radixrt

TINY_VOCAB, PAD_ID, IM_END_ID = 320, 256, 258  # tests/conftest.py's tiny tokenizer
SCORE_TOL = 1e-4


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(TINY_VOCAB - 64) for _ in range(rng.randint(3, 40))] for _ in range(count)
    ]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def frequent_token(hf_model) -> int:
    """A token the random model often ranks high: as an extra stop id it makes beams finish
    early, so finished hypotheses, their scores and early stopping are exercised."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor(_prompts(8, seed=5)[:1])).logits[0]
    return int(logits.mean(0).argmax())


@torch.inference_mode()
def hf_beams(model, prompt, width, n, max_new, stop_ids, tokenizer=None, **kwargs):
    """transformers' beams: (generated tokens up to and including the stop, score) best first."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        num_beams=width,
        num_return_sequences=n,
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=stop_ids,
        pad_token_id=PAD_ID,
        return_dict_in_generate=True,
        output_scores=True,
        **kwargs,
    )
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), generation_config=config, tokenizer=tokenizer
    )
    seqs = out.sequences[:, len(prompt) :].tolist()
    if width == 1:  # transformers runs greedy search: no score; the tokens up to a stop
        ends = [next((i + 1 for i, t in enumerate(s) if t in stop_ids), len(s)) for s in seqs]
        return [(s[:end], None) for s, end in zip(seqs, ends, strict=True)]
    lengths = (out.beam_indices >= 0).sum(1).tolist()
    scores = out.sequences_scores.tolist()
    return [(s[:n_], float(v)) for s, n_, v in zip(seqs, lengths, scores, strict=True)]


def _engine(model_dir, **kwargs) -> radixrt.Engine:
    return radixrt.Engine(
        model_path=model_dir,
        dtype="float32",
        enable_kv_checks=True,
        log_level="warning",
        in_process=True,
        **kwargs,
    )


def _ours(outs) -> list[tuple[list[int], float]]:
    outs = outs if isinstance(outs, list) else [outs]
    return [(o["output_ids"], o["meta_info"].get("beam_score")) for o in outs]


def assert_same_beams(ours, ref, label: str) -> None:
    assert [t for t, _ in ours] == [t for t, _ in ref], f"{label}: ours {ours}, transformers {ref}"
    for (_, a), (_, b) in zip(ours, ref, strict=True):
        if b is None:  # width 1: greedy, as transformers runs it
            assert a is None
            continue
        assert abs(a - b) <= SCORE_TOL * max(1.0, abs(b)), f"{label}: score {a} vs {b}"


CASES = [
    # (width, n, max_new, length_penalty, early_stopping, extra stop, min_new_tokens)
    (1, 1, 12, 1.0, False, False, 0),
    (2, 2, 20, 1.0, False, True, 0),
    (3, 1, 16, 0.0, True, True, 6),
    (4, 4, 24, 1.0, False, True, 0),
    (4, 2, 24, -0.5, "never", True, 0),
    (5, 3, 16, 2.0, "never", True, 4),
    (8, 8, 32, 1.0, True, True, 0),
    (8, 3, 20, 1.0, False, False, 0),
    (6, 2, 256, 1.0, "never", False, 0),
]


@pytest.fixture
def bounded_groups(monkeypatch):
    """After every beam step: no group holds more pages (shared ones counted once) than its
    prompt's plus beam_width x (its longest beam's pages + 1)."""
    from radixrt.scheduler import beam_search

    process = beam_search.BeamSearch.process
    checked = [0]

    def checking(self, plan, logits, running, waiting):
        process(self, plan, logits, running, waiting)
        page = self.kv.page_size
        for group in {id(r.beam): r.beam for r in running if r.beam is not None}.values():
            held = set()  # every page a beam's row points at; a shared one counts once
            for beam in group.beams:
                held |= set(
                    (self.kv.table.read(beam.table_row, 0, beam.num_slots) // page).tolist()
                )
            prompt = -(-len(group.root.origin_input_ids) // page)
            longest = -(-max(b.seq_len for b in group.beams) // page)
            assert len(held) <= prompt + group.width * (longest + 1), (len(held), longest)
            checked[0] += 1

    monkeypatch.setattr(beam_search.BeamSearch, "process", checking)
    return checked


@pytest.mark.parametrize(
    "page_size,radix", [(1, True), (16, True), (4, False)], ids=["page1", "page16", "no-radix"]
)
def test_beams_equal_transformers(
    model_dir, hf_model, frequent_token, page_size, radix, bounded_groups
):
    # Pages of 16 with prompt chunks of 16: roots are prefilled in several steps. Without the
    # radix cache nothing is shared: a fork copies its parent's pages.
    chunk = {"chunked_prefill_size": 16} if page_size == 16 else {}
    engine = _engine(
        model_dir,
        page_size=page_size,
        max_total_tokens=8192,
        disable_radix_cache=not radix,
        **chunk,
    )
    try:
        prompts = _prompts(len(CASES), seed=page_size)
        requests = []
        for (width, n, max_new, lp, early, extra, min_new), prompt in zip(
            CASES, prompts, strict=True
        ):
            stops = [IM_END_ID, frequent_token] if extra else [IM_END_ID]
            params = {
                "beam_width": width,
                "n": n,
                "max_new_tokens": max_new,
                "length_penalty": lp,
                "early_stopping": early,
                "temperature": 0,
                "stop_token_ids": stops[1:],
                "min_new_tokens": min_new,
            }
            requests.append((prompt, params, stops))
        # All groups at once, beside ordinary requests: one batched call.
        plain = {"temperature": 0, "max_new_tokens": 16}
        outs = engine.generate(
            input_ids=[p for p, _, _ in requests] + _prompts(3, seed=9),
            sampling_params=[s for _, s, _ in requests] + [plain] * 3,
        )
        at = 0
        for prompt, params, stops in requests:
            n = params["n"]
            ref = hf_beams(
                hf_model,
                prompt,
                params["beam_width"],
                n,
                params["max_new_tokens"],
                stops,
                length_penalty=params["length_penalty"],
                early_stopping=params["early_stopping"],
                min_new_tokens=params["min_new_tokens"] or None,
            )
            assert_same_beams(_ours(outs[at : at + n]), ref, f"{params}")
            at += n
        stats = engine.get_stats(check_kv=True)
        assert stats["beam_forks"] > 0
        assert (stats["beam_copied_tokens"] > 0) == (page_size > 1)
        assert (stats["beam_shared_tokens"] > 0) == radix
        assert stats["beam_groups"] == 0
        assert bounded_groups[0] > 100
    finally:
        engine.shutdown()


def test_small_pool_waits_and_preempts_and_stays_equal(model_dir, hf_model, frequent_token):
    """A pool that holds about two groups at their longest: the others wait, running ones are
    preempted and start over; every result still equals transformers'."""
    engine = _engine(model_dir, page_size=4, max_total_tokens=700, max_running_requests=16)
    try:
        prompts = _prompts(6, seed=3)
        params = {"beam_width": 4, "n": 2, "max_new_tokens": 40, "temperature": 0}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        for i, prompt in enumerate(prompts):
            ref = hf_beams(hf_model, prompt, 4, 2, 40, [IM_END_ID])
            assert_same_beams(_ours(outs[2 * i : 2 * i + 2]), ref, f"prompt {i}")
        stats = engine.get_stats(check_kv=True)
        assert stats["num_preemptions"] > 0, stats
    finally:
        engine.shutdown()


def test_bad_beam_requests_name_the_field(model_dir):
    engine = _engine(model_dir, max_total_tokens=4096)
    try:
        bad = [
            ({"beam_width": 2, "n": 3}, "n"),
            ({"beam_width": 2, "top_p": 0.5}, "top_p"),
            ({"beam_width": 2, "temperature": 0.7}, "temperature"),
            ({"beam_width": 2, "early_stopping": "sometimes"}, "early_stopping"),
            ({"beam_width": 2, "regex": "[a-z]+"}, "regex"),
            ({"beam_width": 2, "max_new_tokens": 3000}, "max_new_tokens"),
        ]
        for params, field in bad:
            with pytest.raises(ValueError, match=field):
                engine.generate(input_ids=[1, 2, 3], sampling_params=params)
        with pytest.raises(ValueError, match="stream"):
            list(
                engine.generate(input_ids=[1, 2, 3], sampling_params={"beam_width": 2}, stream=True)
            )
        with pytest.raises(ValueError, match="return_logprob"):
            engine.generate(
                input_ids=[1, 2, 3], sampling_params={"beam_width": 2}, return_logprob=True
            )
        ok = engine.generate(
            input_ids=[1, 2, 3], sampling_params={"beam_width": 2, "max_new_tokens": 4}
        )
        assert len(ok["output_ids"]) == 4
        assert engine.get_stats(check_kv=True)["running"] == 0
    finally:
        engine.shutdown()


def test_vllm_beam_search_api(model_dir, hf_model):
    """Engine.beam_search with vLLM's BeamSearchParams: its beam_width sequences, best first,
    tokens holding the prompt, cum_logprob the unpenalized sum."""
    engine = _engine(model_dir, max_total_tokens=4096)
    try:
        prompts = _prompts(2, seed=11)
        params = radixrt.BeamSearchParams(beam_width=3, max_tokens=10, length_penalty=0.5)
        outputs = engine.beam_search([{"prompt_token_ids": p} for p in prompts], params)
        for prompt, output in zip(prompts, outputs, strict=True):
            ref = hf_beams(hf_model, prompt, 3, 3, 10, [IM_END_ID], length_penalty=0.5)
            seqs = output.sequences
            assert [s.tokens for s in seqs] == [prompt + t for t, _ in ref]
            for seq, (tokens, score) in zip(seqs, ref, strict=True):
                assert abs(seq.score - score) <= SCORE_TOL
                assert abs(seq.cum_logprob - score * len(tokens) ** 0.5) <= 1e-3
                assert isinstance(seq.text, str) and seq.finish_reason in ("stop", "length")
        text = engine.beam_search(["hello", {"prompt": "world"}], params)
        assert [len(o.sequences) for o in text] == [3, 3]
    finally:
        engine.shutdown()


def test_default_model_equals_transformers(default_tokenizer_dir, hf_loader):
    """The shipped model's weights (dequantized: quantization none), chat prompts."""
    from radixrt.loader.default_model import default_model_path

    path = default_model_path()
    engine = _engine(
        path, quantization="none", tokenizer_path=default_tokenizer_dir, max_total_tokens=8192
    )
    try:
        hf = hf_loader(path)
        stops = list(engine.info.eos_token_ids)
        for question, (width, n) in [("Name a fruit.", (4, 2)), ("What is 2+2?", (3, 3))]:
            text = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
            )
            ids = engine.tokenizer.encode(text, add_special_tokens=False)
            params = {"beam_width": width, "n": n, "max_new_tokens": 24, "temperature": 0}
            ours = _ours(engine.generate(input_ids=ids, sampling_params=params))
            assert_same_beams(ours, hf_beams(hf, ids, width, n, 24, stops), question)
            # A stop string ends a beam as transformers' stop_strings does.
            ours = _ours(engine.generate(input_ids=ids, sampling_params={**params, "stop": ["."]}))
            ref = hf_beams(
                hf, ids, width, n, 24, stops, tokenizer=engine.tokenizer, stop_strings=["."]
            )
            assert_same_beams(ours, ref, f"{question} stop '.'")
        assert engine.get_stats(check_kv=True)["beam_groups"] == 0
    finally:
        engine.shutdown()


def test_abort_ends_a_running_group_and_frees_its_pages(model_dir):
    import threading

    engine = _engine(model_dir, max_total_tokens=4096)
    try:
        params = {"beam_width": 4, "n": 2, "max_new_tokens": 400, "ignore_eos": True}
        results: list = []
        thread = threading.Thread(
            target=lambda: results.append(
                engine.generate(input_ids=[1, 2, 3], sampling_params=params, rid="group")
            )
        )
        thread.start()
        while engine.get_stats()["beam_groups"] == 0:
            assert thread.is_alive()
        engine.abort_request("group")
        thread.join(timeout=30)
        reasons = [r["meta_info"]["finish_reason"]["type"] for r in results[0]]
        assert reasons == ["abort", "abort"]
        stats = engine.get_stats(check_kv=True)
        assert stats["beam_groups"] == 0 and stats["running"] == 0
        assert stats["free_tokens"] + stats["evictable_tokens"] == stats["pool_tokens"]
    finally:
        engine.shutdown()


def test_groups_beside_speculating_requests(model_dir, hf_model):
    """With speculation on, plain requests draft and beams do not; both stay exact."""
    engine = _engine(model_dir, max_total_tokens=8192, speculative_algorithm="NGRAM")
    try:
        prompts = _prompts(4, seed=21)
        beam = {"beam_width": 3, "n": 2, "max_new_tokens": 30, "temperature": 0}
        plain = {"temperature": 0, "max_new_tokens": 30}
        outs = engine.generate(input_ids=prompts, sampling_params=[beam, plain] * 2)
        for at, prompt in ((0, prompts[0]), (3, prompts[2])):
            ref = hf_beams(hf_model, prompt, 3, 2, 30, [IM_END_ID])
            assert_same_beams(_ours(outs[at : at + 2]), ref, "beside speculation")
        assert engine.get_stats(check_kv=True)["beam_groups"] == 0
    finally:
        engine.shutdown()
