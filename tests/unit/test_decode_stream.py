"""DecodeStream (detokenizer/decode_stream.py) against today's window path: for many seeded random
id sequences (multi-byte characters split across tokens, special tokens, random vocabulary ids)
fed in random chunks, the two give the same deltas, whose concatenation is the whole sequence's
decode, with skip_special_tokens on and off; stop strings behave as before."""

from __future__ import annotations

import random

import pytest
from launch_helpers import fresh_python_lines
from transformers import AutoTokenizer

from radixrt.detokenizer.decode_stream import StreamDecoder, WindowDecoder, new_decoder
from radixrt.detokenizer.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello world, streaming text.",
    "Emoji 🙂🚀👩‍👩‍👧 and accents: déjà vu, naïve; 中文字符 와 한국어 ∑∫.",
    "  spaces\n\n\ttabs  and\r\nnewlines ",
    '{"json": [1, 2.5, "x"], "nested": {"k": null}}',
]
SEEDS = range(40)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    # One token per byte: every multi-byte character is split across tokens.
    return AutoTokenizer.from_pretrained(tiny_model_dir("llama"))


def random_ids(tokenizer, rng: random.Random) -> list[int]:
    """Pieces of encoded text, special tokens, and (one time in four) random vocabulary ids."""
    specials = list(tokenizer.added_tokens_decoder)
    ids: list[int] = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.6:
            text = rng.choice(TEXTS)
            start = rng.randrange(len(text))
            ids += tokenizer.encode(
                text[start : start + rng.randint(1, 40)], add_special_tokens=False
            )
        elif kind < 0.85:
            ids.append(rng.choice(specials))
        else:
            ids += [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 4))]
    return ids


def deltas(detok: IncrementalDetokenizer, ids: list[int], rng: random.Random) -> list[str]:
    out, i = [], 0
    while True:
        n = rng.randint(1, 4)
        if i + n >= len(ids):
            return [*out, detok.finish(ids[i:], None)]
        out.append(detok.add(ids[i : i + n]))
        i += n


def both_paths(tokenizer, ids: list[int], seed: int, skip: bool, **kw) -> tuple[list, list]:
    """(DecodeStream's deltas, the window path's) for the same chunks."""
    fast = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip, **kw)
    assert isinstance(fast.decoder, StreamDecoder), "a fast tokenizer gets DecodeStream"
    window = WindowDecoder(lambda x: tokenizer.decode(x, skip_special_tokens=skip))
    slow = IncrementalDetokenizer(tokenizer, decoder=window, **kw)
    return deltas(fast, ids, random.Random(seed)), deltas(slow, ids, random.Random(seed))


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize(
    "which",
    ["tiny_tokenizer", pytest.param("default_tokenizer", marks=pytest.mark.default_model)],
)
def test_decode_stream_matches_the_window_path_and_the_full_decode(request, which, skip):
    tokenizer = request.getfixturevalue(which)
    for seed in SEEDS:
        ids = random_ids(tokenizer, random.Random(seed))
        fast, slow = both_paths(tokenizer, ids, seed, skip)
        assert fast == slow, f"seed {seed}: {ids}"
        assert "".join(fast) == tokenizer.decode(ids, skip_special_tokens=skip), ids


def test_split_characters_are_held_back_until_whole(tiny_tokenizer):
    ids = tiny_tokenizer.encode("a🙂b", add_special_tokens=False)  # 1 + 4 + 1 bytes
    detok = IncrementalDetokenizer(tiny_tokenizer)
    shown = [detok.add([i]) for i in ids[:-1]]
    assert shown == ["a", "", "", "", "🙂"]
    assert detok.finish(ids[-1:], None) == "b"


def test_an_unfinished_character_comes_out_replaced_at_the_end(tiny_tokenizer):
    ids = tiny_tokenizer.encode("x🙂", add_special_tokens=False)[:-1]
    detok = IncrementalDetokenizer(tiny_tokenizer)
    assert detok.add(ids[:1]) == "x"
    assert detok.add(ids[1:]) == ""
    assert detok.finish([], None) == tiny_tokenizer.decode(ids)[1:] == "\ufffd"


