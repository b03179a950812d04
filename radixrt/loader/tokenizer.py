"""Tokenizer (with its chat template) for a model folder or a GGUF file.

transformers is imported when a tokenizer is loaded, not with this module, so that the HTTP
process can keep torch out first (keep_torch_out).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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
    from transformers import AutoTokenizer

    try:
        if path.is_file() and path.suffix == ".gguf":
            if importlib.util.find_spec("torch") is None:
                return _gguf_in_child(path)
            return _gguf_tokenizer(path)
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
            if ready:
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
    loads tokenizers without it; a GGUF tokenizer, which it reads only through torch, is
    read in a child process (load_tokenizer), and xgrammar runs in one
    (grammar/xgrammar_process.py). Call it before transformers is imported: it decides once
    whether torch is there."""
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


def _gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _gguf_in_child(path: Path) -> PreTrainedTokenizerBase:
    """A GGUF file's tokenizer read by a child process (transformers reads GGUF through
    torch, which this one keeps out), saved to a folder and loaded from there: the same round
    trip the scheduler's copy (hand_over_tokenizer) makes."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="radixrt-tokenizer-") as folder:
        child = subprocess.run(
            [sys.executable, "-m", __name__, str(path), folder], capture_output=True, text=True
        )
        if child.returncode != 0:
            lines = child.stderr.strip().splitlines() or [f"exit status {child.returncode}"]
            raise ValueError(lines[-1])
        return AutoTokenizer.from_pretrained(folder)


def hand_over_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: str) -> None:
    """Save a loaded tokenizer for another process; the folder appears whole or not at all."""
    tmp = folder + ".partial"
    tokenizer.save_pretrained(tmp)
    os.rename(tmp, folder)


if __name__ == "__main__":  # _gguf_in_child: python -m radixrt.loader.tokenizer FILE FOLDER
    try:
        _gguf_tokenizer(Path(sys.argv[1])).save_pretrained(sys.argv[2])
    except (OSError, ValueError, TypeError) as e:  # load_tokenizer's message quotes it
        sys.exit(str(e))
