"""Incremental detokenization: turn a growing list of token ids into text deltas that are safe
to show: no split UTF-8 character, no stop string, not even the start of one."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True, stop: list[str] | None = None,
                 no_stop_trim: bool = False) -> None:
        self.tokenizer = tokenizer
        self.decode_kwargs = {"skip_special_tokens": skip_special_tokens,
                              "spaces_between_special_tokens": spaces_between_special_tokens}
        self.stop = stop or []
        self.no_stop_trim = no_stop_trim
        self.ids: list[int] = []
        self.sent = 0  # characters of text already handed out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, **self.decode_kwargs)

    def add(self, new_ids: list[int]) -> str:
        """Take new ids; return the text delta that can be shown now."""
        self.ids.extend(new_ids)
        text = self._decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            text = text.rstrip("\ufffd")
        text = self._cut_at_stop(text)
        text = text[: len(text) - self._partial_stop_len(text)]
        return self._delta(text)

    def finish(self, finish_reason: dict | None) -> str:
        """The final text delta once the request has ended."""
        ids = self.ids
        matched = (finish_reason or {}).get("matched")
        if isinstance(matched, int) and not self.no_stop_trim and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self._decode(ids)
        if isinstance(matched, str):
            text = self._cut_at_stop(text, keep_stop=self.no_stop_trim)
        return self._delta(text)

    def _cut_at_stop(self, text: str, keep_stop: bool = False) -> str:
        cut = len(text)
        for s in self.stop:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i + (len(s) if keep_stop else 0))
        return text[:cut]

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest tail of text that is the start of some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _delta(self, text: str) -> str:
        if len(text) < self.sent:  # can happen when a token merges with the next one
            return ""
        delta = text[self.sent:]
        self.sent = len(text)
        return delta
