"""The OpenAI API and the engine, translated: a request's fields into the engine's
SGLang-named sampling parameters, the engine's errors back into OpenAI's field names, and the
engine's results into OpenAI's response fields (finish_reason, usage, logprobs)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

from radixrt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ResponseFormat,
    SamplingFields,
)
from radixrt.errors import APIError, ParamError

_SAME_NAMES = (
    "n",
    "stop",
    "temperature",
    "top_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_token_ids",
    "stop_regex",
    "custom_params",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "regex",
    "json_schema",
    "ebnf",
)
# Request-level fields of SGLang's OpenAI requests, handed to the engine as they are: it
# serves them, or refuses by name the ones it does not support when they ask for something.
REQUEST_EXTRAS = ("lora_path", "custom_logit_processor", "return_hidden_states", "session_params")


# SGLang's bootstrap fields (typed fields of SamplingFields): passed on when set; the engine
# expands them to one per request and checks them (radixrt/frontend/bootstrap.py).
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def request_extras(req: SamplingFields) -> dict[str, Any]:
    """The REQUEST_EXTRAS the client sent (unknown fields land in pydantic's model_extra),
    and the bootstrap fields it set."""
    extra = req.model_extra or {}
    fields = {name: extra[name] for name in REQUEST_EXTRAS if extra.get(name) is not None}
    for name in BOOTSTRAP_FIELDS:
        if getattr(req, name) is not None:
            fields[name] = getattr(req, name)
    return fields


def sampling_params(req: SamplingFields, max_new_tokens: int) -> dict[str, Any]:
    """The engine's sampling_params dict: only the fields the client set (the engine's
    defaults are OpenAI's), under SGLang's names."""
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for name in _SAME_NAMES:
        value = getattr(req, name)
        if value is not None:
            params[name] = value
    if params.get("stop") == []:
        del params["stop"]
    if req.min_tokens is not None:
        params["min_new_tokens"] = req.min_tokens
    if req.use_beam_search:  # as vLLM: n beams, every one returned
        params["beam_width"] = req.n or 1
    for name in ("length_penalty", "early_stopping"):
        if getattr(req, name) is not None:
            params[name] = getattr(req, name)
    schema = _response_format_schema(req.response_format)
    if schema is not None:
        params["json_schema"] = schema
    return params


def _response_format_schema(fmt: ResponseFormat | None) -> str | None:
    """response_format as the engine's json_schema text: "json_object" is any JSON object (or
    its `schema`, where one is given), "json_schema" its `schema` (always enforced, whatever
    `strict` says), "text" nothing."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps(fmt.schema_ if fmt.schema_ is not None else {"type": "object"})
    spec = fmt.json_schema or {}
    schema = spec.get("schema", spec.get("schema_"))
    if not isinstance(schema, dict):
        raise APIError(
            "response_format.json_schema.schema must be a JSON schema object",
            "response_format.json_schema.schema",
        )
    return json.dumps(schema)


def field_names(req: SamplingFields) -> dict[str, str]:
    """For `rename_engine_error`: the OpenAI field each engine (SGLang) name came from."""
    chat = isinstance(req, ChatCompletionRequest)
    named_completion = (
        isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None
    )
    names = {
        "max_new_tokens": "max_completion_tokens" if named_completion else "max_tokens",
        "min_new_tokens": "min_tokens",
        "beam_width": "n",  # use_beam_search keeps n beams
        "top_logprobs_num": "top_logprobs" if chat else "logprobs",
        "input_ids": "messages" if chat else "prompt",
    }
    if req.response_format is not None and req.json_schema is None:
        names["json_schema"] = "response_format"
    return names


def rename_engine_error(exc: ValueError, names: dict[str, str]) -> APIError:
    """The engine's ValueError, its SGLang field names replaced by the OpenAI ones; `param`
    is the OpenAI name of the ParamError's field and `code` its code (None for another
    ValueError)."""
    message = str(exc).replace("sampling param ", "")
    for sgl, oai in names.items():
        message = re.sub(rf"\b{sgl}\b", oai, message)
    if not isinstance(exc, ParamError):
        return APIError(message)
    param = None if exc.param is None else names.get(exc.param, exc.param)
    return APIError(message, param, code=exc.code)


@contextlib.contextmanager
def openai_names(names: dict[str, str]) -> Iterator[None]:
    """Checks the OpenAI layer shares with the engine (radixrt/protocol/request_limits.py) raise
    ParamError with SGLang's names: inside this block they come out as APIError with the
    OpenAI ones."""
    try:
        yield
    except ParamError as exc:
        raise rename_engine_error(exc, names) from None


# -- responses ----------------------------------------------------------------------------
MIN_LOGPROB = -9999.0  # what the OpenAI API reports for -inf; JSON has no infinity


def finish_reason(meta: dict[str, Any], tool_calls: bool = False) -> str | None:
    """The engine's {"type": ...} as OpenAI's string: "stop", "length" or "abort"; a choice
    that stopped with tool calls in it says "tool_calls"."""
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    return "tool_calls" if tool_calls and reason["type"] == "stop" else reason["type"]


def matched_stop(meta: dict[str, Any]) -> int | str | None:
    """The stop string or token id that ended the output (SGLang's extra choice field)."""
    reason = meta.get("finish_reason") or {}
    return reason.get("matched") if reason.get("type") == "stop" else None


def usage(metas: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Usage over outputs in prompt-major order, n per prompt. A prompt and its cached part
    count once per prompt (from its first output), as the OpenAI API counts n > 1."""
    firsts = metas[::n]
    prompt = sum(m["prompt_tokens"] for m in firsts)
    completion = sum(m["completion_tokens"] for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(m["cached_tokens"] for m in firsts)},
    }


def clamp_logprob(value: float | None) -> float | None:
    return None if value is None else max(float(value), MIN_LOGPROB)
