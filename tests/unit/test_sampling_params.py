"""SamplingParams: parsing a user dict, range checks, normalization, the wire form."""

import dataclasses

import pytest

from radixrt.protocol.sampling_params import SamplingParams

VOCAB = 100


def test_defaults_match_sglang() -> None:
    p = SamplingParams.from_dict(None)
    assert p == SamplingParams.from_dict({})
    assert (p.max_new_tokens, p.min_new_tokens, p.temperature, p.top_p) == (128, 0, 1.0, 1.0)
    assert (p.top_k, p.min_p, p.n, p.seed) == (-1, 0.0, 1, None)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.stop is None and p.stop_token_ids is None and p.logit_bias is None
    assert not p.ignore_eos and p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.no_stop_trim and p.regex is None and p.json_schema is None and p.ebnf is None
    assert not p.is_greedy
    p.verify(VOCAB)
    assert p.stop == []


def test_unknown_key_names_it_and_suggests_the_closest() -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams.from_dict({"max_tokens": 5})
    message = str(err.value)
    assert "'max_tokens'" in message
    assert "Did you mean 'max_new_tokens'" in message
    assert "temperature" in message  # the allowed names are listed


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("max_new_tokens", 3.5, "an int"),
        ("max_new_tokens", True, "an int"),  # bool is not an int
        ("top_k", "5", "an int"),
        ("temperature", "hot", "a number"),
        ("temperature", False, "a number"),
        ("ignore_eos", 1, "a bool"),
        ("stop", ["ok", 3], "a str, a list of str"),
        ("stop_token_ids", [1, "2"], "a list of int"),
        ("seed", 1.0, "an int"),
        ("logit_bias", {5: 1.0}, "a dict of str token id"),
        ("regex", 5, "a str or None"),
    ],
)
def test_wrong_type_names_field_and_type(field: str, value: object, expected: str) -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams.from_dict({field: value})
    assert repr(field) in str(err.value)
    assert expected in str(err.value)


def test_ints_are_accepted_for_floats() -> None:
    p = SamplingParams.from_dict({"temperature": 1, "top_p": 1, "repetition_penalty": 2})
    assert isinstance(p.temperature, float) and p.temperature == 1.0
    assert isinstance(p.repetition_penalty, float)


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        ({"max_new_tokens": -1}, "max_new_tokens", ">= 0"),
        ({"min_new_tokens": -1}, "min_new_tokens", "in [0, max_new_tokens=128]"),
        ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens", "max_new_tokens=5"),
        ({"temperature": -0.1}, "temperature", "in [0, 100.0]"),
        ({"temperature": 101}, "temperature", "in [0, 100.0]"),
        ({"top_p": 0.0}, "top_p", "in (0, 1]"),
        ({"top_p": 1.5}, "top_p", "in (0, 1]"),
        ({"top_k": 0}, "top_k", "-1 (off) or >= 1"),
        ({"top_k": -2}, "top_k", "-1 (off) or >= 1"),
        ({"min_p": 1.5}, "min_p", "in [0, 1]"),
        ({"min_p": -0.1}, "min_p", "in [0, 1]"),
        ({"frequency_penalty": 2.5}, "frequency_penalty", "in [-2.0, 2.0]"),
        ({"presence_penalty": -3}, "presence_penalty", "in [-2.0, 2.0]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "in (0, 10.0]"),
        ({"repetition_penalty": 11}, "repetition_penalty", "in (0, 10.0]"),
        ({"n": 0}, "n", "in [1, 128]"),
        ({"n": 129}, "n", "in [1, 128]"),
        ({"stop": ""}, "stop", "non-empty"),
        ({"stop": ["a", ""]}, "stop", "non-empty"),
        ({"stop_token_ids": [VOCAB]}, "stop_token_ids", f"[0, {VOCAB})"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", f"[0, {VOCAB})"),
        ({"seed": -1}, "seed", "[0, 2**63)"),
        ({"seed": 2**63}, "seed", "[0, 2**63)"),
        ({"logit_bias": {"abc": 1.0}}, "logit_bias", f"[0, {VOCAB})"),
        ({"logit_bias": {str(VOCAB): 1.0}}, "logit_bias", f"[0, {VOCAB})"),
        ({"logit_bias": {"3": 101.0}}, "logit_bias", "[-100.0, 100.0]"),
    ],
)
def test_range_error_names_field_and_range(overrides: dict, field: str, allowed: str) -> None:
    p = SamplingParams.from_dict(overrides)
    with pytest.raises(ValueError) as err:
        p.verify(VOCAB)
    assert repr(field) in str(err.value)
    assert allowed in str(err.value)


