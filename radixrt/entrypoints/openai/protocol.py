"""Requests of the OpenAI API (/v1/completions, /v1/chat/completions): their shapes, their
validation into errors that name the OpenAI field, and their translation into the engine's
SGLang-named sampling parameters (translate.py).

Unknown fields are accepted and ignored, as the OpenAI API does for forward compatibility (and
as clients that send vendor extensions expect). Types are checked strictly: `"10"` is not an
int and `true` is not a number.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixrt.errors import APIError

MAX_TOP_LOGPROBS = 20  # the OpenAI API's limit for chat top_logprobs
ROLES = ("system", "user", "assistant", "tool", "developer", "function")


class Strict(BaseModel):
    """Unknown fields kept (and ignored), known ones type-checked strictly: the base of every
    OpenAI request model, chat, completions and Responses alike."""

    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None
    # With "json_object": Together's and Fireworks' field (instructor's JSON_SCHEMA mode sends it).
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class SamplingFields(Strict):
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
    # vLLM's beam search fields: n beams are kept and all n returned (docs/beam_search.md).
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None
    # SGLang's prefill/decode disaggregation fields, which SMG adds for a pair of servers
    # (one value, or one per prompt or per choice: radixrt/frontend/bootstrap.py).
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int] | None = None


class ContentPart(Strict):
    type: str
    text: str | None = None


class CalledFunction(Strict):
    name: str
    arguments: str | dict[str, Any]  # JSON text (OpenAI); an object is accepted too


class MessageToolCall(Strict):
    """A call in an assistant message of the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(Strict):
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call this answers


class FunctionDef(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none = no parameters
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class ChatCompletionRequest(SamplingFields):
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


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


R = TypeVar("R", bound=SamplingFields)

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
    return APIError(
        f"invalid value for '{param}': {' or '.join(dict.fromkeys(msgs))} (got {got})", param
    )


def _plain(msg: str) -> str:
    """pydantic's wording, shortened: "must be >= 1" for "Input should be greater than or
    equal to 1"."""
    for long, short in (
        ("Input should be", "must be"),
        ("greater than or equal to", ">="),
        ("less than or equal to", "<="),
        ("greater than", ">"),
        ("less than", "<"),
        ("List should have", "must have"),
        (" after validation", ""),
    ):
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


def _check_common(req: SamplingFields) -> None:
    # Clients may send null for any optional field: null means the default.
    req.n = req.n or 1
    req.stream = bool(req.stream)
    if isinstance(req, CompletionRequest):
        if req.best_of not in (None, req.n):
            raise APIError(
                f"best_of must equal n ({req.n}) or be left out: best_of > n is "
                f"not supported, got {req.best_of}",
                "best_of",
            )
        if req.suffix:
            raise APIError("suffix is not supported", "suffix")
        if isinstance(req.prompt, list) and not req.prompt:
            raise APIError("'prompt' must not be empty", "prompt")
    elif isinstance(req, ChatCompletionRequest):
        if req.top_logprobs and not req.logprobs:
            raise APIError("top_logprobs needs logprobs set to true", "top_logprobs")
        _check_tool_messages(req.messages)
        _check_continuation(req)
    _check_response_format(req)


def _check_tool_messages(messages: list[ChatMessage]) -> None:
    for i, msg in enumerate(messages):
        if msg.role == "tool" and not msg.tool_call_id:
            raise APIError(
                f"messages[{i}] has role 'tool' and needs the tool_call_id of the call it answers",
                f"messages[{i}].tool_call_id",
            )


def _check_continuation(req: ChatCompletionRequest) -> None:
    """continue_final_message continues the assistant's last message, so it needs one and
    cannot be combined with a new assistant header (add_generation_prompt)."""
    if not req.continue_final_message:
        return
    last = req.messages[-1].role
    if last != "assistant":
        raise APIError(
            "continue_final_message continues the last message, which must be "
            f"the assistant's: messages[-1].role is {last!r}",
            "continue_final_message",
        )
    if req.add_generation_prompt:
        raise APIError(
            "continue_final_message and add_generation_prompt cannot both be "
            "true: the first continues the last assistant message, the second "
            "starts a new one",
            "continue_final_message",
        )


def constraint_extras(req: SamplingFields) -> list[str]:
    """The engine constraints given as extra fields (regex, ebnf, json_schema)."""
    return [name for name in ("regex", "ebnf", "json_schema") if getattr(req, name) is not None]


def _check_response_format(req: SamplingFields) -> None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return
    if constraint_extras(req):
        raise APIError(
            f"response_format {fmt.type!r} cannot be combined with "
            f"{constraint_extras(req)}: give one constraint",
            "response_format",
        )
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None or not isinstance(spec.get("name"), str):
            raise APIError(
                'response_format of type "json_schema" needs "json_schema": '
                '{"name": str, "schema": object, "strict": bool}',
                "response_format.json_schema",
            )
