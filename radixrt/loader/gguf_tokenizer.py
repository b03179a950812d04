"""A GGUF file's tokenizer, built with `tokenizers` from its tokenizer.ggml.* metadata so that it
splits text into the ids llama.cpp's (src/llama-vocab.cpp) would.

Torch-free and quick (the header is read straight from the file, the merges a SentencePiece
vocabulary implies are found with numpy): the HTTP process builds it itself. transformers'
own GGUF path took 91-100 s for a 150k-260k vocabulary.
"""

from __future__ import annotations

import gc
import mmap
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

# GGUF value types: struct formats of the scalars, numpy dtypes of the arrays' elements.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# llama.cpp's token types (tokenizer.ggml.token_type).
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4

# llama.cpp's split regexes, applied one after the other, per tokenizer.ggml.pre. Its own
# adaptations of the models' regexes (no case-insensitive groups, tekken's letter classes)
# are kept: they are what it tokenizes with.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
_DEEPSEEK_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
_STARCODER = (r"\p{N}", _GPT2)
_PRE_GROUPS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("default",), _DEFAULT),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de"), (_GPT2,)),
    (("a.x-4.0", "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais"), (_GPT2,)),
    (("trillion", "granite-docling"), (_GPT2,)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"), (_LLAMA3,)),
    (("midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), (_LLAMA3,)),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2"), (_QWEN2,)),
    (("hunyuan", "solar-open"), (_QWEN2,)),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone"), _STARCODER),
    (("minerva-7b", "mellum2"), _STARCODER),
    (("deepseek-llm",), ("[\r\n]", _DEEPSEEK_LETTERS, _DEEPSEEK_PUNCT, r"\s+$", _CJK, r"\p{N}+")),
    (("deepseek-coder",), ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    (("falcon",), (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    (("tekken",), (_TEKKEN,)),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), (_GPT4O,)),
]
PRE_SPLITS = {name: regexes for names, regexes in _PRE_GROUPS for name in names}
# Where llama.cpp keeps a word that is a token whole (ignore_merges), and adds BOS unless the
# file says not to: the same pre types, of those above.
_LLAMA3_STYLE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0"}
_LLAMA3_STYLE |= {"lfm2", "jina-v5-nano", "tekken"}

# Tokens llama.cpp makes control by their text, whatever their type says (end of generation).
_CONTROL_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
}  # fmt: skip
# ... and the fill-in-the-middle ones, unless the file names that token by id (these keys).
_FIM_TEXTS = {
    ("fim_pre", "prefix"): {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>",
                            "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"},
    ("fim_suf", "suffix"): {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
                            "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"},
    ("fim_mid", "middle"): {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
                            "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"},
    ("fim_pad",): {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
    ("fim_rep",): {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
    ("fim_sep",): {"<|file_sep|>"},
}  # fmt: skip


def read_tokenizer_metadata(path: str | Path) -> dict[str, Any]:
    """The tokenizer.* entries of a GGUF file's header: numbers, strings, lists of strings and
    numpy arrays. Only the header is read (gguf's GGUFReader parses every tensor too, 3 s for
    Gemma 3's file against 0.1 s)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        magic, version, _, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"{path} is not a little-endian GGUF file of version 2 or 3")
        pos, found = 24, {}
        for _ in range(n_kv):
            key, pos = _string(buf, pos)
            (kind,) = struct.unpack_from("<I", buf, pos)
            value, pos = _value(buf, pos + 4, kind)
            if key.startswith("tokenizer."):
                found[key] = value
        return found


def _string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (size,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8 : pos + 8 + size].decode(), pos + 8 + size


def _value(buf: mmap.mmap, pos: int, kind: int) -> tuple[Any, int]:
    if kind == _STRING:
        return _string(buf, pos)
    if kind != _ARRAY:
        scalar = struct.Struct(_SCALARS[kind])
        return scalar.unpack_from(buf, pos)[0], pos + scalar.size
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item == _STRING:
        return _strings(buf, pos, count)
    dtype = np.dtype(_SCALARS[item].replace("?", "u1"))
    return np.frombuffer(buf, dtype, count, pos).copy(), pos + count * dtype.itemsize


def _strings(buf: mmap.mmap, pos: int, count: int) -> tuple[list[str], int]:
    out, size_at = [], struct.Struct("<Q").unpack_from
    for _ in range(count):
        (size,) = size_at(buf, pos)
        out.append(buf[pos + 8 : pos + 8 + size].decode())
        pos += 8 + size
    return out, pos


def build_gguf_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer of a GGUF file whose tokenizer.ggml.model is "gpt2" (byte-level BPE) or
    "llama" (SentencePiece BPE), with its special tokens, BOS/EOS rule and chat template.

    ValueError for another model, or for a pre-tokenizer not in PRE_SPLITS (unknown to
    llama.cpp too, or not yet written down here: give tokenizer_path instead).
    """
    # The build makes a million tuples and strings in a row, which the cyclic garbage
    # collector would scan over and over (0.2 s of Gemma 3's 1 s): none of them is garbage.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build(path)
    finally:
        if collecting:
            gc.enable()


def _build(path: str | Path) -> PreTrainedTokenizerFast:
    meta = read_tokenizer_metadata(path)
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens", [])
    if "" in tokens:  # llama.cpp's name for an empty token: the vocabulary needs distinct texts
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    ids = dict(zip(tokens, range(len(tokens)), strict=True))
    if model == "gpt2":
        backend = _byte_level_bpe(meta, ids)
    elif model == "llama":
        backend = _sentencepiece_bpe(meta, tokens, ids)
    else:
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported ('gpt2', 'llama')")
    backend.add_tokens(_added_tokens(tokens, _token_types(meta, ids)))
    return _wrap(backend, meta, tokens)


def _byte_level_bpe(meta: dict[str, Any], vocab: dict[str, int]) -> Tokenizer:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = meta.get("tokenizer.ggml.pre") or "default"  # what llama.cpp falls back to
    if pre not in PRE_SPLITS:
        raise ValueError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {sorted(PRE_SPLITS)}"
        )
    merges = []
    for merge in meta.get("tokenizer.ggml.merges", []):
        cut = merge.find(" ", 1)  # as llama.cpp cuts it: a first part may start with a space
        left, right = merge[:cut], merge[cut + 1 :]
        # tokenizers refuses a merge of or into a text outside the vocabulary
        if cut > 0 and left in vocab and right in vocab and left + right in vocab:
            merges.append((left, right))
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=pre in _LLAMA3_STYLE))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS[pre]]
    to_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, to_bytes])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str], ids: dict[str, int]) -> Tokenizer:
    """llama.cpp's SPM tokenizer: spaces become "▁" (one more in front of each piece of text
    between special tokens, if add_space_prefix), then neighbours whose joined text is a token
    join, best score first; a character outside the vocabulary becomes its <0xXX> bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores", np.zeros(len(tokens), np.float32))
    unk = _token_id(meta, "unknown", tokens)
    model = models.BPE(
        ids,
        _score_merges(tokens, scores[: len(tokens)]),
        unk_token=None if unk is None else tokens[unk],
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    spaces = [normalizers.Prepend("▁")] if prefix else []
    tokenizer.normalizer = normalizers.Sequence([*spaces, normalizers.Replace(" ", "▁")])
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    strip = [decoders.Strip(" ", 1, 0)] if prefix else []
    tokenizer.decoder = decoders.Sequence([*steps, *strip])
    return tokenizer


def _score_merges(tokens: list[str], scores: np.ndarray) -> list[tuple[str, str]]:
    """As BPE merges, llama.cpp's rule "any two neighbours whose joined text is a token join,
    the best-scored token first": every cut of a token into two tokens, ranked by the token's
    score (ties: lower id first, where llama.cpp takes the leftmost pair)."""
    whole, left, right = _Cuts(tokens).into_tokens()
    order = np.lexsort((whole, -scores[whole]))  # stable: a token's cuts stay left to right
    pick = tokens.__getitem__
    halves = zip(map(pick, left[order].tolist()), map(pick, right[order].tolist()), strict=True)
    return list(halves)


class _Cuts:
    """Every cut of every token in two, and which of the halves are tokens themselves.

    1.2M cuts for Gemma 3's 262k tokens: a Python loop over them took over a second, so the
    halves are compared by hash, with numpy, all at once. Each substring gets two 64-bit
    polynomial hashes (wrapping uint64 arithmetic): the first finds a token, the second checks
    it, so a false match needs two collisions at once.
    """

    _BASES = (0x100000001B3, 0x5851F42D4C957F2D)  # odd: invertible modulo 2**64

    def __init__(self, tokens: list[str]) -> None:
        self.lengths = np.fromiter(map(len, tokens), np.int64, len(tokens))
        self.ends = np.cumsum(self.lengths)
        self.starts = self.ends - self.lengths
        codes = np.frombuffer("".join(tokens).encode("utf-32-le"), np.uint32) + np.uint64(1)
        self._tables = [self._prefix_hashes(codes, base) for base in self._BASES]
        self.whole = [self._hash(i, self.starts, self.ends) for i in range(len(self._BASES))]
        self._index = _HashIndex(self.whole[0])

    @staticmethod
    def _prefix_hashes(codes: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
        """(sum of codes[j] * base**j for j < i, base**-i) for every i: a substring's hash is
        then (prefix[end] - prefix[start]) * base**-start."""
        powers = np.full(codes.size + 1, base, np.uint64)
        inverses = np.full(codes.size + 1, pow(base, -1, 1 << 64), np.uint64)
        powers[0] = inverses[0] = 1
        powers, inverses = np.cumprod(powers), np.cumprod(inverses)
        prefix = np.zeros(codes.size + 1, np.uint64)
        np.cumsum(codes * powers[:-1], out=prefix[1:])
        return prefix, inverses

    def _hash(self, which: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        prefix, inverses = self._tables[which]
        return (prefix[end] - prefix[start]) * inverses[start]

    def find(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The id of the token whose text is text[start:end], or -1, for each pair."""
        ids = self._index.find(self._hash(0, start, end))
        return np.where(self.whole[1][ids] == self._hash(1, start, end), ids, -1)

    def into_tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(token, left, right) ids of each cut whose two halves are tokens."""
        count = np.maximum(self.lengths - 1, 0)
        whole = np.repeat(np.arange(count.size), count)
        first = np.repeat(np.cumsum(count) - count, count)  # index of each token's first cut
        cut = self.starts[whole] + 1 + np.arange(whole.size) - first
        left = self.find(self.starts[whole], cut)
        keep = left >= 0
        whole, cut, left = whole[keep], cut[keep], left[keep]
        right = self.find(cut, self.ends[whole])
        keep = right >= 0
        return whole[keep], left[keep], right[keep]


class _HashIndex:
    """Position of each of distinct uint64 keys: a table of 2**22 slots, addressed by the top
    bits of the key times an odd constant (the polynomial hashes of short texts are small
    numbers), and a sorted array of the few keys (3%) that found their slot taken.
    (np.searchsorted alone took 0.4 s for Gemma 3's 2.4M lookups, this a tenth of that.)"""

    _BITS = 22
    _MIXER = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = keys
        at = self._slot(keys)
        self.slots = np.full(1 << self._BITS, -1, np.int64)
        self.slots[at] = np.arange(keys.size)
        lost = np.flatnonzero(self.slots[at] != np.arange(keys.size))
        self.crowded = np.zeros(1 << self._BITS, bool)
        self.crowded[at[lost]] = True
        order = np.argsort(keys[lost])
        self.lost_keys, self.lost_ids = keys[lost][order], lost[order]

    def _slot(self, keys: np.ndarray) -> np.ndarray:
        return (keys * self._MIXER) >> np.uint64(64 - self._BITS)

    def find(self, queries: np.ndarray) -> np.ndarray:
        """The position of each query among the keys, or -1."""
        at = self._slot(queries)
        ids = self.slots[at]
        found = np.where(self.keys[ids] == queries, ids, -1)  # keys[-1] on an empty slot: -1
        retry = np.flatnonzero((found < 0) & self.crowded[at])
        if retry.size and self.lost_keys.size:
            near = np.searchsorted(self.lost_keys, queries[retry])
            near = np.minimum(near, self.lost_keys.size - 1)
            hit = self.lost_keys[near] == queries[retry]
            found[retry[hit]] = self.lost_ids[near[hit]]
        return found


def _token_types(meta: dict[str, Any], ids: dict[str, int]) -> np.ndarray:
    """tokenizer.ggml.token_type, with llama.cpp's corrections by text."""
    types = meta.get("tokenizer.ggml.token_type")
    types = np.ones(len(ids), np.int32) if types is None else types[: len(ids)].copy()
    control = set(_CONTROL_TEXTS)
    for keys, texts in _FIM_TEXTS.items():
        if not any(f"tokenizer.ggml.{key}_token_id" in meta for key in keys):
            control |= texts
    for text in control & ids.keys():
        types[ids[text]] = CONTROL
    # gpt-oss: llama.cpp always renders these, and does not end generation on <|end|> where
    # <|return|> and <|call|> do.
    user = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}
    if {"<|return|>", "<|call|>"} <= ids.keys() or {"<|calls|>", "<|flush|>"} <= ids.keys():
        user.add("<|end|>")
    for text in user & ids.keys():
        types[ids[text]] = USER_DEFINED
    return types


