"""Tokenizer (with its chat template) for a model folder or a GGUF file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from transformers import AutoTokenizer, PreTrainedTokenizerBase

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model_path: str, tokenizer_path: str | None = None) -> PreTrainedTokenizerBase:
    """Load through transformers' AutoTokenizer from `tokenizer_path` if given, else from
    `model_path`: a folder, or a .gguf file (its embedded vocabulary and chat template).

    FileNotFoundError if the path does not exist; ValueError if it holds no usable tokenizer.
    """
    path = Path(tokenizer_path or model_path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path not found: {path}")
    if path.is_dir() and not any((path / f).exists() for f in TOKENIZER_FILES):
        # transformers would quietly build an empty tokenizer here.
        raise ValueError(
            f"no tokenizer in {path} (none of {list(TOKENIZER_FILES)}); give "
            "tokenizer_path, or skip_tokenizer_init=True to serve token ids"
        )
    try:
        if path.is_file() and path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(
            f"no tokenizer could be loaded from {path} ({e}); give "
            "tokenizer_path, or skip_tokenizer_init=True to serve token ids"
        ) from e


class LazyTokenizer:
    """Loads the tokenizer on first use. The scheduler needs one only to match stop strings,
    and building it from a GGUF file takes seconds that startup need not wait for; by first
    use the frontend has usually saved its copy to `prepared_dir` (fast to load)."""

    def __init__(
        self, model_path: str, tokenizer_path: str | None = None, prepared_dir: str | None = None
    ) -> None:
        self._args = (model_path, tokenizer_path)
        self._prepared_dir = prepared_dir
        self._tokenizer: PreTrainedTokenizerBase | None = None

    @classmethod
    def for_process(
        cls,
        model_path: str | None,
        tokenizer_path: str | None,
        skip_tokenizer_init: bool,
        prepared_dir: str | None,
    ) -> LazyTokenizer | None:
        """The tokenizer of a scheduler or detokenizer process (None: token ids only)."""
        if skip_tokenizer_init:
            return None
        from radixrt.loader.default_model import default_model_path

        return cls(model_path or default_model_path(), tokenizer_path, prepared_dir)

    def get(self) -> PreTrainedTokenizerBase:
        """The tokenizer itself, loaded now if it was not yet."""
        if self._tokenizer is None:
            ready = self._prepared_dir and Path(self._prepared_dir).is_dir()
            self._tokenizer = (
                AutoTokenizer.from_pretrained(self._prepared_dir)
                if ready
                else load_tokenizer(*self._args)
            )
        return self._tokenizer

    def decode(self, *args: Any, **kwargs: Any) -> str:
        # One sequence of ids decodes to one string (a batch would give a list).
        return cast(str, self.get().decode(*args, **kwargs))

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        ids: list[int] = self.get().encode(*args, **kwargs)
        return ids


def hand_over_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: str) -> None:
    """Save a loaded tokenizer for another process; the folder appears whole or not at all."""
    tmp = folder + ".partial"
    tokenizer.save_pretrained(tmp)
    os.rename(tmp, folder)
