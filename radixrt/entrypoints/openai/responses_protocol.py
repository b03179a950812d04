"""Requests and responses of OpenAI's Responses API (POST /v1/responses): the request's shape
and its validation into errors naming the Responses field, its translation into a chat
completion request (the conversation as chat messages, the flat function tools as chat tools,
`text.format` as response_format), and the response object and output items built from the
chat path's result. The field names are the `openai` package's (openai/types/responses/).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Literal

from pydantic import Field, ValidationError

from radixrt.entrypoints.openai.protocol import ContentPart, Strict, _validation_error
from radixrt.entrypoints.openai.tool_calls import ToolCall
from radixrt.errors import APIError

INPUT_ROLES = ("user", "system", "developer", "assistant")
TEXT_PART_TYPES = ("input_text", "output_text", "text")
# include entries that ask for nothing radixrt makes (no reasoning items exist).
HARMLESS_INCLUDES = ("reasoning.encrypted_content",)


class InputItem(Strict):
    """A message (the default type), a function_call or a function_call_output."""

    type: str = "message"
    role: str | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None


class ToolSpec(Strict):
    """A Responses tool: flat ({"type": "function", "name", "parameters", ...})."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: str | None = None  # a hint to OpenAI's models; nothing to do here


class ResponsesRequest(Strict):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool | None = None
    store: bool | None = None  # null: true, as OpenAI
    previous_response_id: str | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # SGLang's disaggregation fields (SMG adds them to every route): on to the chat request.
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int] | None = None
    # OpenAI's fields that ask for what radixrt does not do: refused when they ask for it.
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None
    top_logprobs: int | None = None
    conversation: Any = None
    prompt: Any = None


def parse_responses_request(body: dict[str, Any]) -> ResponsesRequest:
    """Validate `body`; APIError(400) naming the first bad field and what it accepts."""
    try:
        req = ResponsesRequest.model_validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None
    _check_unsupported(req)
    for i, tool in enumerate(req.tools or []):
        _check_tool(tool, i)
    if isinstance(req.input, list):
        for i, item in enumerate(req.input):
            _check_item(item, i)
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_schema" and not isinstance(fmt.json_schema, dict):
        raise APIError(
            'text.format of type "json_schema" needs "name" and a "schema" object',
            "text.format.schema",
        )
    return req


def _check_unsupported(req: ResponsesRequest) -> None:
    refusals = [
        (req.background, "background", "background responses are not supported"),
        (req.conversation, "conversation", "conversations are not supported: use "
         "previous_response_id or send the whole input"),
        (req.prompt, "prompt", "prompt templates are not supported"),
        (req.top_logprobs, "top_logprobs", "logprobs are not supported on /v1/responses"),
        (req.reasoning and any(v not in (None, "none") for v in req.reasoning.values()),
         "reasoning", "the served model does not reason: leave reasoning out"),
        (req.truncation not in (None, "disabled"), "truncation",
         'only truncation "disabled" is supported: an input beyond the context is a 400'),
    ]  # fmt: skip
    for asked, param, why in refusals:
        if asked:
            raise APIError(f"{param}: {why}", param)
    for i, entry in enumerate(req.include or []):
        if entry not in HARMLESS_INCLUDES:
            raise APIError(f"include {entry!r} is not supported", f"include[{i}]")


def _check_tool(tool: ToolSpec, i: int) -> None:
    if tool.type != "function":
        raise APIError(
            f"tools[{i}] has type {tool.type!r}: only 'function' tools are supported "
            "(built-in tools such as web_search and file_search are not)",
            f"tools[{i}].type",
        )
    if not tool.name:
        raise APIError(f"tools[{i}] needs a name", f"tools[{i}].name")


def _check_item(item: InputItem, i: int) -> None:
    if item.type == "message":
        if item.role not in INPUT_ROLES:
            raise APIError(
                f"input[{i}].role must be one of {list(INPUT_ROLES)}, got {item.role!r}",
                f"input[{i}].role",
            )
    elif item.type == "function_call":
        if not item.call_id or not item.name or item.arguments is None:
            raise APIError(
                f"input[{i}] (a function_call) needs call_id, name and arguments", f"input[{i}]"
            )
    elif item.type == "function_call_output":
        if not item.call_id or item.output is None:
            raise APIError(
                f"input[{i}] (a function_call_output) needs call_id and output", f"input[{i}]"
            )
    else:
        raise APIError(
            f"input[{i}] has type {item.type!r}: supported are 'message', 'function_call' "
            "and 'function_call_output'",
            f"input[{i}].type",
        )


