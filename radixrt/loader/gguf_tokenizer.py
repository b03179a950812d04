"""A GGUF file's tokenizer, built with `tokenizers` from its tokenizer.ggml.* metadata so that it
splits text into the ids llama.cpp's (src/llama-vocab.cpp) would.

Torch-free and quick (the header is read straight from the file, the merges a SentencePiece
vocabulary implies are found with numpy): the HTTP process builds it itself, Gemma 3's 262k
tokens in under a second, where transformers' own GGUF path takes 14 s and needs torch.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from radixrt.loader.gguf_metadata import read_tokenizer_metadata

if TYPE_CHECKING:
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

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
_CJK = "[一-龥ࠀ-一가-퟿]+"
_DEEPSEEK_LETTERS = (  # as llama.cpp lists them
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽ"
    "ᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴ"
    "ῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ"
    "-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
)
_DEEPSEEK_PUNCT = r"\s?[!-/:-~！-／：-～‘-‟　-。]+"
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


def build_gguf_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer of a GGUF file whose tokenizer.ggml.model is "gpt2" (byte-level BPE) or
    "llama" (SentencePiece BPE), with its special tokens, BOS/EOS rule and chat template.

    ValueError for another model, or for a pre-tokenizer not in PRE_SPLITS (unknown to
    llama.cpp too, or not yet written down here: give tokenizer_path instead).
    """
    backend, meta, tokens = _without_gc_scans(path)
    return _wrap(backend, meta, tokens)


def build_gguf_backend(path: str | Path) -> Tokenizer:
    """The same tokenizer's `tokenizers.Tokenizer` alone, for a process that only turns ids
    into text (the detokenizer): without transformers' wrapper, whose import costs ~20 MiB,
    and without BPE merges, which only encoding reads (Gemma 3's 262k vocabulary: 97 -> 59
    MiB, 2.0 -> 0.7 s). It decodes every id as the whole tokenizer does; it must not encode."""
    return _without_gc_scans(path, merges=False)[0]


def _without_gc_scans(
    path: str | Path, merges: bool = True
) -> tuple[Tokenizer, dict[str, Any], list[str]]:
    # The build makes half a million strings, tuples and arrays in a row, which the cyclic
    # garbage collector would scan over and over (0.1 s for Gemma 3): none of them is garbage.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build(path, merges)
    finally:
        if collecting:
            gc.enable()


def _build(path: str | Path, merges: bool = True) -> tuple[Tokenizer, dict[str, Any], list[str]]:
    meta = read_tokenizer_metadata(path)
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens", [])
    if "" in tokens:  # llama.cpp's name for an empty token: the vocabulary needs distinct texts
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    ids = dict(zip(tokens, range(len(tokens)), strict=True))
    if len(ids) < len(tokens):  # llama.cpp refuses such a file too
        raise ValueError("GGUF vocabulary lists a token twice")
    if model == "gpt2":
        backend = _byte_level_bpe(meta, ids, merges)
    elif model == "llama":
        backend = _sentencepiece_bpe(meta, tokens, ids, merges)
    else:
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported ('gpt2', 'llama')")
    backend.add_tokens(_added_tokens(tokens, _token_types(meta, ids)))
    return backend, meta, tokens


def _byte_level_bpe(meta: dict[str, Any], vocab: dict[str, int], with_merges: bool) -> Tokenizer:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = meta.get("tokenizer.ggml.pre") or "default"  # what llama.cpp falls back to
    if pre not in PRE_SPLITS:
        raise ValueError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {sorted(PRE_SPLITS)}"
        )
    merges = []
    for merge in meta.get("tokenizer.ggml.merges", []) if with_merges else []:
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


def _sentencepiece_bpe(
    meta: dict[str, Any], tokens: list[str], ids: dict[str, int], with_merges: bool
) -> Tokenizer:
    """llama.cpp's SPM tokenizer: spaces become "▁" (one more in front of each piece of text
    between special tokens, if add_space_prefix), then neighbours whose joined text is a token
    join, best score first; a character outside the vocabulary becomes its <0xXX> bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores", np.zeros(len(tokens), np.float32))
    unk = _token_id(meta, "unknown", tokens)
    model = models.BPE(
        ids,
        _score_merges(tokens, scores[: len(tokens)]) if with_merges else [],
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
    """As BPE merges, llama.cpp's rule "two neighbours whose joined text is a token join, the
    best-scored token first (the leftmost pair on a tie)".

    Until a token forms, what happens inside its span does not depend on the text around it, so
    llama.cpp forms each token by one merge only: the last one it makes on the token's own text.
    Those merges, ranked by the token's score (ties: lower id first), tokenize as llama.cpp does;
    every cut of every token would too, but Gemma 3 has twice as many (514k against 236k), a
    quarter of a second more for tokenizers to build.
    """
    whole, left, right = _forming_merges(_Texts(tokens), scores)
    order = np.lexsort((whole, -scores[whole]))
    texts = np.array(tokens, dtype=object)  # picks the halves' texts faster than a list does
    return list(zip(texts[left[order]].tolist(), texts[right[order]].tolist(), strict=True))


def _forming_merges(texts: _Texts, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token, left, right) ids of the merge that forms each token as llama.cpp tokenizes the
    token's own text (for the tokens it forms). All texts at once, a merge in each per round;
    a boundary between two symbols is kept as its position and the symbols' outer ends."""
    count = np.maximum(texts.lengths - 1, 0)
    owner = np.repeat(np.arange(count.size, dtype=np.int32), count)
    first_cut = np.repeat(np.cumsum(count, dtype=np.int32) - count, count)
    at = texts.starts[owner] + 1 + np.arange(owner.size, dtype=np.int32) - first_cut
    before, after = at - 1, at + 1
    score = texts.scores(scores, before, after)
    last = np.full((3, count.size), -1, np.int32)  # (before, at, after) of each last merge
    while owner.size:
        is_first = _run_starts(owner)
        firsts = np.flatnonzero(is_first)
        best = np.maximum.reduceat(score, firsts)  # each text's best pair,
        best = np.repeat(best, np.diff(firsts, append=owner.size))  # at each of its boundaries
        going = best > -np.inf  # no pair is a token: llama.cpp stops there too
        winners = np.flatnonzero(going & (score == best))
        merged = winners[_run_starts(owner[winners])]  # the leftmost of each text
        last[:, owner[merged]] = before[merged], at[merged], after[merged]
        left = merged[~is_first[merged]] - 1  # the neighbours take in the merged symbol
        right = merged + 1
        right = right[right < owner.size]
        right = right[~is_first[right]]
        after[left] = after[left + 1]
        before[right] = before[right - 1]
        changed = np.concatenate([left, right])
        score[changed] = texts.scores(scores, before[changed], after[changed])
        going[merged] = False
        kept = np.flatnonzero(going)
        owner, at, before, after = owner[kept], at[kept], before[kept], after[kept]
        score = score[kept]
    formed = np.flatnonzero((last[0] == texts.starts) & (last[2] == texts.ends))
    left = texts.find(last[0, formed], last[1, formed])
    right = texts.find(last[1, formed], last[2, formed])
    keep = (left >= 0) & (right >= 0)  # a character outside the vocabulary has no id
    return formed[keep], left[keep], right[keep]


