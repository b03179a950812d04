"""Turns a GenerateReqInput into validated scheduler messages, or a clear ValueError.

Everything that can be checked before a request reaches the scheduler is checked here, so a bad
request raises in the caller's frame and never touches the KV pool. Batch semantics are
SGLang's: a list of prompts takes either one value or one value per prompt for sampling_params,
rid, return_logprob, logprob_start_len, top_logprobs_num and token_ids_logprob.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from radixrt.errors import ParamError
from radixrt.frontend.bootstrap import plan_bootstraps
from radixrt.protocol.messages import GenerateReq
from radixrt.protocol.request_input import GenerateReqInput, check_supported, check_types
from radixrt.protocol.request_limits import (
    validate_beam_search,
    validate_logprobs,
    validate_no_beam_search_disaggregated,
    validate_request_size,
    validate_token_ids,
)
from radixrt.protocol.sampling_params import SamplingParams


@dataclass(frozen=True)
class PlannedReq:
    """One scheduler message and what the frontend needs to present its output."""

    msg: GenerateReq
    params: SamplingParams
    return_text_in_logprobs: bool
    return_prompt_token_ids: bool
    log_metrics: bool
    parent_rid: str  # the rid the caller gave or was given (n > 1: the samples' common rid)
    send: bool = True  # False: a beam search's other results (they come under msg.rid)


def build_requests(engine: Any, req: GenerateReqInput) -> tuple[list[PlannedReq], bool]:
    """Returns ([planned request], is_batch); n > 1 becomes n messages with rids rid-0...

    Sizes are checked before anything is tokenized (characters, prompts x n); a constraint
    is compiled, within --grammar-compile-timeout, before its request is queued. So this may
    block for that long: async callers run it on a worker thread."""
    req = check_types(req)
    check_supported(req)
    limits = engine.server_args
    prompt_field = "text" if req.text is not None else "input_ids"
    count, is_batch = _prompt_shape(req.text, req.input_ids, limits.max_prompt_chars)
    params_list = _per_prompt(req.sampling_params, count, "sampling_params", dict_ok=True)
    _check_batch_size(count, params_list, limits.max_request_batch_size, prompt_field)
    rids = _rids(req.rid, count, is_batch)
    # One Bootstrap per message (prompt i, sample j) or None: SGLang's rule, frontend/bootstrap.py.
    boots = plan_bootstraps(req, [_n_of(raw) for raw in params_list], limits)
    want_lp = _per_prompt(req.return_logprob, count, "return_logprob")
    starts = _per_prompt(req.logprob_start_len, count, "logprob_start_len")
    tops = _per_prompt(req.top_logprobs_num, count, "top_logprobs_num")
    vocab = engine.info.vocab_size
    id_lists = _token_ids_logprob(req.token_ids_logprob, count, vocab)
    out = []
    for i, ids in enumerate(_token_lists(engine.tokenizer, req.text, req.input_ids)):
        params = _checked_params(params_list[i], engine, len(ids))
        validate_token_ids(ids, vocab)
        max_new = params.max_new_tokens
        assert max_new is not None, "verify() checked that fill_max_new_tokens resolved it"
        validate_request_size(
            len(ids), max_new, engine.info.context_length, engine.info.pool_tokens, prompt_field
        )
        start = -1 if starts[i] is None else starts[i]
        top_n = tops[i] or 0
        validate_logprobs(
            top_logprobs_num=top_n,
            token_ids_logprob=id_lists[i],
            logprob_start_len=start,
            return_logprob=bool(want_lp[i]),
            prompt_len=len(ids),
            max_new_tokens=max_new,
            max_logprobs=limits.max_logprobs,
            max_entries=limits.max_logprob_entries,
        )
        _check_constraint(engine, params)
        beams = (params.beam_width or 1) > 1
        if boots is not None:
            validate_no_beam_search_disaggregated(params.beam_width or 1)
        validate_beam_search(
            params.beam_width or 1,
            len(ids),
            max_new,
            return_logprob=bool(want_lp[i]),
            stream=bool(req.stream),
            tp_size=limits.tp_size,
            max_running_requests=limits.max_running_requests,
            page_size=limits.page_size,
            pool_tokens=engine.info.pool_tokens,
        )
        sub_rids = [rids[i]] if params.n == 1 else [f"{rids[i]}-{j}" for j in range(params.n)]
        for j, sub_rid in enumerate(sub_rids):
            # A beam search is one message; its n results come back under the n rids.
            sample = params if beams else _sample_params(params, j)
            msg = GenerateReq(
                sub_rid,
                ids,
                sample.to_dict(),
                bool(want_lp[i]),
                start,
                top_n,
                bool(req.stream),
                id_lists[i],
                beam_rids=sub_rids if beams else None,
                bootstrap=boots[i][j] if boots is not None else None,
            )
            out.append(
                PlannedReq(
                    msg,
                    sample,
                    bool(req.return_text_in_logprobs),
                    bool(req.return_prompt_token_ids),
                    req.log_metrics is not False,
                    rids[i],
                    send=not beams or j == 0,
                )
            )
    return out, is_batch


def _prompt_shape(prompt, input_ids, max_chars: int) -> tuple[int, bool]:
    """(how many prompts, is_batch), before anything is tokenized; each text prompt has at
    most `max_chars` characters."""
    if (prompt is None) == (input_ids is None):
        raise ParamError("text", "give exactly one of text (the prompt) or input_ids (token ids)")
    if input_ids is not None:
        if not isinstance(input_ids, list):
            raise ParamError(
                "input_ids", "input_ids must be a list of ints or a list of lists of ints"
            )
        if input_ids and isinstance(input_ids[0], list):
            if not all(isinstance(x, list) for x in input_ids):
                raise ParamError(
                    "input_ids",
                    "input_ids must be a list of ints or a list of lists of ints, not a mix",
                )
            return len(input_ids), True
        return 1, False
    texts = [prompt] if isinstance(prompt, str) else prompt
    if not (isinstance(texts, list) and texts and all(isinstance(p, str) for p in texts)):
        raise ParamError(
            "text",
            "text (the prompt) must be a string or a non-empty list of "
            f"strings, got {type(prompt).__name__}",
        )
    for i, text in enumerate(texts):
        if len(text) > max_chars:
            where = "text" if isinstance(prompt, str) else f"text[{i}]"
            raise ParamError(
                "text",
                f"{where} has {len(text)} characters; the server's "
                f"--max-prompt-chars is {max_chars}",
            )
    return len(texts), isinstance(prompt, list)


def _check_batch_size(count: int, params_list: list, limit: int, prompt_field: str) -> None:
    """One call makes at most `limit` requests: prompts x n."""
    if count > limit:
        raise ParamError(
            prompt_field,
            f"{prompt_field} holds {count} prompts; one request "
            f"may make at most {limit} (the server's --max-request-batch-size)",
        )
    total = sum(_n_of(raw) for raw in params_list)
    if total > limit:
        raise ParamError(
            "n",
            f"{count} prompt(s) x n make {total} requests; one request "
            f"may make at most {limit} (the server's "
            "--max-request-batch-size)",
        )


def _n_of(raw) -> int:
    """The n a sampling_params value asks for (1 if unset or invalid: verify says which)."""
    n = raw.n if isinstance(raw, SamplingParams) else (raw or {}).get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def _token_lists(tokenizer, prompt, input_ids) -> list[list[int]]:
    """The prompts' token ids (_prompt_shape checked their shape)."""
    if input_ids is not None:
        if input_ids and isinstance(input_ids[0], list):
            return [list(x) for x in input_ids]
        return [list(input_ids)]
    if tokenizer is None:
        raise ValueError("this engine was started with skip_tokenizer_init=True: pass input_ids")
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    return [tokenizer.encode(p) for p in prompt]


