"""Stop strings and stop regexes, searched in the tail of a request's output after each token.

A stop regex is searched with the `regex` module under a time limit: a pattern that
backtracks catastrophically ("(a+)+$" on a long run of a's takes seconds with `re`) ends its
own request (RequestFailed) instead of stalling the step loop for everyone.
"""

from __future__ import annotations

import functools
from typing import Any

import regex

from radixrt.errors import RequestFailed
from radixrt.scheduler.req import Req

_MAX_STOP_REGEX_WIDTH = 4096  # wider than this: decode the whole output to search it
STOP_REGEX_TIMEOUT_S = 0.05  # per search; real stop patterns take microseconds


def matched_stop_string(req: Req, tokenizer: Any) -> str | None:
    return stop_string_in(req.output_ids, req.sampling_params.stop, tokenizer)


def stop_string_in(
    output_ids: list[int], stops: str | list[str] | None, tokenizer: Any
) -> str | None:
    """The first of `stops` in the text that ends with the newest of `output_ids`, or None."""
    if isinstance(stops, str):  # SamplingParams.verify makes it a list; a str is one stop
        stops = [stops]
    if not stops or tokenizer is None:
        return None
    # A stop string can only newly appear in text ending with the newest token; a token
    # holds at least one character, so this many tail tokens cover the longest stop.
    tail = output_ids[-(max(len(s) for s in stops) + 2) :]
    text = tokenizer.decode(tail, skip_special_tokens=False)
    return next((s for s in stops if s in text), None)


def matched_stop_regex(req: Req, tokenizer: Any) -> str | None:
    """The first stop regex (its pattern) that matches the output's tail, or None; raises
    RequestFailed when a search runs past STOP_REGEX_TIMEOUT_S."""
    patterns = req.sampling_params.stop_regex
    if not patterns or tokenizer is None:
        return None
    compiled = [_compiled_stop_regex(p) for p in patterns]
    # The tail that holds any match ending at the newest token (all of it when a regex's
    # match has no bound), as for stop strings: a token holds at least one character.
    bounded = [w for _, w in compiled if w is not None]
    unbounded = len(bounded) < len(compiled)
    tail = req.output_ids if unbounded else req.output_ids[-(max(bounded) + 2) :]
    text = tokenizer.decode(tail, skip_special_tokens=False)
    for pattern, (rx, _) in zip(patterns, compiled, strict=True):
        if _search(rx, pattern, text):
            return pattern
    return None


def _search(rx: regex.Pattern[str], pattern: str, text: str) -> bool:
    try:
        return rx.search(text, timeout=STOP_REGEX_TIMEOUT_S) is not None
    except TimeoutError:
        raise RequestFailed(
            f"stop_regex {pattern!r} took over {STOP_REGEX_TIMEOUT_S:g} s to "
            "search the output (catastrophic backtracking): simplify it"
        ) from None


@functools.lru_cache(maxsize=1024)
def _compiled_stop_regex(pattern: str) -> tuple[Any, int | None]:
    """The compiled regex (validation made sure `regex` takes it) and the most characters a
    match can span (None: no bound)."""
    try:  # CPython's regex parser: the width bounds of a pattern
        from re import _parser  # type: ignore[attr-defined]  # private: no stubs
    except ImportError:  # Python < 3.11
        import sre_parse as _parser

    rx = regex.compile(pattern)
    try:
        width = _parser.parse(pattern).getwidth()[1]
    except Exception:  # noqa: BLE001 - syntax only `regex` knows (\p{L}, ...): no bound known
        return rx, None
    return rx, (None if width >= _MAX_STOP_REGEX_WIDTH else width)
