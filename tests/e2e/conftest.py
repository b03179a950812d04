"""Fixtures of the end-to-end tests (the reference helpers are in hf_reference.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def hf_loader():
    """Loads a transformers model in float32 from a folder or a GGUF file, cached per path."""
    from transformers import AutoModelForCausalLM

    cache: dict[str, object] = {}

    def load(path: str):
        if path not in cache:
            if path.endswith(".gguf"):
                import os

                model = AutoModelForCausalLM.from_pretrained(
                    os.path.dirname(path), gguf_file=os.path.basename(path),
                    dtype=torch.float32)
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            cache[path] = model.eval()
        return cache[path]

    return load
