"""A chat completion request as the tokenizer's chat template takes it: its messages as the
template expects them, the template's keyword arguments, the rendered prompt's token ids
(and whether the template showed the model the request's tools), and the conversation's
size in characters (bounded before anything is rendered).

The template is the tokenizer's own, or the one --chat-template put in its place when the
tokenizer was loaded (chat_template_loader.py): every renderer (this, /tokenize, the DSL)
reads `tokenizer.chat_template`."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from radixrt.entrypoints.http_utils import check_json_value
from radixrt.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from radixrt.errors import APIError

_RESERVED = {"conversation", "tokenize"}  # apply_chat_template arguments the server passes


class ChatPrompt(NamedTuple):
    ids: list[int]  # the rendered prompt's token ids
    # Tools were given, but the template renders the same text without them: the model never
    # sees the functions (SmolLM2's own template, for one, ignores `tools`).
    tools_ignored: bool


def chat_prompt(tokenizer: Any, req: ChatCompletionRequest) -> ChatPrompt:
    """The rendered chat template's token ids; APIError naming `messages` when the template
    cannot render them. The template's text is tokenized without adding special tokens: a
    BOS, where the model wants one, is in the template."""
    messages = [template_message(m, i) for i, m in enumerate(req.messages)]
    taken = sorted(_RESERVED & set(req.chat_template_kwargs or {}))
    if taken:
        raise APIError(
            f"chat_template_kwargs cannot set {taken}: the server renders the "
            "conversation to text itself",
            "chat_template_kwargs",
        )
    # continue_final_message: the last (assistant) message stays open, no new header.
    proceed = bool(req.continue_final_message)
    kwargs = {
        "add_generation_prompt": not proceed and req.add_generation_prompt is not False,
        "continue_final_message": proceed,
        **(req.chat_template_kwargs or {}),
    }
    text = _render(tokenizer, messages, kwargs)
    ignored = False
    if req.tools:
        tools = [tool.model_dump(exclude_none=True) for tool in req.tools]
        with_tools = _render(tokenizer, messages, {**kwargs, "tools": tools})
        ignored, text = with_tools == text, with_tools
    return ChatPrompt(tokenizer.encode(text, add_special_tokens=False), ignored)


def _render(tokenizer: Any, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - no template, or the template's own raise
        raise APIError(f"the chat template cannot render these messages: {e}", "messages") from None
    if not isinstance(text, str):
        raise APIError(
            "chat_template_kwargs made the chat template return "
            f"{type(text).__name__}, not the prompt's text",
            "chat_template_kwargs",
        )
    return text


def conversation_chars(req: ChatCompletionRequest) -> int:
    """Characters of the messages' text (contents, names, tool-call arguments) and tools."""
    total = 0
    for msg in req.messages:
        content = msg.content
        if isinstance(content, list):
            total += sum(len(part.text or "") for part in content)
        else:
            total += len(content or "")
        total += len(msg.name or "")
        for call in msg.tool_calls or []:
            args = call.function.arguments
            total += len(args) if isinstance(args, str) else len(json.dumps(args))
    if req.tools:
        total += sum(len(json.dumps(tool.model_dump(exclude_none=True))) for tool in req.tools)
    return total


def template_message(msg: ChatMessage, i: int) -> dict[str, Any]:
    """A message as chat templates expect it: content a string (text parts joined by
    newlines); "developer" (OpenAI's newer name for system) as "system"; the arguments of
    assistant tool_calls as objects (transformers' templates apply `tojson` to them)."""
    out = msg.model_dump(exclude_none=True)
    if msg.role == "developer":
        out["role"] = "system"
    for j, call in enumerate(out.get("tool_calls", [])):
        call["function"]["arguments"] = _arguments_object(
            call["function"]["arguments"], f"messages[{i}].tool_calls[{j}].function.arguments"
        )
    content = msg.content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.type != "text" or part.text is None:
                raise APIError(
                    f"only text content parts are supported, got {part.type!r}",
                    f"messages[{i}].content[{j}].type",
                )
            texts.append(part.text)
        content = "\n".join(texts)
    out["content"] = content or ""
    return out


def _arguments_object(arguments: str | dict[str, Any], param: str) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
        check_json_value(value)
    except RecursionError:
        raise APIError(f"{param} is nested too deeply", param) from None
    except (ValueError, APIError) as e:  # not JSON, or too deep for check_json_value
        raise APIError(f"{param} must be JSON text of an object: {e}", param) from None
    if not isinstance(value, dict):
        raise APIError(f"{param} must be JSON text of an object, got {arguments[:60]!r}", param)
    return value
