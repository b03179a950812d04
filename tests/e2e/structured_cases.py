"""A corpus of JSON-schema and regex constraints with prompts, shared by
tests/e2e/test_structured.py and scripts/bench_structured.py.

Every case is bounded: strings carry maxLength (or a bounded pattern), arrays maxItems, numbers
a range, regexes bounded repetitions. So a correct engine finishes each case well inside
`max_new_tokens` even when sampling at temperature 1.0 (apart from free whitespace between
JSON tokens, which xgrammar allows and the model rarely piles up): a truncated output is
a failure of the test, never a skip.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


def chat(user: str) -> str:
    """The default model's (SmolLM2-Instruct, ChatML) prompt for one user turn."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "json_schema" or "regex"
    constraint: Any  # a schema dict or a regex string
    prompt: str

    def params(self, **extra: Any) -> dict:
        """Sampling params carrying this constraint (schemas passed as objects)."""
        return {self.kind: self.constraint, **extra}

    def violation(self, text: str) -> str | None:
        """None if `text` satisfies the constraint, else why not."""
        if self.kind == "regex":
            ok = re.fullmatch(self.constraint, text) is not None
            return None if ok else f"{text!r} does not fullmatch {self.constraint!r}"
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), self.constraint)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            return f"{text!r}: {type(e).__name__}: {str(e).splitlines()[0]}"
        return None


def _s(max_len: int = 16, **kw: Any) -> dict:
    return {"type": "string", "maxLength": max_len, **kw}


def _p(pattern: str) -> dict:
    """A string by a bounded pattern (xgrammar ignores maxLength next to a pattern)."""
    return {"type": "string", "pattern": f"^{pattern}$"}


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


DATE = r"\d{4}-\d{2}-\d{2}"
EMAIL = r"[a-z][a-z0-9.]{0,11}@[a-z]{1,10}\.(com|org|net)"
PHONE = r"\(\d{3}\) \d{3}-\d{4}"

SCHEMAS: dict[str, tuple[dict, str]] = {
    "person": (
        _obj({"name": _s(), "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
        "Describe a person named Alice aged 30 as JSON.",
    ),
    "nested": (
        _obj(
            {
                "user": _obj(
                    {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "email": _p(EMAIL)}
                ),
                "address": _obj({"city": _s(), "zip": _p(r"\d{5}")}),
            }
        ),
        "Give a user record with an address as JSON.",
    ),
    "tags_array": (
        _obj(
            {
                "title": _s(24),
                "tags": {"type": "array", "items": _s(10), "minItems": 1, "maxItems": 3},
            }
        ),
        "A blog post title with up to three tags, as JSON.",
    ),
    "enum_status": (
        _obj({"status": {"enum": ["active", "inactive", "banned"]}, "level": {"enum": [1, 2, 3]}}),
        "What is the account status and level? Answer in JSON.",
    ),
    "optional_fields": (
        _obj(
            {
                "id": {"type": "integer", "minimum": 0, "maximum": 100},
                "nickname": _s(12),
                "verified": {"type": "boolean"},
            },
            required=["id"],
        ),
        "A user with an id, and maybe a nickname, as JSON.",
    ),
    "number_range": (
        _obj(
            {
                "temperature": {"type": "number", "minimum": -50, "maximum": 60},
                "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
            }
        ),
        "Report today's weather in JSON.",
    ),
    "date_string": (
        _obj({"event": _s(20), "date": _p(DATE)}),
        "When was the first moon landing? Reply as JSON with event and date.",
    ),
    "phone_email": (
        _obj({"phone": _p(PHONE), "email": _p(EMAIL)}),
        "Give contact details for a small bakery as JSON.",
    ),
    "booleans_null": (
        _obj(
            {"done": {"type": "boolean"}, "note": {"type": "null"}, "urgent": {"type": "boolean"}}
        ),
        "Is the task done and urgent? Answer as JSON.",
    ),
    "any_of": (
        _obj(
            {
                "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, _s(8)]},
                "unit": {"enum": ["kg", "lb", "none"]},
            }
        ),
        "Give a weight with its unit in JSON.",
    ),
    "array_of_objects": (
        _obj(
            {
                "items": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 3,
                    "items": _obj(
                        {
                            "sku": _p(r"[A-Z]{2}\d{3}"),
                            "qty": {"type": "integer", "minimum": 1, "maximum": 50},
                        }
                    ),
                }
            }
        ),
        "List two or three items of an order as JSON.",
    ),
    "int_array": (
        {
            "type": "array",
            "items": {"type": "integer", "minimum": -9, "maximum": 9},
            "minItems": 3,
            "maxItems": 5,
        },
        "Give a short list of small integers as a JSON array.",
    ),
    "deep_nesting": (
        _obj({"a": _obj({"b": _obj({"c": _obj({"d": {"enum": ["x", "y"]}})})})}),
        "Write a deeply nested JSON object.",
    ),
}

REGEXES: dict[str, tuple[str, str]] = {
    "date": (DATE, "What is today's date? Answer in YYYY-MM-DD."),
    "phone": (PHONE, "Give a US phone number."),
    "email": (EMAIL, "Give an email address."),
    "ipv4": (
        r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
        "What is the IP address of a home router?",
    ),
    "time": (r"([01]\d|2[0-3]):[0-5]\d", "What time is lunch? Use 24-hour HH:MM."),
    "yes_no": (r"(Yes|No)\.", "Is the sky blue? Answer yes or no."),
    "hex_color": (r"#[0-9a-fA-F]{6}", "What is the hex code of pure red?"),
    "capital_sentence": (
        r"The capital of [A-Z][a-z]{1,12} is [A-Z][a-z]{1,12}\.",
        "Name a country and its capital in one sentence.",
    ),
    "sku_list": (r"[A-Z]{3}-\d{2}(, [A-Z]{3}-\d{2}){0,3}", "List some product codes."),
    "money": (r"\$(0|[1-9]\d{0,4})\.\d{2}", "How much does a coffee cost?"),
}

CASES: list[Case] = [Case(n, "json_schema", s, chat(p)) for n, (s, p) in SCHEMAS.items()] + [
    Case(n, "regex", r, chat(p)) for n, (r, p) in REGEXES.items()
]
JSON_CASES = [c for c in CASES if c.kind == "json_schema"]
