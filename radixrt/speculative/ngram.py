"""Prompt lookup: draft the tokens that followed the last time the sequence's tail occurred.

Outputs often repeat their context (a rewritten file, quoted passages, JSON keys, earlier
turns of a chat). If the last w tokens of a request (prompt and verified output) occurred
before in it, the tokens that followed that occurrence are a good guess for what comes next.
The longest tail within [min_window, max_window] that occurred wins, and among its
occurrences the most recent one (the nearest text is the likeliest to be continued). An
occurrence close enough to overlap the tail means the text repeats with that period, and the
draft goes on repeating it.

`TokenHistory` keeps a request's tokens in a growing numpy array, so a lookup is a few
vectorized comparisons over the sequence (microseconds for thousands of tokens) instead of a
Python loop or an index rebuilt at every step.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class TokenHistory:
    """The tokens of one sequence, appended to and cut from the end."""

    def __init__(self, tokens: list[int]) -> None:
        self._buf = np.empty(max(2 * len(tokens), 64), dtype=np.int64)
        self._len = 0
        self.extend(tokens)

    def __len__(self) -> int:
        return self._len

    @property
    def tokens(self) -> np.ndarray:
        """A view of the tokens [len]; valid until the next extend."""
        return self._buf[: self._len]

    def extend(self, tokens: list[int]) -> None:
        need = self._len + len(tokens)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf)), dtype=np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : need] = tokens
        self._len = need

    def truncate(self, length: int) -> None:
        assert 0 <= length <= self._len, (length, self._len)
        self._len = length


class Lookup(NamedTuple):
    draft: list[int]  # [] where no tail of the allowed lengths occurred before
    matched: int  # the length of the tail that did


NOTHING = Lookup([], 0)


def prompt_lookup(tokens: np.ndarray, min_window: int, max_window: int, limit: int) -> Lookup:
    """Up to `limit` tokens that followed the most recent earlier occurrence of the longest
    tail of `tokens` ([n] int64) of min_window..max_window tokens."""
    n = len(tokens)
    if limit <= 0 or n < min_window + 1:
        return NOTHING
    # Candidate ends: earlier positions holding the last token (the tail's last token).
    ends = np.flatnonzero(tokens[: n - 1] == tokens[n - 1])
    if len(ends) == 0:
        return NOTHING
    matched = 1
    widest = min(max_window, n - 1)
    while matched < widest:
        # Keep the candidates whose occurrence also matches the tail one token further back.
        ok = ends >= matched
        if not ok.any():
            break
        agree = ends[ok][tokens[ends[ok] - matched] == tokens[n - 1 - matched]]
        if len(agree) == 0:
            break
        ends, matched = agree, matched + 1
    if matched < min_window:
        return NOTHING
    start = int(ends[-1]) + 1  # the most recent occurrence of the longest tail
    # Where the occurrence is so recent that its continuation runs into the tail itself, the
    # text repeats with period n - start (a loop, a repeated line): the draft repeats it too.
    return Lookup(np.resize(tokens[start:], limit).tolist(), matched)