def test_max_new_tokens_bounded_by_context() -> None:
    p = SamplingParams.from_dict({"max_new_tokens": 300})
    p.verify(VOCAB)  # no context length given: fine
    with pytest.raises(ValueError, match="'max_new_tokens'.*<= the context length 256"):
        p.verify(VOCAB, max_context=256)


@pytest.mark.parametrize(
    "field,bad,why",
    [
        ("regex", "([a-", "not a valid regular expression"),
        ("json_schema", "{bad", "not valid JSON"),
        ("json_schema", "[1, 2]", "must be a JSON object"),
        ("json_schema", '{"type": "no-such-type"}', "not a valid JSON schema"),
        ("ebnf", "root ::= ", "not a valid EBNF"),
    ],
)
def test_a_bad_constraint_names_its_field(field: str, bad: str, why: str) -> None:
    from radixrt.grammar.constraint import check_constraint

    # verify checks the size and the JSON (cheap); xgrammar's parse is check_constraint's
    # (the frontend runs it bounded in time, the scheduler while compiling).
    with pytest.raises(ValueError, match=f"'{field}' .*{why}") as err:
        SamplingParams.from_dict({field: bad}).verify(VOCAB)
        check_constraint(field, bad)
    assert err.value.param == field


def test_a_constraint_is_bounded_in_size_and_depth_as_text_or_dict() -> None:
    from radixrt.grammar.constraint import MAX_CONSTRAINT_CHARS, MAX_SCHEMA_DEPTH

    with pytest.raises(ValueError, match=f"'regex' has .* at most {MAX_CONSTRAINT_CHARS}"):
        SamplingParams.from_dict({"regex": "a" * (MAX_CONSTRAINT_CHARS + 1)}).verify(VOCAB)
    for depth in (MAX_SCHEMA_DEPTH + 1, 1500, 20000):
        text = '{"enum": ' + "[" * depth + "]" * depth + "}"
        with pytest.raises(ValueError, match="'json_schema' nests .* levels deep") as err:
            SamplingParams.from_dict({"json_schema": text}).verify(VOCAB)
        assert err.value.param == "json_schema"
        deep: dict = {}
        for _ in range(depth):
            deep = {"items": deep}
        with pytest.raises(ValueError, match="'json_schema' nests") as err:
            SamplingParams.from_dict({"json_schema": deep})
        assert err.value.param == "json_schema"
    with pytest.raises(ValueError, match="'custom_params' nests more than 32") as err:
        SamplingParams.from_dict({"custom_params": deep})  # asdict would recurse into it
    assert err.value.param == "custom_params"
    # Brackets inside strings do not count; an escaped quote does not end a string.
    fine = '{"description": "[[[[{{{{ \\" [[[[", "type": "string"}'
    SamplingParams.from_dict({"json_schema": fine}).verify(VOCAB)


def test_one_constraint_at_most_and_schema_objects_become_text() -> None:
    with pytest.raises(ValueError, match="at most one of .*got \\['regex', 'ebnf'\\]"):
        SamplingParams.from_dict({"regex": "a+", "ebnf": 'root ::= "a"'}).verify(VOCAB)
    p = SamplingParams.from_dict({"json_schema": {"type": "object"}})
    p.verify(VOCAB)
    assert p.json_schema == '{"type": "object"}'
    with pytest.raises(ValueError, match="'json_schema' must be a JSON schema"):
        SamplingParams.from_dict({"json_schema": 5})


def test_verify_checks_types_of_directly_built_params() -> None:
    with pytest.raises(ValueError, match="'top_k' must be an int"):
        SamplingParams(top_k=2.0).verify(VOCAB)  # type: ignore[arg-type]


def test_normalization() -> None:
    p = SamplingParams.from_dict({"stop": "###", "temperature": 0})
    assert p.is_greedy
    p.verify(VOCAB)
    assert p.stop == ["###"] and p.top_k == 1 and p.is_greedy
    q = SamplingParams.from_dict({"temperature": 1e-7})
    q.verify(VOCAB)
    assert q.top_k == 1
    r = SamplingParams.from_dict({"temperature": 0.5, "top_k": 5})
    r.verify(VOCAB)
    assert r.top_k == 5 and not r.is_greedy


def test_to_dict_round_trips_with_plain_types() -> None:
    d = {"stop": ["a", "b"], "stop_token_ids": [1, 2], "logit_bias": {"7": -1.5}, "seed": 3}
    p = SamplingParams.from_dict(d)
    p.verify(VOCAB)
    wire = p.to_dict()
    assert set(wire) == {f.name for f in dataclasses.fields(SamplingParams)}
    assert all(type(v) in (int, float, bool, str, list, dict, type(None)) for v in wire.values())
    assert SamplingParams.from_dict(wire) == p
    wire["stop"].append("c")  # a copy: the params are not changed through it
    assert p.stop == ["a", "b"]
