"""Requests of the OpenAI API (/v1/completions, /v1/chat/completions): their shapes, their
validation into errors that name the OpenAI field, and their translation into the engine's
SGLang-named sampling parameters.

Unknown fields are accepted and ignored, as the OpenAI API does for forward compatibility (and
as clients that send vendor extensions expect). Types are checked strictly: `"10"` is not an
int and `true` is not a number.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixrt.errors import ParamError
from radixrt.server.http_utils import APIError

MAX_TOP_LOGPROBS = 20  # the OpenAI API's limit for chat top_logprobs
ROLES = ("system", "user", "assistant", "tool", "developer", "function")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _SamplingFields(_Strict):
    """Fields both endpoints share: OpenAI's, then the engine's extras (SGLang's names)."""

    model: str | None = None
    n: int | None = Field(None, ge=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    # >= 1 as vLLM asks: the engine makes one token even for max_new_tokens=0.
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # Extensions, as SGLang and vLLM accept them beside the OpenAI fields.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(None, ge=0)
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    custom_params: dict[str, Any] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None


class ContentPart(_Strict):
    type: str
    text: str | None = None


class CalledFunction(_Strict):
    name: str
    arguments: str | dict[str, Any]  # JSON text (OpenAI); an object is accepted too


class MessageToolCall(_Strict):
    """A call in an assistant message of the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Strict):
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call this answers


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none = no parameters
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}: checked by
    # tool_calls.plan_tools, whose errors say what is allowed.
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's and SGLang's prompt controls: continue the last (assistant) message, or render
    # the conversation without the assistant header that starts a new turn.
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


R = TypeVar("R", bound=BaseModel)

# Type tags pydantic puts in an error's location when a union member fails, e.g.
# ('stop', 'list[str]'): not field names, so they are left out of `param`.
_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|literal)\b|[\[\-]")


def parse_request(model: type[R], body: dict[str, Any]) -> R:
    """Validate `body`; APIError(400) naming the first bad field and what it accepts."""
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None
    _check_common(req)
    return req


def _validation_error(e: ValidationError) -> APIError:
    errors = e.errors(include_url=False)
    param = _param(errors[0]["loc"])
    msgs = [_plain(err["msg"]) for err in errors if _param(err["loc"]) == param]
    value = errors[0].get("input")
    if errors[0]["type"] == "missing":
        return APIError(f"'{param}' is required", param)
    got = f"{type(value).__name__} {_short(value)}"
    return APIError(f"invalid value for '{param}': {' or '.join(dict.fromkeys(msgs))} "
                    f"(got {got})", param)


def _plain(msg: str) -> str:
    """pydantic's wording, shortened: "must be >= 1" for "Input should be greater than or
    equal to 1"."""
    for long, short in (("Input should be", "must be"), ("greater than or equal to", ">="),
                        ("less than or equal to", "<="), ("greater than", ">"),
                        ("less than", "<"), ("List should have", "must have"),
                        (" after validation", "")):
        msg = msg.replace(long, short)
    return msg


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _TAG.search(str(part)):
            out += f".{part}" if out else str(part)
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_common(req: _SamplingFields) -> None:
    # Clients may send null for any optional field: null means the default.
    req.n = req.n or 1
    req.stream = bool(req.stream)
    if isinstance(req, CompletionRequest):
        if req.best_of not in (None, req.n):
            raise APIError(f"best_of must equal n ({req.n}) or be left out: best_of > n is "
                           f"not supported, got {req.best_of}", "best_of")
        if req.suffix:
            raise APIError("suffix is not supported", "suffix")
        if isinstance(req.prompt, list) and not req.prompt:
            raise APIError("'prompt' must not be empty", "prompt")
    else:
        if req.top_logprobs and not req.logprobs:
            raise APIError("top_logprobs needs logprobs set to true", "top_logprobs")
        _check_tool_messages(req.messages)
        _check_continuation(req)
    _check_response_format(req)


def _check_tool_messages(messages: list[ChatMessage]) -> None:
    for i, msg in enumerate(messages):
        if msg.role == "tool" and not msg.tool_call_id:
            raise APIError(f"messages[{i}] has role 'tool' and needs the tool_call_id of the "
                           "call it answers", f"messages[{i}].tool_call_id")


def _check_continuation(req: ChatCompletionRequest) -> None:
    """continue_final_message continues the assistant's last message, so it needs one and
    cannot be combined with a new assistant header (add_generation_prompt)."""
    if not req.continue_final_message:
        return
    last = req.messages[-1].role
    if last != "assistant":
        raise APIError("continue_final_message continues the last message, which must be "
                       f"the assistant's: messages[-1].role is {last!r}",
                       "continue_final_message")
    if req.add_generation_prompt:
        raise APIError("continue_final_message and add_generation_prompt cannot both be "
                       "true: the first continues the last assistant message, the second "
                       "starts a new one", "continue_final_message")


def constraint_extras(req: _SamplingFields) -> list[str]:
    """The engine constraints given as extra fields (regex, ebnf, json_schema)."""
    return [name for name in ("regex", "ebnf", "json_schema") if getattr(req, name) is not None]


def _check_response_format(req: _SamplingFields) -> None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return
    if constraint_extras(req):
        raise APIError(f"response_format {fmt.type!r} cannot be combined with "
                       f"{constraint_extras(req)}: give one constraint", "response_format")
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None or not isinstance(spec.get("name"), str):
            raise APIError('response_format of type "json_schema" needs "json_schema": '
                           '{"name": str, "schema": object, "strict": bool}',
                           "response_format.json_schema")


# -- translation to the engine ------------------------------------------------------------
_SAME_NAMES = ("n", "stop", "temperature", "top_p", "seed", "frequency_penalty",
               "presence_penalty", "logit_bias", "top_k", "min_p", "repetition_penalty",
               "stop_token_ids", "stop_regex", "custom_params", "ignore_eos",
               "skip_special_tokens", "no_stop_trim", "regex", "json_schema", "ebnf")
# Request-level fields of SGLang's OpenAI requests, handed to the engine as they are: it
# serves them, or refuses by name the ones it does not support when they ask for something.
REQUEST_EXTRAS = ("lora_path", "custom_logit_processor", "return_hidden_states",
                  "session_params")


def request_extras(req: _SamplingFields) -> dict[str, Any]:
    """The REQUEST_EXTRAS the client sent (unknown fields land in pydantic's model_extra)."""
    extra = req.model_extra or {}
    return {name: extra[name] for name in REQUEST_EXTRAS if extra.get(name) is not None}


def sampling_params(req: _SamplingFields, max_new_tokens: int) -> dict[str, Any]:
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
    schema = _response_format_schema(req.response_format)
    if schema is not None:
        params["json_schema"] = schema
    return params


def _response_format_schema(fmt: ResponseFormat | None) -> str | None:
    """response_format as the engine's json_schema text: "json_object" is any JSON object,
    "json_schema" its `schema` (always enforced, whatever `strict` says), "text" nothing."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "object"})
    spec = fmt.json_schema or {}
    schema = spec.get("schema", spec.get("schema_"))
    if not isinstance(schema, dict):
        raise APIError("response_format.json_schema.schema must be a JSON schema object",
                       "response_format.json_schema.schema")
    return json.dumps(schema)


def field_names(req: _SamplingFields) -> dict[str, str]:
    """For `rename_engine_error`: the OpenAI field each engine (SGLang) name came from."""
    chat = isinstance(req, ChatCompletionRequest)
    names = {
        "max_new_tokens": "max_completion_tokens" if chat and req.max_completion_tokens
        is not None else "max_tokens",
        "min_new_tokens": "min_tokens",
        "top_logprobs_num": "top_logprobs" if chat else "logprobs",
        "input_ids": "messages" if chat else "prompt",
    }
    if req.response_format is not None and req.json_schema is None:
        names["json_schema"] = "response_format"
    return names


def rename_engine_error(exc: ValueError, names: dict[str, str]) -> APIError:
    """The engine's ValueError, its SGLang field names replaced by the OpenAI ones; `param`
    is the OpenAI name of the ParamError's field (None for another ValueError)."""
    message = str(exc).replace("sampling param ", "")
    for sgl, oai in names.items():
        message = re.sub(rf"\b{sgl}\b", oai, message)
    param = exc.param if isinstance(exc, ParamError) else None
    return APIError(message, None if param is None else names.get(param, param))


@contextlib.contextmanager
def openai_names(names: dict[str, str]) -> Iterator[None]:
    """Checks the OpenAI layer shares with the engine (radixrt/request_limits.py) raise
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
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(m["cached_tokens"] for m in firsts)}}


def clamp_logprob(value: float | None) -> float | None:
    return None if value is None else max(float(value), MIN_LOGPROB)
