"""SamplingParams takes every API parameter of SGLang's SamplingParams: stop_regex checked,
sampling_seed as the seed, null as the default, the unimplemented ones refused by name."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from radixrt.detokenizer.detokenizer import IncrementalDetokenizer
from radixrt.protocol.sampling_params import SamplingParams

VOCAB = 100
# The API fields of sglang/srt/sampling/sampling_params.py SamplingParams in SGLang 0.5.23.
SGLANG_PARAMS = """max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p
frequency_penalty presence_penalty repetition_penalty min_new_tokens n beam_width json_schema
regex ebnf structural_tag ignore_eos skip_special_tokens spaces_between_special_tokens
no_stop_trim stream_interval logit_bias sampling_seed custom_params watermark""".split()


def checked(d: dict) -> SamplingParams:
    p = SamplingParams.from_dict(d)
    p.fill_max_new_tokens(500)
    p.verify(VOCAB)
    return p


def test_every_sglang_parameter_is_a_field_and_null_means_its_default():
    p = checked({name: None for name in SGLANG_PARAMS})
    assert (p.temperature, p.top_p, p.top_k, p.n, p.repetition_penalty) == (1.0, 1.0, -1, 1, 1.0)
    assert p.skip_special_tokens and not p.ignore_eos and p.stop == [] and p.stop_regex == []
    assert p.max_new_tokens == 500  # SGLang's None: as many as the context leaves


def test_sglang_internal_fields_only_at_their_defaults():
    checked({"stop_strs": None, "stop_regex_max_len": 0, "is_normalized": False})
    with pytest.raises(ValueError, match="'is_normalized' is internal to SGLang"):
        SamplingParams.from_dict({"is_normalized": True})


def test_stop_regex_is_a_list_and_bad_ones_name_stop_regex():
    assert checked({"stop_regex": r"\d+\."}).stop_regex == [r"\d+\."]
    for bad, why in [
        ("([", "does not compile"),
        ("x*", "empty string"),
        (["a"] * 33, "at most 32"),
        ("a" * 300, "at most 256 bytes"),
        (5, "a str"),
    ]:
        with pytest.raises(ValueError, match="stop_regex") as e:
            checked({"stop_regex": bad})
        assert why in str(e.value)


def test_sampling_seed_is_the_seed():
    assert checked({"sampling_seed": 7}).seed == 7
    assert checked({"sampling_seed": -1}).seed == 2**63 - 1
    assert checked({"sampling_seed": 7, "seed": 7}).seed == 7
    with pytest.raises(ValueError, match="sampling_seed"):
        checked({"sampling_seed": 7, "seed": 8})


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"beam_width": 0}, "beam_width"),
        ({"beam_width": 65}, "beam_width"),
        ({"beam_width": 2, "top_k": 5}, "top_k"),
        ({"beam_width": 2, "min_p": 0.1}, "min_p"),
        ({"beam_width": 2, "repetition_penalty": 1.1}, "repetition_penalty"),
        ({"beam_width": 2, "stop_regex": "x"}, "stop_regex"),
        ({"beam_width": 2, "seed": 3}, "seed"),
        ({"beam_width": 2, "length_penalty": float("nan")}, "length_penalty"),
        ({"structural_tag": '{"type": "x"}'}, "structural_tag"),
        ({"watermark": {"key": 1}}, "watermark"),
        ({"stream_interval": 0}, "stream_interval"),
    ],
)
def test_unimplemented_parameters_are_refused_by_name(params, needle):
    with pytest.raises(ValueError, match=needle):
        checked(params)


def test_accepted_at_their_neutral_values():
    p = checked(
        {
            "beam_width": 1,
            "structural_tag": "",
            "custom_params": {"a": 1},
            "stream_interval": 4,
            "regex": "",
            "watermark": None,
        }
    )
    assert p.regex is None and p.stream_interval == 4


# -- the detokenizer holds back what could still become a stop-regex match ---------------------
@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir("llama"))  # one token per byte


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("trim", [True, False])
def test_a_stop_regex_match_is_never_shown_even_in_part(tokenizer, seed, trim):
    text = "order 12 items, then 345 more."
    pattern = r"\d{3} m"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_regex=[pattern], no_stop_trim=not trim)
    rng, shown, i = random.Random(seed), "", 0
    while i < len(ids):
        n = rng.randint(1, 3)
        if i + n >= len(ids):
            shown += detok.finish(ids[i:], {"type": "stop", "matched": pattern})
        else:
            shown += detok.add(ids[i : i + n])
            assert "then 3" not in shown, shown
        i += n
    assert shown == ("order 12 items, then " if trim else "order 12 items, then 345 m")
