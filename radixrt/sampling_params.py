"""User-facing sampling parameters, validated with errors that name the field and its range.

The field names are those of SGLang's offline engine `sampling_params` dict, so a dict written
for SGLang works here unchanged. Lifecycle: `from_dict` (unknown keys and wrong types) →
`verify` (ranges, needs the model's vocab size; normalizes in place) → `to_dict` for the wire.
"""

from __future__ import annotations

import dataclasses
import difflib
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import regex

from radixrt.errors import ParamError

# Below this temperature a row is sampled greedily (softmax(x / 1e-6) is argmax in float32).
GREEDY_TEMPERATURE = 1e-6

# Sane bounds, stated in the errors. Beyond them a value is almost surely a mistake.
MAX_TEMPERATURE = 100.0
PENALTY_RANGE = (-2.0, 2.0)  # frequency / presence, as in the OpenAI API
MAX_REPETITION_PENALTY = 10.0
MAX_N = 128
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # as in the OpenAI API
MAX_SEED = 2**63
MAX_STOP_REGEX_COUNT = 32  # SGLang's limits
MAX_STOP_REGEX_BYTES = 256
MAX_CUSTOM_DEPTH = 32  # custom_params: unused here, passed on; dicts inside dicts at most this
# SGLang's internal SamplingParams fields: accepted (and dropped) at their defaults only.
_SGLANG_INTERNAL = {"stop_strs": None, "stop_regex_strs": None, "stop_str_max_len": 0,
                    "stop_regex_max_len": 0, "is_normalized": False,
                    "ebnf_full_assistant": False}


@dataclass
class SamplingParams:
    """How to pick the next tokens of one request; see the module docstring for the lifecycle."""

    max_new_tokens: int | None = 128  # None: up to the context length (SGLang's meaning)
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    # Regexes (Python `re`) searched in the output's tail after every token, like stop strings.
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    sampling_seed: int | None = None  # SGLang's name for the seed (mapped onto seed)
    # Keys are token ids written as strings (JSON object keys), values are added to the logits.
    logit_bias: dict[str, float] | None = None
    # Structured generation (xgrammar): at most one of the three.
    regex: str | None = None
    json_schema: str | None = None  # a JSON schema as text (a dict is turned into text)
    ebnf: str | None = None
    # SGLang's other parameters. stream_interval: a stream chunk once k new tokens are there
    # (default: every scheduler step). custom_params: for custom logit processors, which this
    # server does not run (accepted, unused). The rest are refused when set.
    stream_interval: int | None = None
    custom_params: dict[str, Any] | None = None
    structural_tag: str | None = None
    beam_width: int | None = None
    watermark: Any = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Build from a user dict (None = all defaults).

        Raises ValueError for an unknown key (naming it, with the closest allowed name) or a
        value of the wrong type (naming the field and the expected type). Ranges are checked
        later by `verify`, which needs the model's vocab size.
        """
        d = d or {}
        if not isinstance(d, dict):
            raise ParamError("sampling_params",
                             f"sampling_params must be a dict, got {type(d).__name__}")
        allowed = [f.name for f in dataclasses.fields(cls)]
        d = {k: v for k, v in d.items() if not _internal_at_default(k, v)}
        for key in d:
            if key not in allowed:
                raise ParamError("sampling_params", _unknown_key_message(key, allowed))
        # As SGLang: null for a parameter that is not optional means its default.
        params = cls(**{k: v for k, v in d.items() if v is not None or _DEFAULTS[k] is None
                        or k == "max_new_tokens"})
        params.check_types()
        return params

    def check_types(self) -> None:
        """Raise ValueError naming the first field whose value has the wrong type.

        Mutates: ints given for float fields become floats; a tuple of stop ids becomes a list.
        """
        for name, (check, expected) in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not check(value):
                raise ParamError(name, f"sampling param {name!r} must be {expected}, got "
                                 f"{type(value).__name__} {_short(value)}")
        for name in _FLOAT_FIELDS:
            setattr(self, name, float(getattr(self, name)))
        if isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids)
        from radixrt.grammar.constraint import nests_deeper_than, schema_object_text

        if isinstance(self.json_schema, dict):  # a schema object travels as its JSON text
            self.json_schema = schema_object_text(self.json_schema)
        if self.custom_params and nests_deeper_than(self.custom_params, MAX_CUSTOM_DEPTH):
            # to_dict (dataclasses.asdict) and the wire's encoders recurse into it.
            raise ParamError("custom_params", f"sampling param 'custom_params' nests more than "
                             f"{MAX_CUSTOM_DEPTH} levels deep")
        for name in ("regex", "json_schema", "ebnf", "structural_tag"):
            setattr(self, name, getattr(self, name) or None)  # SGLang: empty = unset
        if isinstance(self.stop_regex, tuple):
            self.stop_regex = list(self.stop_regex)
        self._apply_sampling_seed()

    def _apply_sampling_seed(self) -> None:
        if self.sampling_seed is None:
            return
        _require(-MAX_SEED <= self.sampling_seed < MAX_SEED, "sampling_seed",
                 "an int in [-2**63, 2**63)", self.sampling_seed)
        seed = self.sampling_seed % MAX_SEED  # radixrt's generators take [0, 2**63)
        _require(self.seed in (None, seed), "sampling_seed",
                 f"equal to seed ({self.seed}) when both are given", self.sampling_seed)
        self.seed = seed

    def fill_max_new_tokens(self, room: int) -> None:
        """max_new_tokens None (SGLang: no limit) becomes `room`, what the context leaves."""
        if self.max_new_tokens is None:
            self.max_new_tokens = max(room, 0)

    def verify(self, vocab_size: int, max_context: int | None = None) -> None:
        """Check every range; raise ValueError naming the field and its allowed range.

        Mutates on success: `stop` becomes a list, and a temperature below 1e-6 turns the
        request greedy (top_k = 1, see `is_greedy`).
        """
        self.check_types()
        _require(self.max_new_tokens is not None, "max_new_tokens", "an int (fill_max_new_tokens "
                 "resolves None)", None)
        _check_lengths(self, max_context)
        _check_distribution(self)
        _check_penalties(self)
        _check_stops(self, vocab_size)
        _check_stop_regex(self)
        _check_misc(self, vocab_size)
        _check_unsupported(self)
        self._normalize()

    def _normalize(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        if isinstance(self.stop_regex, str):
            self.stop_regex = [self.stop_regex]
        elif self.stop_regex is None:
            self.stop_regex = []
        if self.temperature < GREEDY_TEMPERATURE:
            self.top_k = 1

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax of the (penalized) logits."""
        return self.top_k == 1 or self.temperature < GREEDY_TEMPERATURE

    def to_dict(self) -> dict[str, Any]:
        """A dict of plain Python types (copies of the lists and dicts) for the wire."""
        return dataclasses.asdict(self)


