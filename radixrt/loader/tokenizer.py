"""Tokenizer (with its chat template) for a model folder or a GGUF file."""

from __future__ import annotations

from pathlib import Path

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
        raise ValueError(f"no tokenizer in {path} (none of {list(TOKENIZER_FILES)}); give "
                         "tokenizer_path, or skip_tokenizer_init=True to serve token ids")
    try:
        if path.is_file() and path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"no tokenizer could be loaded from {path} ({e}); give "
                         "tokenizer_path, or skip_tokenizer_init=True to serve token ids") from e