def _per_prompt(value, count: int, name: str, dict_ok: bool = False) -> list:
    """One value for every prompt, or a list with one value per prompt."""
    if not isinstance(value, list):
        if dict_ok and value is not None and not isinstance(value, (dict, SamplingParams)):
            raise ParamError(name, f"{name} must be a dict or a list of dicts")
        return [value] * count
    if len(value) != count:
        raise ParamError(
            name,
            f"{name} has {len(value)} entries for {count} prompt(s): give "
            "one value, or one per prompt",
        )
    return value


def _rids(rid, count: int, is_batch: bool) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if isinstance(rid, str) and is_batch:  # SGLang: a prefix for the batch's rids
        rids = [f"{rid}_{i}" for i in range(count)]
    else:
        rids = rid if isinstance(rid, list) else [rid]
    if len(rids) != count or not all(isinstance(r, str) and r for r in rids):
        raise ParamError(
            "rid",
            f"rid must be {'a list of ' + str(count) if is_batch else 'one'} non-empty string(s)",
        )
    if len(set(rids)) != len(rids):
        raise ParamError("rid", f"rid has duplicates: {sorted(rids)}")
    return rids


def _token_ids_logprob(value, count: int, vocab: int) -> list[list[int] | None]:
    """SGLang: a flat list of ids (for every prompt), or one list (or None) per prompt."""
    if not value:
        return [None] * count
    lists = value if isinstance(value[0], list) or value[0] is None else [value] * count
    lists = _per_prompt(lists, count, "token_ids_logprob")
    for ids in lists:
        if ids is not None and not isinstance(ids, list):
            raise ParamError(
                "token_ids_logprob",
                "token_ids_logprob must be a list of token "
                f"ids, or one list (or null) per prompt, got {ids!r:.80}",
            )
        bad = next(
            (
                t
                for t in ids or ()
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
            ),
            None,
        )
        if bad is not None:
            raise ParamError(
                "token_ids_logprob",
                f"token_ids_logprob must hold token ids in [0, {vocab}), got {bad!r:.80}",
            )
    return [list(ids) if ids else None for ids in lists]


