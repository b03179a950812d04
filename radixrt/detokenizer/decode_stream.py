"""The two ways radixrt turns a request's growing list of token ids into whole-character text,
behind one small interface (`TextDecoder`: push ids, get the new text; flush at the end):

- `StreamDecoder`: the `tokenizers` package's `decoders.DecodeStream`, which keeps the
  window of ids in Rust (measured by scripts/bench_detokenize.py at about a twentieth of the
  Python path's cost per token). Used for fast (`tokenizers`-backed) tokenizers whose
  `decode` is the backend's `decode` unchanged.
- `WindowDecoder`: the tokenizer's own `decode` on a short window of ids, the text of the newest
  ids being decode(ids[surr:]) minus decode(ids[surr:read]), where the few ids before `read`
  give the tokenizer the context it needs to place spaces. Used for slow tokenizers, and where
  transformers post-processes the backend's text (clean_up_tokenization_spaces), and by
  `StreamDecoder` itself if DecodeStream refuses a window.

Both hold back ids that end inside a UTF-8 character, and move their window in the same
places, so they produce the same text (tests/unit/test_decode_stream.py checks it).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

# Text whose spaces transformers' clean_up_tokenization would change (" ." -> "."): where the
# tokenizer's decode differs from its backend's on it, the backend's text is not the answer.
_CLEANUP_PROBE = "a . b , c ! d ? e 's f n't g 'm h 're"
_fast_backends: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class TextDecoder(Protocol):
    def push(self, new_ids: list[int]) -> str:
        """Take new ids; return the text they complete (whole characters only, maybe "")."""
        ...

    def flush(self) -> str:
        """The text of the ids held back, an incomplete character as U+FFFD."""
        ...


class WindowDecoder:
    """Today's path: a tokenizer's `decode` over a short window of ids."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.surr = 0  # start of the context window
        self.read = 0  # ids[:read] have given their text

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        return self._advance(allow_partial=False)

    def flush(self) -> str:
        return self._advance(allow_partial=True)

    def _advance(self, allow_partial: bool) -> str:
        if self.read == len(self.ids):
            return ""
        before = self.decode(self.ids[self.surr : self.read])
        full = self.decode(self.ids[self.surr :])
        if full.endswith("\ufffd") and not allow_partial:
            return ""  # a multi-byte character is not complete yet
        self.surr, self.read = self.read, len(self.ids)
        return full[len(before) :]


class StreamDecoder:
    """DecodeStream over the backend (`tokenizers.Tokenizer`) of a fast tokenizer. Its window
    is mirrored here (`window`: the same ids, surr and read), for the final flush (DecodeStream
    returns nothing for an unfinished character) and in case DecodeStream raises."""

    def __init__(self, backend: Any, skip_special_tokens: bool) -> None:
        self.backend = backend
        self.skip_special_tokens = skip_special_tokens
        self.stream: DecodeStream | None = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.window = WindowDecoder(self._decode)

    def _decode(self, ids: list[int]) -> str:
        text: str = self.backend.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return text

    def push(self, new_ids: list[int]) -> str:
        window = self.window
        if self.stream is None:
            return window.push(new_ids)
        if not new_ids:
            return ""
        window.ids.extend(new_ids)
        try:
            # One id (a decode step's usual output) is stepped as an int: a list costs more.
            step = new_ids[0] if len(new_ids) == 1 else new_ids
            chunk = self.stream.step(self.backend, step)
        except Exception:  # noqa: BLE001 - DecodeStreamError: the window's text changed
            self.stream = None  # the window path from here on, from the same window
            return window.push([])
        if chunk is None:  # an unfinished character, or no new text (a skipped token)
            return ""
        window.surr, window.read = window.read, len(window.ids)  # as DecodeStream moved
        return chunk

    def flush(self) -> str:
        return self.window.flush()


def new_decoder(
    tokenizer: Any, skip_special_tokens: bool, spaces_between_special_tokens: bool
) -> TextDecoder:
    """DecodeStream where `tokenizer` allows it (see the module's docstring), else a window."""
    backend = fast_backend(tokenizer)
    if backend is not None:
        return StreamDecoder(backend, skip_special_tokens)
    kwargs = {
        "skip_special_tokens": skip_special_tokens,
        "spaces_between_special_tokens": spaces_between_special_tokens,
    }
    return WindowDecoder(lambda ids: tokenizer.decode(ids, **kwargs))


def fast_backend(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` whose decode is `tokenizer`'s, or None (slow tokenizer,
    or one whose text transformers post-processes). Cached per tokenizer."""
    try:
        return _fast_backends[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable: worked out each time
        return _find_fast_backend(tokenizer)
    backend = _fast_backends[tokenizer] = _find_fast_backend(tokenizer)
    return backend


def _find_fast_backend(tokenizer: Any) -> Any | None:
    # radixrt.loader.tokenizer.LazyTokenizer loads its tokenizer on first use.
    loaded = tokenizer.get() if hasattr(tokenizer, "get") else tokenizer
    if isinstance(loaded, Tokenizer):  # a backend already (LazyTokenizer's decode_only)
        return loaded
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "decode"):
        return None
    if getattr(loaded, "clean_up_tokenization_spaces", False):
        ids = loaded.encode(_CLEANUP_PROBE, add_special_tokens=False)
        if loaded.decode(ids) != backend.decode(ids, skip_special_tokens=False):
            return None
    return backend