def _added_tokens(tokens: list[str], types: np.ndarray) -> list[AddedToken]:
    """llama.cpp finds control, unknown and user-defined tokens in the raw text (longest first)
    before it tokenizes the rest, control and unknown ones only when asked to parse special
    tokens: tokenizers' special added tokens, which split_special_tokens=True leaves as text."""
    from tokenizers import AddedToken

    kinds = np.flatnonzero(np.isin(types, (UNKNOWN, CONTROL, USER_DEFINED)))
    return [
        AddedToken(tokens[i], special=bool(types[i] != USER_DEFINED), normalized=False)
        for i in kinds.tolist()
    ]


def _token_id(meta: dict[str, Any], name: str, tokens: list[str]) -> int | None:
    """tokenizer.ggml.<name>_token_id, or llama.cpp's default for a SentencePiece vocabulary
    (none for byte-level BPE, where its default, 11, is no real token); None when out of range."""
    spm_default = {"bos": 1, "eos": 2, "unknown": 0}.get(name)
    default = spm_default if meta.get("tokenizer.ggml.model") == "llama" else None
    found = meta.get(f"tokenizer.ggml.{name}_token_id", default)
    return found if found is not None and 0 <= found < len(tokens) else None


def _wrap(backend: Tokenizer, meta: dict[str, Any], tokens: list[str]) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    named = {}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        found = _token_id(meta, key, tokens)
        if found is not None:
            named[f"{name}_token"] = tokens[found]
    pre = meta.get("tokenizer.ggml.pre")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:  # llama.cpp's default
        add_bos = meta.get("tokenizer.ggml.model") == "llama" or pre in _LLAMA3_STYLE
    wrapped = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)
    # Set before __init__, which keeps it: given as tokenizer_object it would be deep-copied
    # (serialized and parsed again), 1.5 s for Gemma 3's vocabulary.
    wrapped._tokenizer = backend  # type: ignore[assignment]  # a class attribute of None
    PreTrainedTokenizerFast.__init__(
        wrapped,
        **named,
        add_bos_token=bool(add_bos),
        add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    return wrapped