def _checked_params(raw, engine: Any, prompt_len: int) -> SamplingParams:
    # A copy: one SamplingParams object may serve several prompts of different lengths.
    params = SamplingParams.from_dict(raw.to_dict() if isinstance(raw, SamplingParams) else raw)
    info = engine.info
    params.fill_max_new_tokens(min(info.context_length, info.pool_tokens) - prompt_len)
    params.verify(info.vocab_size)
    if (params.stop or params.stop_regex) and engine.tokenizer is None:
        raise ValueError(
            "stop strings and stop_regex need a tokenizer "
            "(skip_tokenizer_init=True): use stop_token_ids"
        )
    return params


def _check_constraint(engine: Any, params: SamplingParams) -> None:
    """A regex / json_schema / ebnf compiles in time and some token can start its text."""
    from radixrt.errors import GrammarBusy
    from radixrt.grammar.constraint import constraint_of

    found = constraint_of(params)
    if found is None:
        return
    if engine.tokenizer is None:
        raise ParamError(
            found[0],
            "structured generation (regex, json_schema, ebnf) needs a "
            "tokenizer: this server runs with skip_tokenizer_init",
        )
    try:
        _checker(engine).check(*found)
    except GrammarBusy as e:
        from radixrt.errors import ServerOverloaded

        raise ServerOverloaded(str(e)) from None


# One ConstraintChecker (xgrammar compiler and verdict cache) per engine, made at its first
# constraint; closed when the engine is collected.
_CHECKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CHECKERS_LOCK = threading.Lock()


def _checker(engine: Any):
    from radixrt.grammar.checker import ConstraintChecker

    with _CHECKERS_LOCK:
        checker = _CHECKERS.get(engine)
        if checker is None:
            args = engine.server_args
            checker = ConstraintChecker(
                engine.tokenizer,
                engine.info.vocab_size,
                args.grammar_compile_timeout,
                args.json_any_whitespace,
            )
            _CHECKERS[engine] = checker
            weakref.finalize(engine, checker.close)
        return checker


def _sample_params(params: SamplingParams, i: int) -> SamplingParams:
    """Sample i of n: its own seed (seed + i) so the n samples differ yet stay reproducible."""
    d = params.to_dict()
    d["n"] = 1
    d["sampling_seed"] = None  # already folded into seed
    if params.seed is not None:
        d["seed"] = (params.seed + i) % (1 << 63)
    return SamplingParams.from_dict(d)
