"""Turns a GenerateReqInput into validated scheduler messages, or a clear ValueError.

Everything that can be checked before a request reaches the scheduler is checked here, so a bad
request raises in the caller's frame and never touches the KV pool. Batch semantics are
SGLang's: a list of prompts takes either one value or one value per prompt for sampling_params,
rid, return_logprob, logprob_start_len, top_logprobs_num and token_ids_logprob.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from radixrt.messages import GenerateReq
from radixrt.request_input import (
    GenerateReqInput,
    RequestFieldError,
    check_supported,
    check_types,
)
from radixrt.sampling_params import SamplingParams
from radixrt.scheduler.scheduler import validate_request_size


@dataclass(frozen=True)
class PlannedReq:
    """One scheduler message and what the frontend needs to present its output."""

    msg: GenerateReq
    params: SamplingParams
    return_text_in_logprobs: bool
    return_prompt_token_ids: bool
    log_metrics: bool
    parent_rid: str  # the rid the caller gave or was given (n > 1: the samples' common rid)


def build_requests(engine: Any, req: GenerateReqInput) -> tuple[list[PlannedReq], bool]:
    """Returns ([planned request], is_batch); n > 1 becomes n messages with rids rid-0..."""
    req = check_types(req)
    check_supported(req)
    token_lists, is_batch = _token_lists(engine.tokenizer, req.text, req.input_ids)
    count, vocab = len(token_lists), engine.info.vocab_size
    params_list = _per_prompt(req.sampling_params, count, "sampling_params", dict_ok=True)
    rids = _rids(req.rid, count, is_batch)
    want_lp = _per_prompt(req.return_logprob, count, "return_logprob")
    starts = _per_prompt(req.logprob_start_len, count, "logprob_start_len")
    tops = _per_prompt(req.top_logprobs_num, count, "top_logprobs_num")
    id_lists = _token_ids_logprob(req.token_ids_logprob, count, vocab)
    out = []
    for i, ids in enumerate(token_lists):
        params = _checked_params(params_list[i], engine, len(ids))
        _check_ids(ids, vocab)
        validate_request_size(len(ids), params.max_new_tokens, engine.info.context_length,
                              engine.info.pool_tokens)
        start = _start(starts[i], len(ids))
        top_n = _top_n(tops[i], vocab)
        for j in range(params.n):
            sample = _sample_params(params, j)
            sub_rid = rids[i] if params.n == 1 else f"{rids[i]}-{j}"
            msg = GenerateReq(sub_rid, ids, sample.to_dict(), bool(want_lp[i]), start, top_n,
                              bool(req.stream), id_lists[i])
            out.append(PlannedReq(msg, sample, bool(req.return_text_in_logprobs),
                                  bool(req.return_prompt_token_ids), req.log_metrics is not False,
                                  rids[i]))
    return out, is_batch


def _token_lists(tokenizer, prompt, input_ids) -> tuple[list[list[int]], bool]:
    if (prompt is None) == (input_ids is None):
        raise RequestFieldError("give exactly one of text (the prompt) or input_ids "
                                "(token ids)", "text")
    if input_ids is not None:
        if not isinstance(input_ids, list):
            raise RequestFieldError("input_ids must be a list of ints or a list of lists of "
                                    "ints", "input_ids")
        if input_ids and isinstance(input_ids[0], list):
            return [list(x) for x in input_ids], True
        return [list(input_ids)], False
    if tokenizer is None:
        raise ValueError("this engine was started with skip_tokenizer_init=True: pass input_ids")
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)], False
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [tokenizer.encode(p) for p in prompt], True
    raise RequestFieldError("text (the prompt) must be a string or a non-empty list of "
                            f"strings, got {type(prompt).__name__}", "text")


def _per_prompt(value, count: int, name: str, dict_ok: bool = False) -> list:
    """One value for every prompt, or a list with one value per prompt."""
    if not isinstance(value, list):
        if dict_ok and value is not None and not isinstance(value, (dict, SamplingParams)):
            raise RequestFieldError(f"{name} must be a dict or a list of dicts", name)
        return [value] * count
    if len(value) != count:
        raise RequestFieldError(f"{name} has {len(value)} entries for {count} prompt(s): give "
                                "one value, or one per prompt", name)
    return value


def _rids(rid, count: int, is_batch: bool) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if isinstance(rid, str) and is_batch:  # SGLang: a prefix for the batch's rids
        rids = [f"{rid}_{i}" for i in range(count)]
    else:
        rids = rid if isinstance(rid, list) else [rid]
    if len(rids) != count or not all(isinstance(r, str) and r for r in rids):
        raise RequestFieldError(f"rid must be {'a list of ' + str(count) if is_batch else 'one'} "
                                "non-empty string(s)", "rid")
    if len(set(rids)) != len(rids):
        raise RequestFieldError(f"rid has duplicates: {sorted(rids)}", "rid")
    return rids


def _start(value, prompt_len: int) -> int:
    start = -1 if value is None else value
    if isinstance(start, bool) or not isinstance(start, int) or not -1 <= start < prompt_len:
        raise RequestFieldError(f"logprob_start_len must be -1 or in [0, {prompt_len - 1}] for "
                                f"a prompt of {prompt_len} tokens, got {start!r}",
                                "logprob_start_len")
    return start


def _top_n(value, vocab: int) -> int:
    top_n = value or 0
    if isinstance(top_n, bool) or not isinstance(top_n, int) or not 0 <= top_n <= vocab:
        raise RequestFieldError(f"top_logprobs_num must be an int in [0, {vocab}], got "
                                f"{top_n!r}", "top_logprobs_num")
    return top_n


def _token_ids_logprob(value, count: int, vocab: int) -> list[list[int] | None]:
    """SGLang: a flat list of ids (for every prompt), or one list (or None) per prompt."""
    if not value:
        return [None] * count
    lists = value if isinstance(value[0], list) or value[0] is None else [value] * count
    lists = _per_prompt(lists, count, "token_ids_logprob")
    for ids in lists:
        if ids is not None and not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
            raise RequestFieldError(f"token_ids_logprob must hold token ids in [0, {vocab}), "
                                    f"got {ids!r}", "token_ids_logprob")
    return [list(ids) if ids else None for ids in lists]


def _checked_params(raw, engine: Any, prompt_len: int) -> SamplingParams:
    # A copy: one SamplingParams object may serve several prompts of different lengths.
    params = SamplingParams.from_dict(raw.to_dict() if isinstance(raw, SamplingParams) else raw)
    info = engine.info
    params.fill_max_new_tokens(min(info.context_length, info.pool_tokens) - prompt_len)
    params.verify(info.vocab_size)
    if (params.stop or params.stop_regex) and engine.tokenizer is None:
        raise ValueError("stop strings and stop_regex need a tokenizer "
                         "(skip_tokenizer_init=True): use stop_token_ids")
    return params


def _check_ids(ids: list[int], vocab: int) -> None:
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise RequestFieldError(f"input_ids[{i}] = {t!r} is not a token id in "
                                    f"[0, {vocab})", "input_ids")


def _sample_params(params: SamplingParams, i: int) -> SamplingParams:
    """Sample i of n: its own seed (seed + i) so the n samples differ yet stay reproducible."""
    d = params.to_dict()
    d["n"] = 1
    d["sampling_seed"] = None  # already folded into seed
    if params.seed is not None:
        d["seed"] = (params.seed + i) % (1 << 63)
    return SamplingParams.from_dict(d)