def _run_starts(keys: np.ndarray) -> np.ndarray:
    """Where each run of equal keys starts (True there)."""
    starts = np.ones(keys.size, bool)
    starts[1:] = keys[1:] != keys[:-1]
    return starts


class _Texts:
    """The tokens' texts joined, and which token a slice of them is, for a million slices at
    once (numpy; a Python loop over Gemma 3's 1.2M cuts took over a second).

    A slice is known by its 64-bit polynomial hash (wrapping uint64 arithmetic) and length: two
    texts of a length collide by chance once in 2**64, and texts crafted to collide (Thue-Morse,
    thousands of characters long) could only make a vocabulary file tokenize itself wrongly.
    A token's id is in a table of 2**22 slots addressed by the top bits of its hash times an odd
    constant (short texts hash to small numbers); the 4% whose slot was taken are in a sorted
    array (np.searchsorted alone took ten times as long).
    """

    _BASE, _MIXER, _BITS = 0x5851F42D4C957F2D, np.uint64(0x9E3779B97F4A7C15), 22  # odd, odd

    def __init__(self, tokens: list[str]) -> None:
        # int32 positions: half the memory (and page faults) of int64, for 1.5M characters
        self.lengths = np.fromiter(map(len, tokens), np.int32, len(tokens))
        self.ends = np.cumsum(self.lengths, dtype=np.int32)
        self.starts = self.ends - self.lengths
        codes = np.frombuffer("".join(tokens).encode("utf-32-le"), np.uint32) + np.uint64(1)
        # prefix[i] = sum(codes[j] * base**j for j < i), and base**-i
        powers = np.full(codes.size + 1, self._BASE, np.uint64)
        self.inverses = np.full(codes.size + 1, pow(self._BASE, -1, 1 << 64), np.uint64)
        powers[0] = self.inverses[0] = 1
        powers, self.inverses = np.cumprod(powers), np.cumprod(self.inverses)
        self.prefix = np.zeros(codes.size + 1, np.uint64)
        np.cumsum(codes * powers[:-1], out=self.prefix[1:])
        self.keys = self._hash(self.starts, self.ends)
        at = self._slot(self.keys)
        self.slots = np.full(1 << self._BITS, -1, np.int32)
        self.slots[at] = np.arange(len(tokens))
        lost = np.flatnonzero(self.slots[at] != np.arange(len(tokens)))
        self.crowded = np.zeros(1 << self._BITS, bool)
        self.crowded[at[lost]] = True
        order = np.argsort(self.keys[lost])
        self.lost_keys, self.lost_ids = self.keys[lost][order], lost[order]

    def _hash(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        return (self.prefix[end] - self.prefix[start]) * self.inverses[start]

    def _slot(self, keys: np.ndarray) -> np.ndarray:
        # as int64 by a view: indexing converts a uint64 array with a copy
        return ((keys * self._MIXER) >> np.uint64(64 - self._BITS)).view(np.int64)

    def find(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The id of the token whose text is text[start:end], or -1, for each pair."""
        key = self._hash(start, end)
        at = self._slot(key)
        ids = self.slots[at]
        found = np.where(self.keys[ids] == key, ids, -1)  # keys[-1] on an empty slot: -1
        retry = np.flatnonzero((found < 0) & self.crowded[at])
        if retry.size and self.lost_keys.size:
            near = np.searchsorted(self.lost_keys, key[retry])
            near = np.minimum(near, self.lost_keys.size - 1)
            hit = self.lost_keys[near] == key[retry]
            found[retry[hit]] = self.lost_ids[near[hit]]
        return np.where(self.lengths[found] == end - start, found, -1)

    def scores(self, scores: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The score of the token text[start:end] is, or -inf where it is none."""
        ids = self.find(start, end)
        return np.where(ids >= 0, scores[ids], -np.inf)


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
