"""Gemma 3 from GGUF: a tiny random Gemma 3 written as llama.cpp's converter writes it (its
metadata keys, the gguf package's tensor names, norms stored as 1 + w) loads to the folder's
model; and the real Gemma 3 270M Q4_K_M file's config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_writing import assert_read_alike, finish, shape_keys
from safetensors.torch import load_file

from radixrt.loader.gguf_loader import GGUFCheckpoint, hf_tensor_name
from radixrt.loader.load import load_model

# Windowed, global, windowed: llama.cpp's sliding_window_pattern 2 (every second layer global).
# A GGUF file has no query_pre_attn_scalar: llama.cpp scales by head_dim, as the releases do.
TINY = dict(
    query_pre_attn_scalar=32,
    layer_types=None,
    sliding_window_pattern=2,
    rope_parameters=None,
    rope_theta=500_000.0,
    rope_local_base_freq=20_000.0,
)


def write_gemma3_gguf(model_dir: str, out: Path) -> Path:
    import gguf
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    writer = gguf.GGUFWriter(str(out), "gemma3")
    shape_keys(writer, hf)
    writer.add_rope_freq_base(hf.rope_parameters["full_attention"]["rope_theta"])
    writer.add_float32(
        gguf.Keys.Rope.FREQ_BASE_SWA.format(arch="gemma3"),
        hf.rope_parameters["sliding_attention"]["rope_theta"],
    )
    writer.add_sliding_window(hf.sliding_window)
    writer.add_uint32(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch="gemma3"), 2)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, hf.num_hidden_layers)
    for name, tensor in load_file(Path(model_dir) / "model.safetensors").items():
        array = tensor.numpy()
        if name.endswith("norm.weight"):  # convert_hf_to_gguf.py's Gemma 3 norm shift
            array = (array + np.float32(1.0)).astype(np.float32)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), array)
    return finish(writer, out)


@pytest.fixture(scope="module")
def gemma3_gguf(tiny_model_dir, tmp_path_factory) -> tuple[str, str]:
    folder = tiny_model_dir("gemma3", **TINY)
    return folder, str(write_gemma3_gguf(folder, tmp_path_factory.mktemp("gguf") / "g3.gguf"))


def test_config_equals_the_folders(gemma3_gguf):
    from transformers import AutoConfig

    folder, path = gemma3_gguf
    ours, theirs = GGUFCheckpoint(path).hf_config(), AutoConfig.from_pretrained(folder)
    fields = [
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim",
        "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "vocab_size",
        "tie_word_embeddings", "layer_types", "sliding_window", "query_pre_attn_scalar",
        "hidden_activation",
    ]  # fmt: skip
    for field in fields:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert_read_alike(ours, theirs, "Gemma3ForCausalLM")
    assert theirs.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert ours.architectures == ["Gemma3ForCausalLM"]


def test_weights_equal_the_folders(gemma3_gguf):
    """Every tensor under its HF name; the norms' 1 + w taken back to w within an ulp of 1 + w
    (what GemmaRMSNorm multiplies by is then 1 + w again)."""
    folder, path = gemma3_gguf
    ours = dict(GGUFCheckpoint(path).weights())
    theirs = load_file(Path(folder) / "model.safetensors")
    assert set(ours) == set(theirs)
    assert "model.layers.1.pre_feedforward_layernorm.weight" in ours
    for name, tensor in ours.items():
        if name.endswith("norm.weight"):
            assert torch.equal(1.0 + tensor, 1.0 + theirs[name]), name
        else:
            assert torch.equal(tensor, theirs[name]), name


def test_forward_matches_transformers(gemma3_gguf, prefill_logits):
    """Twelve tokens through a window of 7: the windowed layers' band and rotary base count."""
    from transformers import AutoModelForCausalLM

    folder, path = gemma3_gguf
    model, cfg = load_model(path, torch.float32, "cpu")
    assert cfg.layer_windows == (7, 0, 7) and cfg.sliding_rope is not None
    assert cfg.sliding_rope.theta == 20_000.0 and cfg.rope.theta == 500_000.0
    tokens = [5, 300, 17, 42, 42, 9, 250, 3, 77, 1, 120, 64]
    ours = prefill_logits(model, cfg, tokens)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([tokens])).logits[0].float()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_gemma_block_names():
    assert hf_tensor_name("blk.2.ffn_norm.weight", "gemma3") == (
        "model.layers.2.pre_feedforward_layernorm.weight"
    )
    assert (
        hf_tensor_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"
    )
    assert hf_tensor_name("blk.0.post_ffw_norm.weight", "gemma3") == (
        "model.layers.0.post_feedforward_layernorm.weight"
    )
    with pytest.raises(ValueError, match="unknown GGUF tensor"):
        hf_tensor_name("blk.0.post_ffw_norm.weight", "llama")


def test_real_file_config(gemma3_file):
    """The released 270M: 18 layers, every sixth global (llama.cpp's default pattern), local
    rotary base 10,000, scores by head_dim 256, and <end_of_turn> as well as <eos> stops."""
    config = GGUFCheckpoint(gemma3_file).hf_config()
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert config.sliding_window == 512 and config.query_pre_attn_scalar == 256
    assert config.rope_local_base_freq == 10_000.0 and config.rope_theta == 1_000_000.0
    assert config.eos_token_id == [1, 106] and config.tie_word_embeddings
