"""A GenerateReq becomes a scheduler Req: the frontend's checks, made again (the scheduler's
socket also takes other frontends' messages, and a bad request must not reach the pool)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from radixrt.grammar.constraint import constraint_of
from radixrt.protocol.messages import GenerateReq
from radixrt.protocol.request_limits import (
    validate_beam_search,
    validate_bootstrap,
    validate_logprobs,
    validate_no_beam_search_disaggregated,
    validate_request_size,
    validate_token_ids,
)
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.components import Components
from radixrt.scheduler.req import Req
from radixrt.server_args import ServerArgs


def make_req(msg: GenerateReq, args: ServerArgs, parts: Components, arrivals: Iterator[int]) -> Req:
    """The scheduler's Req for `msg`, checked again (ValueError naming what is wrong); it
    takes its arrival order from `arrivals` only once it passed. The engine validated it
    already, but the scheduler's socket also takes other frontends' requests (the server's
    ZeroMQ frontend, the DSL)."""
    params = SamplingParams.from_dict(msg.sampling_params)
    params.fill_max_new_tokens(min(parts.context_length, parts.pool_tokens) - len(msg.input_ids))
    max_new = params.max_new_tokens
    assert max_new is not None, "fill_max_new_tokens gives every request one"
    vocab = parts.model_config.vocab_size
    params.verify(vocab)
    if constraint_of(params) is not None and parts.tokenizer is None:
        raise ValueError(
            "structured generation (regex, json_schema, ebnf) needs a "
            "tokenizer: this server runs with skip_tokenizer_init"
        )
    validate_request_size(len(msg.input_ids), max_new, parts.context_length, parts.pool_tokens)
    validate_beam_search(
        params.beam_width or 1,
        len(msg.input_ids),
        max_new,
        return_logprob=msg.return_logprob,
        stream=msg.stream,
        tp_size=args.tp_size,
        max_running_requests=args.max_running_requests,
        page_size=args.page_size,
        pool_tokens=parts.pool_tokens,
    )
    validate_token_ids(msg.input_ids, vocab)
    if msg.bootstrap is not None:
        boot = msg.bootstrap
        validate_bootstrap(boot.host, boot.port, boot.room, args.disaggregation_mode)
        validate_no_beam_search_disaggregated(params.beam_width or 1)
    validate_token_ids(msg.token_ids_logprob or [], vocab, "token_ids_logprob")
    validate_logprobs(
        top_logprobs_num=msg.top_logprobs_num,
        token_ids_logprob=msg.token_ids_logprob,
        logprob_start_len=msg.logprob_start_len,
        return_logprob=msg.return_logprob,
        prompt_len=len(msg.input_ids),
        max_new_tokens=max_new,
        max_logprobs=args.max_logprobs,
        max_entries=args.max_logprob_entries,
    )
    gen = None
    if params.seed is not None:
        gen = torch.Generator(device=parts.device).manual_seed(params.seed)
    return Req(
        msg.rid,
        list(msg.input_ids),
        params,
        msg.return_logprob,
        msg.logprob_start_len,
        msg.top_logprobs_num,
        msg.stream,
        gen,
        arrival_order=next(arrivals),
        token_ids_logprob=msg.token_ids_logprob,
    )
