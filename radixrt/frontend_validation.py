"""Turns the arguments of `generate` into validated scheduler messages, or a clear ValueError.

Everything that can be checked before a request reaches the scheduler is checked here, so a bad
request raises in the caller's frame and never touches the KV pool.
"""

from __future__ import annotations

import uuid
from typing import Any

from radixrt.messages import GenerateReq
from radixrt.sampling_params import SamplingParams
from radixrt.scheduler.scheduler import validate_request_size


def build_requests(engine: Any, prompt, sampling_params, input_ids, return_logprob,
                   logprob_start_len, top_logprobs_num, rid,
                   stream) -> tuple[list[tuple[GenerateReq, SamplingParams]], bool]:
    """Returns ([(message, params)], is_batch); n > 1 becomes n messages with rids rid-0..."""
    token_lists, is_batch = _token_lists(engine.tokenizer, prompt, input_ids)
    vocab = engine.info.vocab_size
    params_list = _params_list(sampling_params, len(token_lists))
    rids = _rids(rid, len(token_lists), is_batch)
    start = -1 if logprob_start_len is None else logprob_start_len
    top_n = top_logprobs_num or 0
    if not isinstance(top_n, int) or not 0 <= top_n <= vocab:
        raise ValueError(f"top_logprobs_num must be an int in [0, {vocab}], got {top_n!r}")
    out = []
    for ids, raw, base_rid in zip(token_lists, params_list, rids):
        params = _checked_params(raw, vocab, engine.tokenizer is not None)
        _check_ids(ids, vocab)
        validate_request_size(len(ids), params.max_new_tokens, engine.info.context_length,
                              engine.info.pool_tokens)
        if not isinstance(start, int) or not -1 <= start < len(ids):
            raise ValueError(f"logprob_start_len must be -1 or in [0, {len(ids) - 1}] for "
                             f"a prompt of {len(ids)} tokens, got {start!r}")
        for i in range(params.n):
            sample = _sample_params(params, i)
            sub_rid = base_rid if params.n == 1 else f"{base_rid}-{i}"
            msg = GenerateReq(sub_rid, ids, sample.to_dict(), bool(return_logprob), start,
                              top_n, bool(stream))
            out.append((msg, sample))
    return out, is_batch


def _token_lists(tokenizer, prompt, input_ids) -> tuple[list[list[int]], bool]:
    if (prompt is None) == (input_ids is None):
        raise ValueError("give exactly one of prompt (text) or input_ids (token ids)")
    if input_ids is not None:
        if not isinstance(input_ids, list):
            raise ValueError("input_ids must be a list of ints or a list of lists of ints")
        if input_ids and isinstance(input_ids[0], list):
            return [list(x) for x in input_ids], True
        return [list(input_ids)], False
    if tokenizer is None:
        raise ValueError("this engine was started with skip_tokenizer_init=True: pass input_ids")
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)], False
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [tokenizer.encode(p) for p in prompt], True
    raise ValueError("prompt must be a string or a non-empty list of strings")


def _params_list(sampling_params, count: int) -> list[dict | None]:
    if sampling_params is None or isinstance(sampling_params, (dict, SamplingParams)):
        return [sampling_params] * count
    if isinstance(sampling_params, list):
        if len(sampling_params) != count:
            raise ValueError(f"sampling_params has {len(sampling_params)} entries for "
                             f"{count} prompts: give one dict, or one per prompt")
        return sampling_params
    raise ValueError("sampling_params must be a dict or a list of dicts")


def _rids(rid, count: int, is_batch: bool) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    rids = rid if isinstance(rid, list) else [rid]
    if len(rids) != count or not all(isinstance(r, str) and r for r in rids):
        raise ValueError(f"rid must be {'a list of ' + str(count) if is_batch else 'one'} "
                         "non-empty string(s)")
    return rids


def _checked_params(raw, vocab: int, has_tokenizer: bool) -> SamplingParams:
    params = raw if isinstance(raw, SamplingParams) else SamplingParams.from_dict(raw)
    params.verify(vocab)
    if params.stop and not has_tokenizer:
        raise ValueError("stop strings need a tokenizer (skip_tokenizer_init=True): "
                         "use stop_token_ids")
    return params


def _check_ids(ids: list[int], vocab: int) -> None:
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise ValueError(f"input_ids[{i}] = {t!r} is not a token id in [0, {vocab})")


def _sample_params(params: SamplingParams, i: int) -> SamplingParams:
    """Sample i of n: its own seed (seed + i) so the n samples differ yet stay reproducible."""
    d = params.to_dict()
    d["n"] = 1
    if params.seed is not None:
        d["seed"] = (params.seed + i) % (1 << 63)
    return SamplingParams.from_dict(d)
