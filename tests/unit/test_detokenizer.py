"""IncrementalDetokenizer against a full decode: same text whatever the chunking, no split
UTF-8 character, stop strings never shown (not even their start)."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from radixrt.detokenizer import IncrementalDetokenizer

TEXTS = ["Hello world, this is a test of streaming.",
         "Emoji 🙂🚀 and accents: déjà vu, naïve café; 中文字符 와 한국어.",
         "  leading spaces\nnew lines\n\n\ttabs and  double  spaces  "]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    # One token per byte: every multi-byte character is split across tokens.
    return AutoTokenizer.from_pretrained(tiny_model_dir("llama"))


def stream(detok: IncrementalDetokenizer, ids: list[int], rng: random.Random,
           finish_reason=None) -> list[str]:
    out, i = [], 0
    while True:
        n = rng.randint(1, 3)
        if i + n >= len(ids):
            out.append(detok.finish(ids[i:], finish_reason))
            return out
        out.append(detok.add(ids[i:i + n]))
        i += n


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_to_the_full_decode_and_never_split_a_character(tokenizer, text, seed):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(IncrementalDetokenizer(tokenizer), ids, random.Random(seed))
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("seed", range(5))
def test_a_stop_string_is_never_shown_even_in_part(tokenizer, seed):
    text = "alpha beta STOP gamma"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop=["STOP"])
    shown = ""
    for d in stream(detok, ids, random.Random(seed), {"type": "stop", "matched": "STOP"}):
        shown += d
        assert "S" not in shown.replace("alpha beta ", "", 1)
    assert shown == "alpha beta "


def test_no_stop_trim_keeps_the_stop_string(tokenizer):
    ids = tokenizer.encode("one two END three", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop=["END"], no_stop_trim=True)
    shown = "".join(stream(detok, ids, random.Random(0), {"type": "stop", "matched": "END"}))
    assert shown == "one two END"


def test_a_matched_stop_token_is_trimmed(tokenizer):
    ids = tokenizer.encode("abc;", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    shown = "".join(stream(detok, ids, random.Random(0),
                           {"type": "stop", "matched": ids[-1]}))
    assert shown == "abc"


def test_a_stop_regex_that_backtracks_forever_is_given_up_not_searched_for_ever(tokenizer):
    import time

    detok = IncrementalDetokenizer(tokenizer, stop_regex=["(a|aa)+b", "zz"])
    start = time.monotonic()
    out = "".join(detok.add(tokenizer.encode("a", add_special_tokens=False)) for _ in range(40))
    out += detok.finish(tokenizer.encode("czz!", add_special_tokens=False), None)
    assert time.monotonic() - start < 5  # each search stops at its time limit, then no more
    assert out == "a" * 40 + "c"  # the other stop regex still applies
    assert [rx.pattern for rx in detok.stop_regex] == ["zz"]
