"""Fixtures of the end-to-end tests (the reference helpers are in hf_reference.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_tokenizer_dir(tmp_path_factory) -> str:
    """The default model's tokenizer, read from its GGUF file once and saved as a folder: an
    engine given it as tokenizer_path loads it in a fraction of a second instead of rebuilding
    it from the GGUF vocabulary (seconds) at every start."""
    from radixrt.loader.default_model import default_model_path
    from radixrt.loader.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("default-tokenizer")
    load_tokenizer(default_model_path()).save_pretrained(folder)
    return str(folder)
