"""Tokenizer (with its chat template) for a model folder or a GGUF file.

transformers is imported when a tokenizer is loaded, not with this module, so that the HTTP
process can keep torch out first (keep_torch_out). A GGUF file's tokenizer is built from its
metadata by gguf_tokenizer.py, without torch.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model_path: str, tokenizer_path: str | None = None) -> PreTrainedTokenizerBase:
    """Load from `tokenizer_path` if given, else from `model_path`: a folder (transformers'
    AutoTokenizer), or a .gguf file (its embedded vocabulary and chat template, built as
    llama.cpp tokenizes: gguf_tokenizer.py).

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
            from radixrt.loader.gguf_tokenizer import build_gguf_tokenizer

            return build_gguf_tokenizer(path)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(
            f"no tokenizer could be loaded from {path} ({e}); give "
            "tokenizer_path, or skip_tokenizer_init=True to serve token ids"
        ) from e


class LazyTokenizer:
    """Loads the tokenizer on first use. The scheduler needs one only to match stop strings,
    and loading one can take seconds that startup need not wait for; by first use the
    frontend has usually saved its copy to `prepared_dir`."""

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None = None,
        prepared_dir: str | None = None,
        decode_only: bool = False,
    ) -> None:
        self._args = (model_path, tokenizer_path)
        self._prepared_dir = prepared_dir
        # A GGUF file's tokenizer is then its `tokenizers.Tokenizer` alone (the detokenizer's:
        # decode_stream.py decodes with that backend anyway), without transformers.
        self._decode_only = decode_only
        self._tokenizer: Any = None

    @classmethod
    def for_process(
        cls,
        model_path: str | None,
        tokenizer_path: str | None,
        skip_tokenizer_init: bool,
        prepared_dir: str | None,
        decode_only: bool = False,
    ) -> LazyTokenizer | None:
        """The tokenizer of a scheduler or detokenizer process (None: token ids only)."""
        if skip_tokenizer_init:
            return None
        from radixrt.loader.default_model import default_model_path

        return cls(model_path or default_model_path(), tokenizer_path, prepared_dir, decode_only)

    def get(self) -> Any:
        """The tokenizer itself, loaded now if it was not yet: transformers' (or, decode-only
        from a GGUF file, a `tokenizers.Tokenizer`)."""
        if self._tokenizer is None:
            ready = self._prepared_dir and Path(self._prepared_dir).is_dir()
            # A GGUF file's own tokenizer builds faster than its saved copy loads (0.9 s
            # against 2.2 s for a 262k vocabulary): the copy serves folder tokenizers.
            path = Path(self._args[1] or self._args[0])
            from_file = path.suffix == ".gguf"
            if from_file and self._decode_only and path.is_file():
                from radixrt.loader.gguf_tokenizer import build_gguf_backend

                self._tokenizer = build_gguf_backend(path)
            elif ready and not from_file:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self._prepared_dir)
            else:
                self._tokenizer = load_tokenizer(*self._args)
        return self._tokenizer

    def decode(self, *args: Any, **kwargs: Any) -> str:
        # One sequence of ids decodes to one string (a batch would give a list).
        return cast(str, self.get().decode(*args, **kwargs))

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        ids: list[int] = self.get().encode(*args, **kwargs)
        return ids


def keep_torch_out() -> None:
    """For a process that must stay torch-free (the HTTP server's): torch cannot be imported
    from now on. transformers, which imports torch whenever it can (AutoTokenizer does), then
    loads tokenizers without it; a GGUF file's tokenizer never needed it (gguf_tokenizer.py),
    and xgrammar runs in a child process (grammar/xgrammar_process.py). Call it before
    transformers is imported: it decides once whether torch is there."""
    if "torch" in sys.modules or "transformers" in sys.modules:  # launched from a caller's
        # own process (a notebook, an embedding program): it keeps torch, and works the same
        logging.getLogger("radixrt.server").info("torch already loaded: the server keeps it")
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    # Imported now, without its advice to install torch (read when it is given).
    quiet = "TRANSFORMERS_NO_ADVISORY_WARNINGS" not in os.environ
    if quiet:
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    import transformers  # noqa: F401

    if quiet:
        del os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"]


def hand_over_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: str) -> None:
    """Save a loaded tokenizer for another process; the folder appears whole or not at all."""
    tmp = folder + ".partial"
    tokenizer.save_pretrained(tmp)
    os.rename(tmp, folder)
