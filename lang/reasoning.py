"""Reasoning formats for `separate_reasoning`: how a reasoning model marks its thinking.

SGLang's frontend splits an assistant turn into reasoning_content and the answer with the
server's reasoning parser for a `model_type`. radixrt's DSL does the same split on the text
alone, for the formats that are a pair of think markers (the common case: DeepSeek-R1, Qwen3,
Kimi, ...). A model whose chat template opens the think block itself ("forced") writes no start
marker, so everything before the end marker is reasoning.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class ReasoningFormat(NamedTuple):
    start: str
    end: str
    forced: bool  # the reasoning starts at once, without the start marker


_THINK = ("<think>", "</think>")
REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": ReasoningFormat(*_THINK, forced=True),
    "qwen3": ReasoningFormat(*_THINK, forced=False),
    "qwen3-thinking": ReasoningFormat(*_THINK, forced=True),
    "glm45": ReasoningFormat(*_THINK, forced=False),
    "step3": ReasoningFormat(*_THINK, forced=True),
    "minimax": ReasoningFormat(*_THINK, forced=True),
    "nanbeige": ReasoningFormat(*_THINK, forced=False),
    "interns1": ReasoningFormat(*_THINK, forced=False),
    "dots": ReasoningFormat(*_THINK, forced=False),
    "kimi": ReasoningFormat("\u25c1think\u25b7", "\u25c1/think\u25b7", forced=False),
}
# Model paths that name a reasoning model (checked in order; the first match wins).
_PATH_PATTERNS = [
    (r"deepseek-r1", "deepseek-r1"),
    (r"qwen3.*thinking", "qwen3-thinking"),
    (r"qwen3|qwq", "qwen3"),
    (r"glm-?4\.5", "glm45"),
    (r"kimi", "kimi"),
    (r"step-?3", "step3"),
    (r"minimax-m", "minimax"),
]


class ReasoningSplit(NamedTuple):
    reasoning: str
    answer: str


def check_model_type(model_type: str) -> ReasoningFormat:
    """The format of `model_type`; ValueError naming the allowed values otherwise."""
    fmt = REASONING_FORMATS.get(str(model_type).lower())
    if fmt is None:
        raise ValueError(
            f"separate_reasoning: model_type must be one of "
            f"{', '.join(REASONING_FORMATS)}; got {model_type!r}"
        )
    return fmt


def model_type_of(model_path: str | None) -> str | None:
    """The reasoning format a served model's path suggests, or None (not a reasoning model)."""
    for pattern, model_type in _PATH_PATTERNS:
        if model_path and re.search(pattern, model_path, re.IGNORECASE):
            return model_type
    return None


def split_reasoning(text: str, model_type: str) -> ReasoningSplit:
    """As SGLang's one-shot parse: no reasoning outside a think block; a block never closed
    (the generation was cut short) is all reasoning."""
    fmt = check_model_type(model_type)
    if not fmt.forced and fmt.start not in text:
        return ReasoningSplit("", text)
    body = text
    while body.startswith(fmt.start):
        body = body[len(fmt.start) :]
    if fmt.end not in body:
        return ReasoningSplit(body, "")
    reasoning, answer = body.split(fmt.end, 1)
    return ReasoningSplit(reasoning, answer)
