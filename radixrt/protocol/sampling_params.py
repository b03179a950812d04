"""User-facing sampling parameters, validated with errors that name the field and its range.

The field names are those of SGLang's offline engine `sampling_params` dict, so a dict written
for SGLang works here unchanged. Lifecycle: `from_dict` (unknown keys and wrong types) →
`verify` (ranges, needs the model's vocab size; normalizes in place; the range checks are in
sampling_ranges.py) → `to_dict` for the wire.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixrt.errors import ParamError
from radixrt.protocol.sampling_ranges import MAX_SEED, check_ranges, require, short

# Below this temperature a row is sampled greedily (softmax(x / 1e-6) is argmax in float32).
GREEDY_TEMPERATURE = 1e-6

MAX_CUSTOM_DEPTH = 32  # custom_params: unused here, passed on; dicts inside dicts at most this
# SGLang's internal SamplingParams fields: accepted (and dropped) at their defaults only.
_SGLANG_INTERNAL = {
    "stop_strs": None,
    "stop_regex_strs": None,
    "stop_str_max_len": 0,
    "stop_regex_max_len": 0,
    "is_normalized": False,
    "ebnf_full_assistant": False,
}


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
    # Structured generation (xgrammar): at most one of the four.
    regex: str | None = None
    json_schema: str | None = None  # a JSON schema as text (a dict is turned into text)
    ebnf: str | None = None
    # Free text with constrained parts (tool calls): radixrt/grammar/structural_tag.py. JSON
    # text; a dict is turned into text.
    structural_tag: str | None = None
    # SGLang's other parameters. stream_interval: a stream chunk once k new tokens are there
    # (default: every scheduler step). custom_params: for custom logit processors, which this
    # server does not run (accepted, unused). The rest are refused when set.
    stream_interval: int | None = None
    custom_params: dict[str, Any] | None = None
    # Beam search (docs/beam_search.md): beam_width > 1 keeps that many beams; n of them are
    # returned. length_penalty and early_stopping mean what they mean in transformers.
    beam_width: int | None = None
    length_penalty: float = 1.0
    early_stopping: bool | str = False
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
            raise ParamError(
                "sampling_params", f"sampling_params must be a dict, got {type(d).__name__}"
            )
        allowed = [f.name for f in dataclasses.fields(cls)]
        d = {k: v for k, v in d.items() if not _internal_at_default(k, v)}
        for key in d:
            if key not in allowed:
                raise ParamError("sampling_params", _unknown_key_message(key, allowed))
        # As SGLang: null for a parameter that is not optional means its default.
        params = cls(
            **{
                k: v
                for k, v in d.items()
                if v is not None or _DEFAULTS[k] is None or k == "max_new_tokens"
            }
        )
        params.check_types()
        return params

    def check_types(self) -> None:
        """Raise ValueError naming the first field whose value has the wrong type.

        Mutates: ints given for float fields become floats; a tuple of stop ids becomes a list.
        """
        for name, (check, expected) in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not check(value):
                raise ParamError(
                    name,
                    f"sampling param {name!r} must be {expected}, got "
                    f"{type(value).__name__} {short(value)}",
                )
        for name in _FLOAT_FIELDS:
            setattr(self, name, float(getattr(self, name)))
        if isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids)
        from radixrt.grammar.constraint import nests_deeper_than, schema_object_text

        if isinstance(self.json_schema, dict):  # a schema object travels as its JSON text
            self.json_schema = schema_object_text(self.json_schema)
        if isinstance(self.structural_tag, dict):
            self.structural_tag = schema_object_text(self.structural_tag, "structural_tag")
        if self.custom_params and nests_deeper_than(self.custom_params, MAX_CUSTOM_DEPTH):
            # to_dict (dataclasses.asdict) and the wire's encoders recurse into it.
            raise ParamError(
                "custom_params",
                f"sampling param 'custom_params' nests more than {MAX_CUSTOM_DEPTH} levels deep",
            )
        for name in ("regex", "json_schema", "ebnf", "structural_tag"):
            setattr(self, name, getattr(self, name) or None)  # SGLang: empty = unset
        if isinstance(self.stop_regex, tuple):
            self.stop_regex = list(self.stop_regex)
        self._apply_sampling_seed()

    def _apply_sampling_seed(self) -> None:
        if self.sampling_seed is None:
            return
        require(
            -MAX_SEED <= self.sampling_seed < MAX_SEED,
            "sampling_seed",
            "an int in [-2**63, 2**63)",
            self.sampling_seed,
        )
        seed = self.sampling_seed % MAX_SEED  # radixrt's generators take [0, 2**63)
        require(
            self.seed in (None, seed),
            "sampling_seed",
            f"equal to seed ({self.seed}) when both are given",
            self.sampling_seed,
        )
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
        check_ranges(self, vocab_size, max_context)
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
    raise ParamError(
        key,
        f"sampling param {key!r} is internal to SGLang and cannot be set "
        f"(allowed: {_SGLANG_INTERNAL[key]!r} or null), got "
        f"{short(value)}",
    )


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
    "json_schema": (
        _optional(lambda v: isinstance(v, (str, dict))),
        "a JSON schema (a str, or a dict) or None",
    ),
    "ebnf": _OPT_STR,
    "stream_interval": _OPT_INT,
    "custom_params": (_optional(lambda v: isinstance(v, dict)), "a dict or None"),
    "structural_tag": (
        _optional(lambda v: isinstance(v, (str, dict))),
        "a structural tag (JSON text, or a dict) or None",
    ),
    "beam_width": _OPT_INT,
    "length_penalty": _FLOAT,
    "early_stopping": (
        lambda v: isinstance(v, (bool, str)),
        'a bool or the str "never"',
    ),
}
_FLOAT_FIELDS = [name for name, spec in _FIELD_TYPES.items() if spec is _FLOAT]
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
