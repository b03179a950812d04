"""The `structural_tag` constraint on the default model's tokenizer, with real xgrammar
matchers: free text passes until the trigger, then only a call of one of the structures (and
it parses with the Hermes parser of tool_calls.py); jump-forward proposes the forced begin;
schemas are spaced as json_schema constraints are; "auto"'s tag ends the output after one
call without parallel_tool_calls; bad shapes are ValueErrors naming `structural_tag`."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from radixrt.entrypoints.openai.tool_calls import hermes_call_tag
from radixrt.entrypoints.openai.tool_parsers import parse_tool_calls
from radixrt.grammar.backend import GrammarBackend
from radixrt.grammar.constraint import check_constraint, parse_constraint
from radixrt.grammar.jump_forward import propose
from radixrt.protocol.sampling_params import SamplingParams

VOCAB = 49152  # SmolLM2's
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"}},
    "required": ["city", "metric"],
    "additionalProperties": False,
}
BEGIN = '<tool_call>\n{"name": "get_weather", "arguments": '
LEGACY = {
    "type": "structural_tag",
    "structures": [{"begin": BEGIN, "schema": WEATHER, "end": "}\n</tool_call>"}],
    "triggers": ["<tool_call>"],
}
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "metric": true}}'
    "\n</tool_call>"
)


@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


@pytest.fixture(scope="module")
def backend(tokenizer):
    b = GrammarBackend(tokenizer, VOCAB)
    yield b
    b.close()


def matcher(backend, tag: dict):
    return backend.matcher(backend.compile("structural_tag", json.dumps(tag)).result(timeout=30))


def feed(tokenizer, m, text: str) -> bool:
    """Whether the matcher takes every token of `text`."""
    return all(m.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))


def allowed_tokens(backend, m) -> list[int]:
    mask = backend.new_bitmask(1)
    m.fill_next_token_bitmask(mask, 0)
    bits = (mask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:VOCAB].nonzero().flatten().tolist()


def test_free_text_passes_and_may_end(tokenizer, backend):
    m = matcher(backend, LEGACY)
    assert len(allowed_tokens(backend, m)) > VOCAB // 2  # nothing forced before the trigger
    assert feed(tokenizer, m, "Sure, I can check the weather for you. <tool and <b>tags</b>")
    assert m.find_jump_forward_string() == ""
    assert m.accept_token(tokenizer.eos_token_id) and m.is_terminated()


def test_after_the_trigger_only_a_parseable_call(tokenizer, backend):
    m = matcher(backend, LEGACY)
    assert feed(tokenizer, m, "Let me look. <tool_call>")
    assert not m.accept_token(tokenizer.eos_token_id)  # a started call cannot stop
    for wrong in ("\n{}", '\n{"name": "get_time"', "Oslo"):
        fork = matcher(backend, LEGACY)
        assert feed(tokenizer, fork, "<tool_call>") and not feed(tokenizer, fork, wrong), wrong
    rest = CALL.removeprefix("<tool_call>")
    assert feed(tokenizer, m, rest + " Done.")
    parsed = parse_tool_calls("Let me look. " + CALL + " Done.")
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Oslo", "metric": True})
    ]


@pytest.mark.parametrize("seed", range(4))
def test_any_call_the_grammar_lets_through_parses(tokenizer, backend, seed):
    """Random tokens among those the mask allows, from the trigger to the end string: the text
    is always a call of the schema (the language of WEATHER is finite, so the walk ends)."""
    rng = random.Random(seed)
    m = matcher(backend, LEGACY)
    assert feed(tokenizer, m, "<tool_call>")
    text = "<tool_call>"
    while "</tool_call>" not in text:  # (its last token may run on into free text)
        assert len(text) < 400, text
        choices = [t for t in allowed_tokens(backend, m) if t != tokenizer.eos_token_id]
        tok = rng.choice(choices)
        assert m.accept_token(tok)
        text += tokenizer.decode([tok])
    (call,) = parse_tool_calls(text).calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_jump_forward_proposes_the_begin_after_the_trigger(tokenizer, backend):
    m = matcher(backend, LEGACY)
    assert propose(m, tokenizer, room=64) == []  # free text: nothing forced
    assert feed(tokenizer, m, "<tool_call>")
    proposal = propose(m, tokenizer, room=64)
    assert tokenizer.decode(proposal) == BEGIN.removeprefix("<tool_call>") + '{"city": "'


def test_schemas_are_spaced_as_json_schema_constraints(tokenizer):
    """Default: json.dumps' spacing, as for json_schema; --json-any-whitespace frees it."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    spaced = CALL.replace('{"city"', '{ "city"')
    for any_whitespace, accepted in ((False, False), (True, True)):
        grammar = parse_constraint(xgr, "structural_tag", json.dumps(LEGACY), any_whitespace)
        m = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
        assert feed(tokenizer, m, spaced) is accepted


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_tag_ends_after_one_call_unless_parallel(tokenizer, backend, parallel):
    tag = hermes_call_tag({"get_weather": WEATHER, "get_time": {"type": "object"}}, parallel)
    m = matcher(backend, tag)
    assert feed(tokenizer, m, "Hi. " + CALL)
    assert feed(tokenizer, m, " And") is parallel
    m = matcher(backend, tag)
    assert feed(tokenizer, m, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def test_xgrammar_format_shape_and_a_dict_are_accepted(tokenizer, backend):
    fmt = {"type": "triggered_tags", "triggers": ["<f"], "tags": [], "at_least_one": False}
    fmt["tags"] = [{"type": "tag", "begin": "<f>", "content": {"type": "any_text"}, "end": "</f>"}]
    m = matcher(backend, {"type": "structural_tag", "format": fmt})
    assert feed(tokenizer, m, "a <f>anything</f> b")
    params = SamplingParams.from_dict({"structural_tag": LEGACY})
    params.verify(VOCAB)
    assert json.loads(params.structural_tag) == LEGACY


def _legacy(**changes) -> dict:
    return {**LEGACY, **changes}


BAD = [
    ("not json", "not valid JSON"),
    ("[1]", "must be a JSON object"),
    (json.dumps({"type": "regex", "structures": []}), "has type 'regex'"),
    (json.dumps({"type": "structural_tag"}), "neither"),
    (json.dumps(_legacy(triggers=[])), '"triggers"'),
    (json.dumps(_legacy(structures=[])), '"structures"'),
    (json.dumps(_legacy(extra=1)), "unknown keys ['extra']"),
    (json.dumps(_legacy(structures=[{"begin": "<x>", "schema": {}}])), "exactly the keys"),
    (json.dumps(_legacy(structures=[{"begin": "x", "schema": {}, "end": ""}])), "none of"),
    (json.dumps(_legacy(structures=[{"begin": "<t", "schema": 3, "end": ""}])), ".schema"),
    (
        json.dumps(
            _legacy(structures=[{"begin": "<tool_call>", "schema": {"type": "no"}, "end": ""}])
        ),
        "invalid JSON schema at structures[0].schema",
    ),
    (json.dumps({"type": "structural_tag", "format": {"type": "nope"}}), "not a valid"),
]


@pytest.mark.parametrize("text,words", BAD, ids=[w for _, w in BAD])
def test_bad_shapes_are_refused_by_name(text, words):
    with pytest.raises(ValueError, match="structural_tag") as e:
        check_constraint("structural_tag", text)
    assert words in str(e.value)
    if "invalid JSON schema" in words or "not a valid" in words:
        return  # the shape is right: only xgrammar finds these (the frontend's check)
    with pytest.raises(ValueError, match="structural_tag"):
        SamplingParams.from_dict({"structural_tag": text}).verify(VOCAB)
    assert "allowed:" in str(e.value)  # the shapes it takes