@pytest.mark.parametrize("seed", range(8))
def test_stop_strings_cut_the_same_text(default_tokenizer, seed):
    text = "alpha beta 🙂 STOP gamma"
    ids = default_tokenizer.encode(text, add_special_tokens=False)
    fast, slow = both_paths(default_tokenizer, ids, seed, True, stop=["STOP"])
    assert fast == slow and "".join(fast) == "alpha beta 🙂 "


def test_a_decode_stream_error_carries_on_through_the_window(tiny_tokenizer):
    ids = tiny_tokenizer.encode(TEXTS[1], add_special_tokens=False)
    detok = IncrementalDetokenizer(tiny_tokenizer)
    decoder = detok.decoder
    assert isinstance(decoder, StreamDecoder)

    class FailsLater:
        def __init__(self, stream, calls: int) -> None:
            self.stream, self.calls = stream, calls

        def step(self, backend, new_ids):
            self.calls -= 1
            if self.calls < 0:
                raise RuntimeError("InvalidPrefix")
            return self.stream.step(backend, new_ids)

    decoder.stream = FailsLater(decoder.stream, 9)  # type: ignore[assignment]
    assert "".join(deltas(detok, ids, random.Random(0))) == TEXTS[1]
    assert decoder.stream is None


class _CleaningTokenizer:
    """A fast tokenizer whose decode post-processes its backend's text, as transformers'
    clean_up_tokenization_spaces does for WordPiece tokenizers."""

    clean_up_tokenization_spaces = True

    def __init__(self, inner) -> None:
        self.inner = inner
        self.backend_tokenizer = inner.backend_tokenizer

    def encode(self, text, **kwargs):
        return self.inner.encode(text, **kwargs)

    def decode(self, ids, **kwargs):
        return self.inner.decode(ids, **kwargs).replace(" .", ".")


def test_tokenizers_without_a_plain_backend_keep_the_window_path(tiny_tokenizer):
    assert isinstance(new_decoder(_CleaningTokenizer(tiny_tokenizer), True, True), WindowDecoder)

    class Slow:  # no backend_tokenizer: a Python (slow) tokenizer
        def decode(self, ids, **kwargs):
            return "".join(chr(97 + i % 26) for i in ids)

    decoder = new_decoder(Slow(), True, True)
    assert isinstance(decoder, WindowDecoder)
    assert decoder.push([0, 1]) + decoder.flush() == "ab"


@pytest.mark.default_model
@pytest.mark.parametrize("skip", [True, False])
def test_a_decode_only_gguf_tokenizer_streams_the_same_text(default_tokenizer, skip):
    """The detokenizer's own tokenizer for a GGUF file (LazyTokenizer's decode_only: the
    `tokenizers.Tokenizer` alone) gives the deltas transformers' wrapper of it gives."""
    from tokenizers import Tokenizer

    from radixrt.loader.default_model import default_model_path
    from radixrt.loader.tokenizer import LazyTokenizer

    decode_only = LazyTokenizer(default_model_path(), decode_only=True)
    assert isinstance(decode_only.get(), Tokenizer)
    for seed in SEEDS:
        ids = random_ids(default_tokenizer, random.Random(seed))
        ours = IncrementalDetokenizer(decode_only, skip_special_tokens=skip)
        theirs = IncrementalDetokenizer(default_tokenizer, skip_special_tokens=skip)
        assert isinstance(ours.decoder, StreamDecoder)
        rng = random.Random(seed)
        assert deltas(ours, ids, rng) == deltas(theirs, ids, random.Random(seed)), ids


@pytest.mark.default_model
def test_the_detokenizer_of_a_gguf_file_does_not_import_transformers():
    # ~20 MiB of a process that only turns ids into text.
    code = (
        "import sys\n"
        "import radixrt.detokenizer.process\n"
        "from radixrt.detokenizer.detokenizer import IncrementalDetokenizer\n"
        "from radixrt.loader.tokenizer import LazyTokenizer\n"
        "tok = LazyTokenizer.for_process(None, None, False, None, decode_only=True)\n"
        "detok = IncrementalDetokenizer(tok)\n"
        "print(repr(detok.finish([19556, 905], None)))\n"
        "print('transformers' in sys.modules)\n"
    )
    text, imported = fresh_python_lines(code)[-2:]
    assert text != "''" and imported == "False"
