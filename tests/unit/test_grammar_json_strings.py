"""JSON-schema grammars: json.dumps spacing by default, and strings (with maxLength too) never
admit the raw control characters JSON forbids (xgrammar 0.2 lets them through maxLength)."""

from __future__ import annotations

import pytest

from radixrt.grammar.backend import GrammarBackend

SCHEMA = (
    '{"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, '
    '"b": {"type": "string"}}, "required": ["a", "b"]}'
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def backend(tokenizer):
    return GrammarBackend(tokenizer, len(tokenizer))


@pytest.mark.parametrize("prefix", ['{"a": "x', '{"a": "x", "b": "y'])
@pytest.mark.parametrize("bad", ["\t", "\x01", "\n"])
def test_no_raw_control_character_inside_a_string(backend, prefix, bad):
    matcher = backend.matcher(backend.compile("json_schema", SCHEMA).result())
    assert matcher.accept_string(prefix)
    assert not matcher.accept_string(bad)
    if prefix.endswith('"y'):  # an unbounded string takes the escaped form (maxLength ones
        assert matcher.accept_string("\\t")  # take no escapes at all in xgrammar 0.2)


def test_json_dumps_spacing_unless_any_whitespace(backend, tokenizer):
    compact = backend.matcher(backend.compile("json_schema", SCHEMA).result())
    assert not compact.accept_string("{\n")
    assert compact.accept_string('{"a": "x", "b": "y"}') and compact.is_completed()
    loose = GrammarBackend(tokenizer, len(tokenizer), json_any_whitespace=True)
    matcher = loose.matcher(loose.compile("json_schema", SCHEMA).result())
    assert matcher.accept_string('{\n  "a"  :"x" ,"b":"y"}') and matcher.is_completed()
