"""One validated OpenAI request (a Job): the engine call it makes, and the response bodies its
results make when it is not streamed (streams: stream.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixrt.entrypoints.openai import translate
from radixrt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixrt.entrypoints.openai.stream import (
    TokenTexts,
    chat_logprobs,
    completion_entries,
    completion_logprobs,
)
from radixrt.entrypoints.openai.tool_calls import ToolPlan, read_calls


@dataclass
class Job:
    """One validated request, ready for the engine."""

    req: ChatCompletionRequest | CompletionRequest
    ids: list[list[int]]  # token ids per prompt
    batch: bool  # several prompts (a list), as opposed to one
    max_new_tokens: int
    names: dict[str, str]  # engine field name → OpenAI field name, for errors
    prompt_texts: list[str] = field(default_factory=list)  # for echo
    id: str = ""  # unguessable (uuid4): the rid /abort_request takes
    created: int = 0
    model: str = ""
    tools: ToolPlan | None = None  # chat requests with tools
    kwargs: dict[str, Any] = field(default_factory=dict)  # the engine call's arguments

    @property
    def chat(self) -> bool:
        return isinstance(self.req, ChatCompletionRequest)

    @property
    def n(self) -> int:
        """Outputs per prompt (parse_request turned a null n into 1)."""
        return self.req.n or 1


def engine_kwargs(job: Job, special_call_marker: bool) -> dict[str, Any]:
    """The engine call's arguments. `special_call_marker`: the model's tool-call marker is a
    special token, which "auto" must keep in the text to find the calls."""
    req = job.req
    if isinstance(req, ChatCompletionRequest):
        want_logprobs, top, echo_logprobs = bool(req.logprobs), req.top_logprobs or 0, False
    else:
        want_logprobs, top = req.logprobs is not None, req.logprobs or 0
        echo_logprobs = bool(req.echo) and want_logprobs
    rid = [f"{job.id}-{i}" for i in range(len(job.ids))] if job.batch else job.id
    params = translate.sampling_params(req, job.max_new_tokens)
    constraint = job.tools.constraint if job.tools is not None else None
    if constraint is not None:  # a forced call's schema, or auto's structural tag
        params[constraint[0]] = constraint[1]
    if job.tools is not None and job.tools.mode == "auto" and special_call_marker:
        params.setdefault("skip_special_tokens", False)
    return {
        "input_ids": job.ids if job.batch else job.ids[0],
        "sampling_params": params,
        "return_logprob": want_logprobs,
        "top_logprobs_num": top,
        "logprob_start_len": 0 if echo_logprobs else None,
        "rid": rid,
        **translate.request_extras(req),
    }


def chat_response(job: Job, outs: list[dict[str, Any]], texts: TokenTexts) -> dict[str, Any]:
    """The chat.completion body of the engine's results, one per choice."""
    choices = []
    for i, out in enumerate(outs):
        meta = out["meta_info"]
        logprobs = None
        if job.req.logprobs:
            logprobs = chat_logprobs(
                texts, meta["output_token_logprobs"], meta["output_top_logprobs"]
            )
        parsed = read_calls(job.tools, out["text"])
        message: dict[str, Any] = {
            "role": "assistant",
            "content": parsed.content,
            "reasoning_content": None,
        }
        if parsed.calls:
            message["tool_calls"] = [call.to_openai() for call in parsed.calls]
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": translate.finish_reason(meta, bool(parsed.calls)),
                "matched_stop": translate.matched_stop(meta),
            }
        )
    return {
        "id": job.id,
        "object": "chat.completion",
        "created": job.created,
        "model": job.model,
        "choices": choices,
        "usage": translate.usage([o["meta_info"] for o in outs], job.n),
    }


def completion_response(job: Job, outs: list[dict[str, Any]], texts: TokenTexts) -> dict[str, Any]:
    """The text_completion body of the engine's results, n per prompt in prompt order."""
    choices = []
    req = job.req
    assert isinstance(req, CompletionRequest), "a completion job holds a CompletionRequest"
    for i, out in enumerate(outs):
        meta = out["meta_info"]
        prefix = job.prompt_texts[i // job.n] if req.echo else ""
        logprobs = None
        if req.logprobs is not None:
            entries = completion_entries(meta, bool(req.echo))
            logprobs, _ = completion_logprobs(texts, *entries, offset=0)
        choices.append(
            {
                "index": i,
                "text": prefix + out["text"],
                "logprobs": logprobs,
                "finish_reason": translate.finish_reason(meta),
                "matched_stop": translate.matched_stop(meta),
            }
        )
    return {
        "id": job.id,
        "object": "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": choices,
        "usage": translate.usage([o["meta_info"] for o in outs], job.n),
    }
