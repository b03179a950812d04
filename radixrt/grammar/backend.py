"""Compiles constraints for one tokenizer with xgrammar, off the scheduler's step loop.

A compiled grammar depends only on the constraint text (and the tokenizer), so compiled ones
are cached by text: the 64 requests of a batch with one schema compile it once. Compilation
runs on a worker thread; the scheduler keeps a request in its grammar queue until its future
is done, so a slow schema delays only its own request.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

CACHE_SIZE = 256
# xgrammar 0.2 writes the characters of a string with maxLength as [^"\\\r\n], which admits
# raw control characters (a tab, \x01) that JSON forbids inside strings; we tighten it.
_LOOSE_STRING_CHAR = r'[^\"\\\r\n]'
_JSON_STRING_CHAR = r'[^\0-\x1f\"\\]'


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, json_any_whitespace: bool = False) -> None:
        self.vocab_size = vocab_size
        self.json_any_whitespace = json_any_whitespace
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="radixrt-grammar")
        self.cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        # Importing xgrammar and reading the vocabulary take most of a second: on the worker
        # too, which runs this before any compile (one thread, tasks in order). `tokenizer`:
        # a transformers tokenizer or a LazyTokenizer.
        self._setup = self.pool.submit(self._make_compiler, tokenizer)

    def _make_compiler(self, tokenizer: Any):
        import xgrammar as xgr

        from radixrt.loader.tokenizer import LazyTokenizer

        if isinstance(tokenizer, LazyTokenizer):  # loading it may take seconds: here, too
            tokenizer = tokenizer.get()

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        return xgr, xgr.GrammarCompiler(info, cache_enabled=False)  # we cache by text

    @property
    def xgr(self):
        return self._setup.result()[0]

    def compile(self, kind: str, text: str) -> Future:
        """A future of the compiled grammar (from the cache when the text was seen)."""
        key = (kind, text)
        future = self.cache.get(key)
        if future is None or (future.done() and future.exception() is not None):
            future = self.pool.submit(self._compile, kind, text)
            self.cache[key] = future
            if len(self.cache) > CACHE_SIZE:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        return future

    def _compile(self, kind: str, text: str):
        c = self._setup.result()[1]
        if kind == "regex":
            return c.compile_regex(text)
        if kind == "ebnf":
            return c.compile_grammar(text)
        # JSON: json.dumps' spacing unless any whitespace is allowed (small models given the
        # freedom tend to loop on newlines until max_new_tokens cuts the JSON short).
        grammar = self.xgr.Grammar.from_json_schema(text, any_whitespace=self.json_any_whitespace)
        ebnf = str(grammar)
        if _LOOSE_STRING_CHAR in ebnf:
            grammar = self.xgr.Grammar.from_ebnf(ebnf.replace(_LOOSE_STRING_CHAR,
                                                              _JSON_STRING_CHAR))
        return c.compile_grammar(grammar)

    def matcher(self, compiled) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def apply_masks(self, logits: torch.Tensor, matchers: list[Any], rows: list[int]) -> None:
        """Mask, in place, the tokens each matcher forbids next in its row of `logits`
        ([B, vocab] float32). One bitmask for the batch, filled for the constrained rows."""
        bitmask = self.xgr.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        for matcher, row in zip(matchers, rows):
            matcher.fill_next_token_bitmask(bitmask, row)
        self.xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
