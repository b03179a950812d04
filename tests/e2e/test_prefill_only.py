"""max_new_tokens=0: the prompt is prefilled (and cached, and scored) without a sample, as in
SGLang; the DSL commits fork prefixes and scores select choices this way."""

from __future__ import annotations

import radixrt


def test_max_new_tokens_zero_prefills_caches_and_scores_without_sampling(tiny_model_dir):
    path = tiny_model_dir("llama")
    prompt = list(range(40, 80))
    with radixrt.Engine(
        path, in_process=True, dtype="float32", max_total_tokens=2048, enable_kv_checks=True
    ) as engine:
        out = engine.generate(
            input_ids=prompt,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        assert out["output_ids"] == [] and out["text"] == ""
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert out["meta_info"]["completion_tokens"] == 0
        scored = out["meta_info"]["input_token_logprobs"]
        assert [t for _, t, _ in scored] == prompt and scored[0][0] is None
        assert all(lp <= 0 for lp, _, _ in scored[1:])
        # The prefix is now in the radix cache: a continuation reuses it.
        again = engine.generate(
            input_ids=prompt + [90, 91], sampling_params={"max_new_tokens": 2, "temperature": 0}
        )
        assert again["meta_info"]["cached_tokens"] >= len(prompt) - 1
        # Scores match those of the same tokens inside a longer scored prompt.
        longer = engine.generate(
            input_ids=prompt + [90],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        got = [lp for lp, _, _ in longer["meta_info"]["input_token_logprobs"][1 : len(prompt)]]
        want = [lp for lp, _, _ in scored[1:]]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
        engine.get_stats(check_kv=True)
        # A one-token prompt has no logprob to compute, but still reports its first token.
        one = engine.generate(
            input_ids=[7],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        assert [tuple(t) for t in one["meta_info"]["input_token_logprobs"]] == [(None, 7, None)]
        engine.get_stats(check_kv=True)