# -- to the chat path ---------------------------------------------------------------------
def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as chat messages (instructions not included: they do not carry
    over to a later response, as OpenAI's do not)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        if item.type == "message":
            messages.append({"role": item.role, "content": _text(item.content, f"input[{i}]")})
        elif item.type == "function_call":
            call = ToolCall(item.name or "", item.arguments or "", item.call_id or "")
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # parallel calls: one turn
                last.setdefault("tool_calls", []).append(call.to_openai())
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": []})
                messages[-1]["tool_calls"].append(call.to_openai())
        else:
            output = _text(item.output, f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    return messages


def _text(content: str | list[ContentPart] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type not in TEXT_PART_TYPES or part.text is None:
            raise APIError(
                f"only text content parts ({', '.join(TEXT_PART_TYPES)}) are supported, "
                f"got {part.type!r}",
                f"{where}.content[{j}].type",
            )
        texts.append(part.text)
    return "\n".join(texts)


def chat_body(req: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion request for `messages` (the whole conversation) under `req`."""
    if req.instructions:
        messages = [{"role": "system", "content": req.instructions}, *messages]
    body: dict[str, Any] = {"messages": messages, "stream": bool(req.stream)}
    for name, value in (
        ("max_completion_tokens", req.max_output_tokens),
        ("temperature", req.temperature),
        ("top_p", req.top_p),
        ("parallel_tool_calls", req.parallel_tool_calls),
        ("user", req.user),
        ("bootstrap_host", req.bootstrap_host),
        ("bootstrap_port", req.bootstrap_port),
        ("bootstrap_room", req.bootstrap_room),
    ):
        if value is not None:
            body[name] = value
    if req.tools:
        body["tools"] = [_chat_tool(tool) for tool in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    fmt = req.text.format if req.text else None
    if fmt is not None:
        body["response_format"] = _response_format(fmt)
    return body


def _chat_tool(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "description": tool.description}
    function.update(parameters=tool.parameters, strict=tool.strict)
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # "none" | "auto" | "required": plan_tools says what else is wrong
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise APIError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            f'"name": ...}}, got {choice!r}',
            "tool_choice",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    spec = {"name": fmt.name or "response", "schema": fmt.json_schema, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": spec}


# The chat path's field names in its errors → the Responses names they came from.
_CHAT_NAMES = (
    (r"\bmax_completion_tokens\b", "max_output_tokens"),
    (r"\bresponse_format\.json_schema\.schema\b", "text.format.schema"),
    (r"\bresponse_format(\.json_schema)?\b", "text.format"),
    (r"\btools\[(\d+)\]\.function\b", r"tools[\1]"),
    (r"\bmessages(\[\d+\])?", "input"),
    (re.escape('"function": {"name": ...}}'), '"name": ...}'),  # tool_choice's flat form
)


def responses_error(exc: APIError) -> APIError:
    """An error of the chat path, its field names those of the Responses request."""

    def rename(text: str) -> str:
        for pattern, name in _CHAT_NAMES:
            text = re.sub(pattern, name, text)
        return text

    param = rename(exc.param) if exc.param else None
    return APIError(rename(exc.message), param, exc.status, exc.err_type, code=exc.code)


# -- the response -------------------------------------------------------------------------
def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def message_item(text: str, status: str = "completed", item_id: str = "") -> dict[str, Any]:
    return {
        "id": item_id or f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text_part(text)],
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(call: ToolCall, status: str = "completed", item_id: str = "") -> dict:
    return {
        "id": item_id or f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def usage(meta: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": meta["cached_tokens"], "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    req: ResponsesRequest, resp_id: str, created_at: int, model: str, **state: Any
) -> dict[str, Any]:
    """The response object; `state`: output, status, usage, incomplete_details (defaults:
    an in-progress response with no output yet)."""
    status = state.get("status", "in_progress")
    fmt = req.text.format if req.text else None
    text_format = fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": None if status == "in_progress" else int(time.time()),
        "background": False,
        "error": None,
        "incomplete_details": state.get("incomplete_details"),
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": None,
        "metadata": req.metadata or {},
        "model": model,
        "output": state.get("output", []),
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": req.store is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": text_format},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or []],
        "top_logprobs": 0,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "usage": state.get("usage"),
        "user": req.user,
    }


def final_status(finish: str | None) -> tuple[str, dict[str, Any] | None]:
    """(status, incomplete_details) of a response whose output ended with chat's
    finish_reason `finish`."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "abort":  # aborted (/abort_request, a server shutting down)
        return "cancelled", None
    return "completed", None


def assistant_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's output items as the chat assistant message that continues its
    conversation (previous_response_id)."""
    text = "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"]
    )
    calls = [
        ToolCall(item["name"], item["arguments"], item["call_id"]).to_openai()
        for item in output
        if item["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message
