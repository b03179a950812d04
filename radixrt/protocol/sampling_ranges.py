"""The range checks of `SamplingParams.verify`: each raises ParamError naming the field and
the range it allows. The bounds are sane limits, stated in the errors."""

from __future__ import annotations

import math
import reprlib
from typing import TYPE_CHECKING, NoReturn

import regex

from radixrt.errors import ParamError

if TYPE_CHECKING:
    from radixrt.protocol.sampling_params import SamplingParams

# Sane bounds, stated in the errors. Beyond them a value is almost surely a mistake.
MAX_TEMPERATURE = 100.0
PENALTY_RANGE = (-2.0, 2.0)  # frequency / presence, as in the OpenAI API
MAX_REPETITION_PENALTY = 10.0
MAX_N = 128
MAX_BEAM_WIDTH = 64
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # as in the OpenAI API
MAX_SEED = 2**63
MAX_STOP_REGEX_COUNT = 32  # SGLang's limits
MAX_STOP_REGEX_BYTES = 256


def check_ranges(p: SamplingParams, vocab_size: int, max_context: int | None) -> None:
    """Every range of `p` (its types already checked); `max_context` bounds max_new_tokens."""
    _check_lengths(p, max_context)
    _check_distribution(p)
    _check_penalties(p)
    _check_stops(p, vocab_size)
    _check_stop_regex(p)
    _check_misc(p, vocab_size)
    _check_unsupported(p)


def short(value: object) -> str:
    """repr for an error message: bounded in length and depth, whatever the value holds."""
    return reprlib.repr(value)


def fail(field: str, allowed: str, value: object) -> NoReturn:
    raise ParamError(field, f"sampling param {field!r} must be {allowed}, got {short(value)}")


def require(ok: bool, field: str, allowed: str, value: object) -> None:
    if not ok:
        fail(field, allowed, value)


def _check_lengths(p: SamplingParams, max_context: int | None) -> None:
    max_new = p.max_new_tokens
    if max_new is None:
        fail("max_new_tokens", "an int (fill_max_new_tokens resolves None)", None)
    require(max_new >= 0, "max_new_tokens", ">= 0", max_new)
    if max_context is not None:
        require(
            max_new <= max_context,
            "max_new_tokens",
            f"<= the context length {max_context}",
            max_new,
        )
    require(
        0 <= p.min_new_tokens <= max_new,
        "min_new_tokens",
        f"in [0, max_new_tokens={max_new}]",
        p.min_new_tokens,
    )


def _check_distribution(p: SamplingParams) -> None:
    require(
        0.0 <= p.temperature <= MAX_TEMPERATURE,
        "temperature",
        f"in [0, {MAX_TEMPERATURE}] (0 means greedy)",
        p.temperature,
    )
    require(0.0 < p.top_p <= 1.0, "top_p", "in (0, 1]", p.top_p)
    require(p.top_k == -1 or p.top_k >= 1, "top_k", "-1 (off) or >= 1", p.top_k)
    require(0.0 <= p.min_p <= 1.0, "min_p", "in [0, 1]", p.min_p)


def _check_penalties(p: SamplingParams) -> None:
    lo, hi = PENALTY_RANGE
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(p, name)
        require(lo <= value <= hi, name, f"in [{lo}, {hi}]", value)
    require(
        0.0 < p.repetition_penalty <= MAX_REPETITION_PENALTY,
        "repetition_penalty",
        f"in (0, {MAX_REPETITION_PENALTY}] (1 = off)",
        p.repetition_penalty,
    )


def _check_stops(p: SamplingParams, vocab_size: int) -> None:
    stops = [p.stop] if isinstance(p.stop, str) else (p.stop or [])
    for s in stops:
        require(len(s) > 0, "stop", "non-empty strings", p.stop)
    for t in p.stop_token_ids or []:
        require(0 <= t < vocab_size, "stop_token_ids", f"ids in [0, {vocab_size})", t)


