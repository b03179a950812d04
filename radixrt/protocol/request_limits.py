"""Limits on what one request may ask of the server, checked twice: by the frontend (a 400
before tokenizing or queueing) and by the scheduler (its socket also takes requests from other
frontends, which must not reach the KV pool unchecked either). Pure checks, no torch: the HTTP
process, the engine, the OpenAI layer and the scheduler all use these, and nothing else.

Every error is a `ParamError` naming the field and the allowed range; a request beyond the
context says "maximum context length" with the code "context_length_exceeded", as OpenAI.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.errors import CONTEXT_LENGTH_EXCEEDED, ParamError


def validate_prompt_len(
    prompt_len: int, context_length: int, prompt_field: str = "input_ids"
) -> None:
    """The prompt is not empty and leaves room for one generated token in the context (cheap:
    callers check it before looking at each id of a long list)."""
    if prompt_len == 0:
        raise ParamError(prompt_field, "the prompt is empty: give at least one token")
    if prompt_len >= context_length:
        raise ParamError(
            prompt_field,
            f"{_context_is(context_length)}, and the prompt ({prompt_field}) has "
            f"{prompt_len} tokens: it must leave room for at least one generated token, "
            f"so it may have at most {context_length - 1}",
            CONTEXT_LENGTH_EXCEEDED,
        )


def validate_request_size(
    prompt_len: int,
    max_new_tokens: int,
    context_length: int,
    pool_tokens: int,
    prompt_field: str = "input_ids",
) -> None:
    """The prompt and its generation fit the model's context and the KV pool. `prompt_field`:
    the field the prompt came in (text or input_ids), named by the errors about its length.
    Both limits are the context a client can use, so both errors have the code
    CONTEXT_LENGTH_EXCEEDED and a message that says "maximum context length"."""
    validate_prompt_len(prompt_len, context_length, prompt_field)
    wanted = f"the prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens})"
    if prompt_len + max_new_tokens > context_length:
        raise ParamError(
            "max_new_tokens",
            f"{_context_is(context_length)}, and {wanted} need "
            f"{prompt_len + max_new_tokens}: lower max_new_tokens to at most "
            f"{context_length - prompt_len}",
            CONTEXT_LENGTH_EXCEEDED,
        )
    if prompt_len + max_new_tokens > pool_tokens:
        fix = (
            f"lower max_new_tokens to at most {pool_tokens - prompt_len}"
            if prompt_len < pool_tokens
            else f"shorten the prompt ({prompt_field})"
        )
        raise ParamError(
            "max_new_tokens",
            f"This server's KV pool holds {pool_tokens} tokens, so this model's maximum "
            f"context length is {pool_tokens} tokens here, and {wanted} need "
            f"{prompt_len + max_new_tokens}: {fix}, or start the server with a larger "
            "--max-total-tokens",
            CONTEXT_LENGTH_EXCEEDED,
        )


def _context_is(context_length: int) -> str:
    # OpenAI's and vLLM's opening words, the ones clients (litellm) recognise.
    return f"This model's maximum context length is {context_length} tokens (context_length)"


def validate_token_ids(
    ids: Sequence[int], vocab: int, field: str = "input_ids", param: str | None = None
) -> None:
    """Every id is an int in [0, vocab): an id past the embedding table would fail the whole
    batch's forward, not just this request. The error says `field`[i] and names `param`
    (default: `field`; e.g. field "prompt[1]" of param "prompt")."""
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise ParamError(
                param or field, f"{field}[{i}] = {t!r} is not a token id in [0, {vocab})"
            )


def validate_logprobs(
    *,
    top_logprobs_num: int,
    token_ids_logprob: Sequence[int] | None,
    logprob_start_len: int,
    return_logprob: bool,
    prompt_len: int,
    max_new_tokens: int,
    max_logprobs: int,
    max_entries: int,
) -> None:
    """top_logprobs_num is capped by the server's --max-logprobs (vLLM's flag, 20 by default);
    the (token, logprob) entries the request can produce are capped by --max-logprob-entries.

    token_ids_logprob has no cap of its own: scoring a list of label ids is its purpose and
    costs one entry per id and position, so the entry cap bounds it.
    """
    top = top_logprobs_num
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= max_logprobs:
        raise ParamError(
            "top_logprobs_num",
            f"top_logprobs_num must be an int in [0, "
            f"{max_logprobs}] (the server's --max-logprobs), got {top!r}",
        )
    if not isinstance(logprob_start_len, int) or not -1 <= logprob_start_len < max(prompt_len, 1):
        raise ParamError(
            "logprob_start_len",
            f"logprob_start_len must be -1 or in [0, "
            f"{prompt_len - 1}] for a prompt of {prompt_len} tokens, got "
            f"{logprob_start_len!r}",
        )
    if not return_logprob:
        return
    scored = prompt_len - logprob_start_len if logprob_start_len >= 0 else 0
    ids_count = len(token_ids_logprob or ())
    entries = (scored + max_new_tokens) * (1 + top + ids_count)
    if entries > max_entries:
        raise ParamError(
            "token_ids_logprob" if ids_count > top else "top_logprobs_num",
            f"the request would return {entries} logprob entries ((prompt tokens scored from "
            f"logprob_start_len: {scored} + max_new_tokens: {max_new_tokens}) x (1 + "
            f"top_logprobs_num: {top} + len(token_ids_logprob): {ids_count})); the server's "
            f"--max-logprob-entries is {max_entries}: ask for fewer ids or positions "
            "(token_ids_logprob has no cap of its own beyond this one)",
        )


def validate_beam_search(
    width: int,
    prompt_len: int,
    max_new_tokens: int,
    *,
    return_logprob: bool,
    stream: bool,
    tp_size: int,
    max_running_requests: int,
    page_size: int,
    pool_tokens: int,
) -> None:
    """What beam search (width > 1) does not take, as a ParamError naming the field, and a
    group that could not fit the pool even alone: its prompt plus, per beam, its longest
    length and a page."""
    if width <= 1:
        return
    if return_logprob:
        raise ParamError("return_logprob", "return_logprob cannot be used with beam search")
    if stream:
        raise ParamError(
            "stream", "beam search returns its beams when it ends: stream must be false"
        )
    if tp_size > 1:
        raise ParamError("beam_width", "beam search does not run with tensor parallelism yet")
    if width > max_running_requests:
        raise ParamError(
            "beam_width",
            f"beam_width {width} exceeds the server's --max-running-requests "
            f"({max_running_requests}): each beam is a running request",
        )
    need = prompt_len + width * (max_new_tokens + page_size)
    if need > pool_tokens:
        raise ParamError(
            "max_new_tokens",
            f"a beam search of width {width} over {prompt_len} prompt tokens and "
            f"{max_new_tokens} new tokens may hold {need} tokens of KV; the pool has "
            f"{pool_tokens}",
        )


# SGLang's bootstrap fields (prefill/decode disaggregation). SMG draws each room as
# `u64 & i64::MAX`, and SGLang's transfer engines keep rooms as signed 64-bit ints.
BOOTSTRAP_ROOM_MAX = (1 << 63) - 1


def validate_bootstrap(host: object, port: object, room: object, mode: str) -> None:
    """One request's bootstrap as a scheduler message carries it, on a server in
    --disaggregation-mode `mode`: the checks below."""
    validate_disaggregated("bootstrap_room", mode)
    validate_bootstrap_host(host)
    validate_bootstrap_port(port)
    validate_bootstrap_room(room)


def validate_disaggregated(field: str, mode: str) -> None:
    """Bootstrap fields (`field`, the first one given) need a prefill or decode server."""
    if mode == "null":
        raise ParamError(
            field,
            f"{field} is for prefill/decode disaggregation, and this server is not "
            "disaggregated (--disaggregation-mode null): start the servers with "
            "--disaggregation-mode prefill and decode, or leave out bootstrap_host, "
            "bootstrap_port and bootstrap_room",
        )


def validate_no_beam_search_disaggregated(width: int) -> None:
    """Beam search keeps its beams on one server: it cannot be split over a pair."""
    if width > 1:
        raise ParamError(
            "beam_width",
            f"beam search (beam_width {width}) does not run on a disaggregated server: "
            "send it without bootstrap_host, bootstrap_port and bootstrap_room",
        )


def validate_bootstrap_host(host: object, where: str = "") -> None:
    """A non-empty string: the prefill server's host, as the decode server reaches it."""
    if not isinstance(host, str) or not host.strip():
        raise ParamError(
            "bootstrap_host",
            f"bootstrap_host{where} must be a non-empty string (the prefill server's host), "
            f"got {host!r:.80}",
        )


def validate_bootstrap_port(port: object, where: str = "") -> None:
    """An int in 1..65535 (a request's null was replaced by the server's own port)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ParamError(
            "bootstrap_port",
            f"bootstrap_port{where} must be an int in 1..65535, or null for this server's "
            f"--disaggregation-bootstrap-port, got {port!r:.80}",
        )


def validate_bootstrap_room(room: object, where: str = "") -> None:
    """An int in 0..2**63-1: the id the prefill and decode servers know the transfer by."""
    if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room <= BOOTSTRAP_ROOM_MAX:
        raise ParamError(
            "bootstrap_room",
            f"bootstrap_room{where} must be an int in 0..{BOOTSTRAP_ROOM_MAX} (2**63-1), "
            f"got {room!r:.80}",
        )
