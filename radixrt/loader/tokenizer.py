"""Tokenizer (with its chat template) for a model folder or a GGUF file."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(model_path: str, tokenizer_path: str | None = None) -> PreTrainedTokenizerBase:
    """Load through transformers' AutoTokenizer from `tokenizer_path` if given, else from
    `model_path`: a folder, or a .gguf file (its embedded vocabulary and chat template).

    FileNotFoundError if the path does not exist.
    """
    path = Path(tokenizer_path or model_path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path not found: {path}")
    if path.is_file() and path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))