def _short(value: object) -> str:
    """repr for an error message: bounded in length and depth, whatever the value holds."""
    return reprlib.repr(value)


def _unknown_key_message(key: object, allowed: list[str]) -> str:
    close = difflib.get_close_matches(str(key), allowed, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown sampling param {key!r}.{hint} Allowed names: {', '.join(sorted(allowed))}"


def _internal_at_default(key: str, value: object) -> bool:
    """SGLang's internal fields are dropped at their defaults; anything else is refused."""
    if key not in _SGLANG_INTERNAL:
        return False
    if value is None or value == _SGLANG_INTERNAL[key]:
        return True
    raise ParamError(key, f"sampling param {key!r} is internal to SGLang and cannot be set "
                     f"(allowed: {_SGLANG_INTERNAL[key]!r} or null), got "
                     f"{_short(value)}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or check(v)


def _is_stop(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _is_int_list(v: object) -> bool:
    return isinstance(v, (list, tuple)) and all(_is_int(x) for x in v)


def _is_bias(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _is_float(x) for k, x in v.items())


_INT = (_is_int, "an int")
_FLOAT = (_is_float, "a number (int or float)")
_BOOL = (lambda v: isinstance(v, bool), "a bool")
_OPT_STR = (_optional(lambda v: isinstance(v, str)), "a str or None")
_OPT_INT = (_optional(_is_int), "an int or None")
_FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "max_new_tokens": (_optional(_is_int), "an int, or None (up to the context length)"),
    "min_new_tokens": _INT,
    "temperature": _FLOAT,
    "top_p": _FLOAT,
    "top_k": _INT,
    "min_p": _FLOAT,
    "frequency_penalty": _FLOAT,
    "presence_penalty": _FLOAT,
    "repetition_penalty": _FLOAT,
    "stop": (_optional(_is_stop), "a str, a list of str, or None"),
    "stop_token_ids": (_optional(_is_int_list), "a list of int or None"),
    "stop_regex": (_optional(_is_stop), "a str (a regex), a list of str, or None"),
    "ignore_eos": _BOOL,
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "no_stop_trim": _BOOL,
    "n": _INT,
    "seed": _OPT_INT,
    "sampling_seed": _OPT_INT,
    "logit_bias": (_optional(_is_bias), "a dict of str token id -> number, or None"),
    "regex": _OPT_STR,
    "json_schema": (_optional(lambda v: isinstance(v, (str, dict))),
                    "a JSON schema (a str, or a dict) or None"),
    "ebnf": _OPT_STR,
    "stream_interval": _OPT_INT,
    "custom_params": (_optional(lambda v: isinstance(v, dict)), "a dict or None"),
    "structural_tag": (_optional(lambda v: isinstance(v, (str, dict))),
                       "a str (JSON) or None"),
    "beam_width": _OPT_INT,
}
_FLOAT_FIELDS = [name for name, spec in _FIELD_TYPES.items() if spec is _FLOAT]
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}


def _require(ok: bool, field: str, allowed: str, value: object) -> None:
    if not ok:
        raise ParamError(field, f"sampling param {field!r} must be {allowed}, got "
                         f"{_short(value)}")


def _check_lengths(p: SamplingParams, max_context: int | None) -> None:
    _require(p.max_new_tokens >= 0, "max_new_tokens", ">= 0", p.max_new_tokens)
    if max_context is not None:
        _require(
            p.max_new_tokens <= max_context,
            "max_new_tokens",
            f"<= the context length {max_context}",
            p.max_new_tokens,
        )
    _require(
        0 <= p.min_new_tokens <= p.max_new_tokens,
        "min_new_tokens",
        f"in [0, max_new_tokens={p.max_new_tokens}]",
        p.min_new_tokens,
    )


def _check_distribution(p: SamplingParams) -> None:
    _require(
        0.0 <= p.temperature <= MAX_TEMPERATURE,
        "temperature",
        f"in [0, {MAX_TEMPERATURE}] (0 means greedy)",
        p.temperature,
    )
    _require(0.0 < p.top_p <= 1.0, "top_p", "in (0, 1]", p.top_p)
    _require(p.top_k == -1 or p.top_k >= 1, "top_k", "-1 (off) or >= 1", p.top_k)
    _require(0.0 <= p.min_p <= 1.0, "min_p", "in [0, 1]", p.min_p)


def _check_penalties(p: SamplingParams) -> None:
    lo, hi = PENALTY_RANGE
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(p, name)
        _require(lo <= value <= hi, name, f"in [{lo}, {hi}]", value)
    _require(
        0.0 < p.repetition_penalty <= MAX_REPETITION_PENALTY,
        "repetition_penalty",
        f"in (0, {MAX_REPETITION_PENALTY}] (1 = off)",
        p.repetition_penalty,
    )


def _check_stops(p: SamplingParams, vocab_size: int) -> None:
    stops = [p.stop] if isinstance(p.stop, str) else (p.stop or [])
    for s in stops:
        _require(len(s) > 0, "stop", "non-empty strings", p.stop)
    for t in p.stop_token_ids or []:
        _require(0 <= t < vocab_size, "stop_token_ids", f"ids in [0, {vocab_size})", t)


def _check_stop_regex(p: SamplingParams) -> None:
    """Each regex compiles, is short (SGLang's limits) and cannot match the empty string."""
    patterns = [p.stop_regex] if isinstance(p.stop_regex, str) else (p.stop_regex or [])
    _require(len(patterns) <= MAX_STOP_REGEX_COUNT, "stop_regex",
             f"at most {MAX_STOP_REGEX_COUNT} regexes", f"{len(patterns)} regexes")
    for pattern in patterns:
        _require(len(pattern.encode()) <= MAX_STOP_REGEX_BYTES, "stop_regex",
                 f"regexes of at most {MAX_STOP_REGEX_BYTES} bytes", pattern)
        try:  # the `regex` module: the one the scheduler and detokenizer search with
            compiled = regex.compile(pattern)
        except (regex.error, RecursionError, OverflowError) as e:
            raise ParamError("stop_regex", f"sampling param 'stop_regex' {pattern!r} does not "
                             f"compile: {e}") from None
        _require(compiled.search("") is None, "stop_regex",
                 "regexes that cannot match the empty string (that would stop at once)",
                 pattern)


def _check_unsupported(p: SamplingParams) -> None:
    if p.stream_interval is not None:
        _require(p.stream_interval >= 1, "stream_interval", ">= 1 or None", p.stream_interval)
    if p.beam_width is not None:
        _require(p.beam_width >= 1, "beam_width", ">= 1 or None", p.beam_width)
        if p.beam_width > 1:
            raise ParamError("beam_width", "sampling param 'beam_width' > 1 (beam search) is not "
                             f"supported by this server, got {p.beam_width}: use n for "
                             "several samples")
    if p.structural_tag is not None:
        raise ParamError("structural_tag", "sampling param 'structural_tag' is not supported "
                         "by this server: use json_schema, regex or ebnf")
    if p.watermark not in (None, {}, False):
        raise ParamError("watermark", "sampling param 'watermark' is not supported by this server")


def _parse_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _check_misc(p: SamplingParams, vocab_size: int) -> None:
    _require(1 <= p.n <= MAX_N, "n", f"in [1, {MAX_N}]", p.n)
    if p.seed is not None:
        _require(0 <= p.seed < MAX_SEED, "seed", "an int in [0, 2**63)", p.seed)
    lo, hi = LOGIT_BIAS_RANGE
    for key, bias in (p.logit_bias or {}).items():
        ok = _parse_int(key) is not None and 0 <= _parse_int(key) < vocab_size
        _require(ok, "logit_bias", f"keyed by token ids in [0, {vocab_size})", key)
        _require(lo <= bias <= hi, "logit_bias", f"values in [{lo}, {hi}]", bias)
    _check_constraint(p)


def _check_constraint(p: SamplingParams) -> None:
    """At most one of regex / json_schema / ebnf, of a bounded size (a schema: JSON text of an
    object, nested a bounded depth). Parsing it with xgrammar can take seconds: that is left
    to the frontend's ConstraintChecker and the scheduler's compile, bounded in time."""
    from radixrt.grammar.constraint import check_constraint_size, constraint_of

    found = constraint_of(p)
    if found is not None:
        check_constraint_size(*found)
