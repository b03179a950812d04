"""Compiles constraints for one tokenizer with xgrammar, off the scheduler's step loop.

A compiled grammar depends only on the constraint text (and the tokenizer), so compiled ones
are cached by text: the 64 requests of a batch with one schema compile it once. Compilation
runs on a worker thread; the scheduler keeps a request in its grammar queue until its future
is done, so a slow schema delays only its own request (and the scheduler gives up on it after
--grammar-compile-timeout). The frontend's ConstraintChecker compiles with the same code.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from radixrt.grammar.constraint import parse_constraint
from radixrt.grammar.workers import DaemonExecutor

if TYPE_CHECKING:  # torch only in annotations: the frontend's checker imports this module
    import torch

CACHE_SIZE = 256


def make_compiler(tokenizer: Any, vocab_size: int) -> tuple[Any, Any]:
    """(the xgrammar module, a GrammarCompiler for `tokenizer`): a transformers tokenizer, or
    an object whose get() loads one (the loader's LazyTokenizer: loading may take seconds, so
    it happens here, on the caller's worker). Takes most of a second (importing xgrammar,
    reading the vocabulary)."""
    import xgrammar as xgr

    load = getattr(tokenizer, "get", None)  # transformers' tokenizers have no get()
    if callable(load):
        tokenizer = load()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    return xgr, xgr.GrammarCompiler(info, cache_enabled=False)  # callers cache by text


def allows_some_token(xgr: Any, compiled: Any, vocab_size: int) -> bool:
    """Whether a fresh matcher of `compiled` allows any first token. False means no text of
    this vocabulary starts the language (a grammar that may end at once allows the stop
    token, so it is True there)."""
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask, 0)
    return bool((bitmask != 0).any())


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, json_any_whitespace: bool = False) -> None:
        self.vocab_size = vocab_size
        self.json_any_whitespace = json_any_whitespace
        self.pool = DaemonExecutor(1, "radixrt-grammar")
        self.cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        # On the worker too, which runs this before any compile (one thread, tasks in order).
        self._setup = self.pool.submit(make_compiler, tokenizer, vocab_size)

    @property
    def xgr(self):
        return self._setup.result()[0]

    def compile(self, kind: str, text: str) -> Future:
        """A future of the compiled grammar (from the cache when the text was seen). Its
        `started_at` says when the compile began (None: still queued)."""
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
        xgr, compiler = self._setup.result()
        return compiler.compile_grammar(parse_constraint(xgr, kind, text, self.json_any_whitespace))

    def allows_some_token(self, compiled) -> bool:
        return allows_some_token(self.xgr, compiled, self.vocab_size)

    def matcher(self, compiled) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def new_bitmask(self, rows: int) -> torch.Tensor:
        """An int32 bitmask [rows, ceil(vocab / 32)] for `fill_next_token_bitmask`."""
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Mask, in place, the tokens forbidden in bitmask[row] in logits[row] for each row."""
        if rows:
            self.xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)

    def close(self) -> None:
        self.pool.shutdown()
