"""An unsupported architecture is refused by name, with the supported ones listed, before an
Engine loads a tokenizer or starts a process (loader/supported.py)."""

from __future__ import annotations

import json

import pytest

import radixrt
from radixrt.loader import tokenizer as tokenizer_module
from radixrt.loader.supported import refuse_unsupported
from radixrt.models.registry import SUPPORTED_ARCHITECTURES


@pytest.fixture
def no_tokenizer(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded before the refusal")

    monkeypatch.setattr(tokenizer_module, "load_tokenizer", fail)


def test_folder_of_an_unknown_architecture(tmp_path, no_tokenizer):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="'GPT2LMHeadModel'.*supported: .*Gemma3ForCausalLM"):
        radixrt.Engine(model_path=str(tmp_path), device="cpu")


def test_gguf_of_an_unknown_architecture(tmp_path, no_tokenizer):
    import gguf

    path = tmp_path / "phi2.gguf"
    writer = gguf.GGUFWriter(str(path), "phi2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="general.architecture 'phi2' is not supported.*gemma3"):
        radixrt.Engine(model_path=str(path), device="cpu")


def test_supported_ones_pass(default_model_file, tmp_path):
    refuse_unsupported(default_model_file)
    for arch in SUPPORTED_ARCHITECTURES:
        (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
        refuse_unsupported(str(tmp_path))


@pytest.fixture
def default_model_file() -> str:
    from radixrt.loader.default_model import default_model_path

    return default_model_path()