def _check_stop_regex(p: SamplingParams) -> None:
    """Each regex compiles, is short (SGLang's limits) and cannot match the empty string."""
    patterns = [p.stop_regex] if isinstance(p.stop_regex, str) else (p.stop_regex or [])
    require(
        len(patterns) <= MAX_STOP_REGEX_COUNT,
        "stop_regex",
        f"at most {MAX_STOP_REGEX_COUNT} regexes",
        f"{len(patterns)} regexes",
    )
    for pattern in patterns:
        require(
            len(pattern.encode()) <= MAX_STOP_REGEX_BYTES,
            "stop_regex",
            f"regexes of at most {MAX_STOP_REGEX_BYTES} bytes",
            pattern,
        )
        try:  # the `regex` module: the one the scheduler and detokenizer search with
            compiled = regex.compile(pattern)
        except (regex.error, RecursionError, OverflowError) as e:
            raise ParamError(
                "stop_regex", f"sampling param 'stop_regex' {pattern!r} does not compile: {e}"
            ) from None
        require(
            compiled.search("") is None,
            "stop_regex",
            "regexes that cannot match the empty string (that would stop at once)",
            pattern,
        )


def _check_unsupported(p: SamplingParams) -> None:
    if p.stream_interval is not None:
        require(p.stream_interval >= 1, "stream_interval", ">= 1 or None", p.stream_interval)
    if p.beam_width is not None:
        require(
            1 <= p.beam_width <= MAX_BEAM_WIDTH,
            "beam_width",
            f"in [1, {MAX_BEAM_WIDTH}] or None",
            p.beam_width,
        )
    _check_beam_search(p)
    if p.watermark not in (None, {}, False):
        raise ParamError("watermark", "sampling param 'watermark' is not supported by this server")


def _check_beam_search(p: SamplingParams) -> None:
    """Beam search ranks continuations by the model's log-probabilities (transformers'
    do_sample=False): what would reshape or sample them is refused, naming the field."""
    require(
        p.early_stopping in (True, False, "never"),
        "early_stopping",
        'true, false or "never"',
        p.early_stopping,
    )
    require(math.isfinite(p.length_penalty), "length_penalty", "a finite number", p.length_penalty)
    width = p.beam_width or 1
    if width == 1:
        return
    require(p.n <= width, "n", f"at most beam_width ({width}) with beam search", p.n)
    unsupported = {
        "temperature": p.temperature not in (0.0, 1.0),
        "top_p": p.top_p != 1.0,
        "top_k": p.top_k not in (-1, 0, 1),  # 1: how temperature 0 is written down
        "min_p": p.min_p != 0.0,
        "frequency_penalty": p.frequency_penalty != 0.0,
        "presence_penalty": p.presence_penalty != 0.0,
        "repetition_penalty": p.repetition_penalty != 1.0,
        "logit_bias": bool(p.logit_bias),
        "stop_regex": bool(p.stop_regex),
        "seed": p.seed is not None,
        "regex": p.regex is not None,
        "json_schema": p.json_schema is not None,
        "ebnf": p.ebnf is not None,
        "structural_tag": p.structural_tag is not None,
    }
    for name, refused in unsupported.items():
        if refused:
            raise ParamError(
                name,
                f"sampling param {name!r} cannot be used with beam search (beam_width "
                f"{width}): beams are ranked by the model's log-probabilities, got "
                f"{short(getattr(p, name))}",
            )


def _parse_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _check_misc(p: SamplingParams, vocab_size: int) -> None:
    require(1 <= p.n <= MAX_N, "n", f"in [1, {MAX_N}]", p.n)
    if p.seed is not None:
        require(0 <= p.seed < MAX_SEED, "seed", "an int in [0, 2**63)", p.seed)
    lo, hi = LOGIT_BIAS_RANGE
    for key, bias in (p.logit_bias or {}).items():
        ok = (token_id := _parse_int(key)) is not None and 0 <= token_id < vocab_size
        require(ok, "logit_bias", f"keyed by token ids in [0, {vocab_size})", key)
        require(lo <= bias <= hi, "logit_bias", f"values in [{lo}, {hi}]", bias)
    _check_constraint(p)


def _check_constraint(p: SamplingParams) -> None:
    """At most one of regex / json_schema / ebnf / structural_tag, of a bounded size (a schema
    or structural tag: JSON text of an object, nested a bounded depth; a tag of its shapes).
    Parsing it with xgrammar can take seconds: that is left to the frontend's
    ConstraintChecker and the scheduler's compile, bounded in time."""
    from radixrt.grammar.constraint import check_constraint_size, constraint_of

    found = constraint_of(p)
    if found is not None:
        check_constraint_size(*found)
