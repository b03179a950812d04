"""A GGUF file's config (loader/gguf_config.py, a plain object) against the config transformers'
own class builds from the same fields: every architecture's model reads the same
TransformerConfig and EOS ids from both, with the file's fields and with none but the shape
(where every default of gguf_config.HF_DEFAULTS shows). And loading a GGUF model leaves
transformers unimported."""

from __future__ import annotations

from typing import Any

import pytest
from launch_helpers import fresh_python_lines

from radixrt.loader.default_model import default_model_path
from radixrt.loader.gguf_config import HF_DEFAULTS, gguf_config
from radixrt.loader.gguf_loader import GGUFCheckpoint
from radixrt.loader.gguf_metadata import ARCHS
from radixrt.loader.hf_config import eos_token_ids
from radixrt.models.registry import get_model_class

_ARCHITECTURE = dict(ARCHS.values())  # model_type -> HF architecture name
_SHAPE = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
    "max_position_embeddings": 512,
}  # fmt: skip

# Fields as GGUF files set them beside the shape (gguf_loader.GGUFCheckpoint.config_fields).
_FILE_FIELDS: dict[str, dict[str, Any]] = {
    "llama": {"rope_theta": 100000.0, "rms_norm_eps": 1e-5, "head_dim": 16, "eos_token_id": 7},
    "qwen2": {"rope_theta": 1000000.0, "eos_token_id": 9, "bos_token_id": 8},
    "qwen3": {"head_dim": 32, "rope_theta": 1000000.0, "rope_scaling": {
        "rope_type": "linear", "factor": 2.0}},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "norm_topk_prob": True, "mlp_only_layers": []},
    "gemma3_text": {
        "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 32,
        "sliding_window_pattern": 3, "rope_local_base_freq": 5000.0,
        "eos_token_id": [1, 3], "layer_types": ["sliding_attention", "full_attention"] * 3,
    },
    "smollm3": {"rope_theta": 5000000.0, "eos_token_id": 5},
    "phi3": {"partial_rotary_factor": 0.5, "sliding_window": None, "eos_token_id": [2, 3],
             "original_max_position_embeddings": 256, "rope_scaling": {
                 "rope_type": "longrope", "long_factor": [1.5] * 4, "short_factor": [1.0] * 4}},
}  # fmt: skip


def _read(config: Any) -> tuple[Any, list[int]]:
    """What the loader takes from a config: the TransformerConfig (or the error) and EOS ids."""
    model_cls = get_model_class(config.architectures[0])
    try:
        layers: Any = model_cls.config_from_hf(config)
    except ValueError as e:
        layers = f"ValueError: {e}"
    return layers, eos_token_ids(config, None)


def _both(model_type: str, fields: dict[str, Any]) -> tuple[Any, Any]:
    from transformers import AutoConfig

    fields = {"architectures": [_ARCHITECTURE[model_type]], **_SHAPE, **fields}
    theirs = AutoConfig.for_model(model_type, **fields)
    return _read(gguf_config(model_type, fields)), _read(theirs)


@pytest.mark.parametrize("model_type", sorted(HF_DEFAULTS))
def test_shape_alone_reads_as_transformers_defaults(model_type):
    ours, theirs = _both(model_type, {})
    assert ours == theirs


@pytest.mark.parametrize("model_type", sorted(HF_DEFAULTS))
def test_a_files_fields_read_as_transformers_class(model_type):
    ours, theirs = _both(model_type, _FILE_FIELDS[model_type])
    assert not isinstance(ours[0], str), ours[0]  # a config the model takes, not an error
    assert ours == theirs


def test_every_gguf_architecture_has_defaults():
    assert {model_type for model_type, _ in ARCHS.values()} == set(HF_DEFAULTS)


def test_the_default_models_config_reads_as_transformers_class():
    from transformers import AutoConfig

    checkpoint = GGUFCheckpoint(default_model_path())
    fields = checkpoint.config_fields()
    theirs = AutoConfig.for_model("llama", **fields)
    assert _read(checkpoint.hf_config()) == _read(theirs)


def test_loading_a_gguf_model_does_not_import_transformers():
    # Its config classes' modules cost a scheduler ~90 MiB (gguf_config.py's docstring).
    code = (
        "import sys\n"
        "from radixrt.loader.load import load_model\n"
        "from radixrt.loader.default_model import default_model_path\n"
        "load_model(default_model_path(), 'bfloat16', 'cpu', int8_rows=-1)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers')[:3])\n"
    )
    assert fresh_python_lines(code)[-1] == "[]"
