"""Limits on what one request may ask of the server, checked twice: by the frontend (a 400
before tokenizing or queueing) and by the scheduler (its socket also takes requests from other
frontends, which must not reach the KV pool unchecked either). Pure checks, no torch.

Every error is a `RequestFieldError` naming the field and the allowed range.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.request_input import RequestFieldError


def validate_request_size(prompt_len: int, max_new_tokens: int, context_length: int,
                          pool_tokens: int, prompt_field: str = "input_ids") -> None:
    """The prompt and its generation fit the model's context and the KV pool. `prompt_field`:
    the field the prompt came in (text or input_ids), named by the errors about its length."""
    if prompt_len == 0:
        raise RequestFieldError("the prompt is empty: give at least one token", prompt_field)
    if prompt_len >= context_length:
        raise RequestFieldError(f"the prompt has {prompt_len} tokens; the model's "
                                f"context_length is {context_length} and at least one token "
                                "must be generated", prompt_field)
    if prompt_len + max_new_tokens > context_length:
        raise RequestFieldError(f"prompt ({prompt_len} tokens) + max_new_tokens "
                                f"({max_new_tokens}) exceed the model's context_length "
                                f"({context_length}): lower max_new_tokens to at most "
                                f"{context_length - prompt_len}", "max_new_tokens")
    if prompt_len + max_new_tokens > pool_tokens:
        raise RequestFieldError(f"prompt ({prompt_len} tokens) + max_new_tokens "
                                f"({max_new_tokens}) exceed the KV pool ({pool_tokens} tokens): "
                                "lower max_new_tokens or raise max_total_tokens",
                                "max_new_tokens")


def validate_token_ids(ids: Sequence[int], vocab: int, field: str = "input_ids") -> None:
    """Every id is an int in [0, vocab): an id past the embedding table would fail the whole
    batch's forward, not just this request."""
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise RequestFieldError(f"{field}[{i}] = {t!r} is not a token id in [0, {vocab})",
                                    field)


def validate_logprobs(*, top_logprobs_num: int, token_ids_logprob: Sequence[int] | None,
                      logprob_start_len: int, return_logprob: bool, prompt_len: int,
                      max_new_tokens: int, max_logprobs: int, max_entries: int) -> None:
    """top_logprobs_num is capped by the server's --max-logprobs (vLLM's flag, 20 by default);
    the (token, logprob) entries the request can produce are capped by --max-logprob-entries.

    token_ids_logprob has no cap of its own: scoring a list of label ids is its purpose and
    costs one entry per id and position, so the entry cap bounds it.
    """
    top = top_logprobs_num
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= max_logprobs:
        raise RequestFieldError(f"top_logprobs_num must be an int in [0, {max_logprobs}] (the "
                                f"server's --max-logprobs), got {top!r}", "top_logprobs_num")
    if not isinstance(logprob_start_len, int) or not -1 <= logprob_start_len < max(prompt_len, 1):
        raise RequestFieldError(f"logprob_start_len must be -1 or in [0, {prompt_len - 1}] for "
                                f"a prompt of {prompt_len} tokens, got {logprob_start_len!r}",
                                "logprob_start_len")
    if not return_logprob:
        return
    scored = prompt_len - logprob_start_len if logprob_start_len >= 0 else 0
    per_position = 1 + top + len(token_ids_logprob or ())
    entries = (scored + max_new_tokens) * per_position
    if entries > max_entries:
        field = "token_ids_logprob" if len(token_ids_logprob or ()) > top else "top_logprobs_num"
        raise RequestFieldError(
            f"the request would return {entries} logprob entries ((prompt tokens scored from "
            f"logprob_start_len: {scored} + max_new_tokens: {max_new_tokens}) x (1 + "
            f"top_logprobs_num: {top} + len(token_ids_logprob): "
            f"{len(token_ids_logprob or ())})); the server's --max-logprob-entries is "
            f"{max_entries}: ask for fewer ids or positions (token_ids_logprob has no cap of "
            "its own beyond this one)", field)
