"""SGLang's "API speculative execution" (`@function(num_api_spec_tokens=N)`), and the token
usage counter it is measured with (`backend.token_usage`).

With N set, a gen that finds no speculated text left asks for at least N tokens with no stop
string, keeps the text up to its first stop string, and saves the rest; the program's next
constant text consumes the saved text while it matches, and the next gen is answered from what
is left, without a request. A program whose format the model follows thus costs one request
instead of one per gen. The rules (characters, not tokens, for max_new_tokens) are SGLang's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenUsage:
    """Prompt and completion tokens of every request a backend sent (SGLang's token_usage)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, meta: dict[str, Any]) -> None:
        with self._lock:
            self.prompt_tokens += meta.get("prompt_tokens", 0) or 0
            self.completion_tokens += meta.get("completion_tokens", 0) or 0

    def reset(self) -> None:
        with self._lock:
            self.prompt_tokens = self.completion_tokens = 0


class Speculation:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.text = ""  # generated ahead, not yet used

    def on_fill(self, value: str) -> None:
        """The program appended constant text: consume it from the speculated text if it
        matches, else the speculation was wrong and is dropped."""
        self.text = self.text[len(value) :] if self.text.startswith(value) else ""

    def gen(
        self, generate: Callable[[dict[str, Any]], dict[str, Any]], params: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        """(this gen's text, the meta_info of the request made, or None if none was)."""
        max_chars = params.get("max_new_tokens", 128)
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        meta = None
        if (not stops and len(self.text) < max_chars) or (stops and not self.text):
            request = {**params, "max_new_tokens": max(max_chars, self.num_tokens)}
            request.pop("stop", None)
            result = generate(request)
            self.text, meta = result["text"], result["meta_info"]
        end = _first_stop(self.text, stops) if stops else max_chars
        if end < 0:
            end = min(max_chars, len(self.text))
        value, self.text = self.text[:end], self.text[end:]
        return value, meta


def _first_stop(text: str, stops: list[str]) -> int:
    found = [p for p in (text.find(s) for s in stops) if p >= 0]
    return min(found) if found else -1
