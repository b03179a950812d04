"""SmolLM3 and Phi-3 from GGUF: tiny random models written as llama.cpp's converter writes them
(its metadata keys, the gguf package's tensor names; SmolLM3's q/k rows permuted as Llama's,
Phi-3's stacked qkv / gate-up tensors and LongRoPE factor tensors) load to the folder's config,
weights and logits; a Phi-3 file in Q8_0 keeps its stacked tensors packed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_writing import assert_read_alike, finish, shape_keys
from safetensors.torch import load_file

from radixrt.layers.linear import MergedLinear
from radixrt.loader.gguf_loader import GGUFCheckpoint, hf_tensor_name
from radixrt.loader.load import load_model

# llama.cpp has no GGUF key for SmolLM3's NoPE layers: it hardcodes every fourth (as
# transformers' default no_rope_layer_interval), so the file's model must have that pattern;
# and its converter writes no window for SmolLM3.
SMOLLM3 = dict(no_rope_layers=None, use_sliding_window=False, sliding_window=None)
PHI3_END = "<|end|>"


def _llama_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    # convert_hf_to_gguf.py's LlamaModel.permute: each head's two rotary halves interleaved.
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_smollm3_gguf(model_dir: str, out: Path) -> Path:
    import gguf
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    writer = gguf.GGUFWriter(str(out), "smollm3")
    shape_keys(writer, hf, head_dim=False)
    writer.add_rope_freq_base(hf.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(hf.hidden_size // hf.num_attention_heads)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.SMOLLM3, hf.num_hidden_layers)
    for name, tensor in load_file(Path(model_dir) / "model.safetensors").items():
        array = tensor.numpy()
        if name.endswith("q_proj.weight"):
            array = _llama_permute(array, hf.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _llama_permute(array, hf.num_key_value_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), array)
    return finish(writer, out)


def write_phi3_gguf(model_dir: str, out: Path, quantize: bool = False) -> Path:
    """As Phi3MiniModel writes it; `quantize`: its 2-D weights in Q8_0 (norms stay F32)."""
    import gguf
    from gguf.quants import quantize as to_q8
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    rope = hf.rope_parameters
    writer = gguf.GGUFWriter(str(out), "phi3")
    shape_keys(writer, hf, head_dim=False)
    writer.add_rope_freq_base(hf.rope_parameters["rope_theta"])
    original = rope["original_max_position_embeddings"]
    writer.add_rope_scaling_orig_ctx_len(original)
    rot = rope["partial_rotary_factor"]
    writer.add_rope_dimension_count(int(rot * hf.hidden_size) // hf.num_attention_heads)
    writer.add_sliding_window(hf.sliding_window or 0)
    scale = hf.max_position_embeddings / original
    # No vocab_size key: the vocabulary is the token list's (with <|end|> at 259 here).
    writer.add_token_list([PHI3_END if i == 259 else f"<t{i}>" for i in range(hf.vocab_size)])
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.PHI3, hf.num_hidden_layers)
    writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
    writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, tensor in load_file(Path(model_dir) / "model.safetensors").items():
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        array = tensor.numpy()
        if quantize and array.ndim == 2:
            writer.add_tensor(gguf_name, to_q8(array, q8), raw_dtype=q8)
        else:
            writer.add_tensor(gguf_name, array)
    return finish(writer, out)


@pytest.fixture(scope="module")
def smollm3_gguf(tiny_model_dir, tmp_path_factory) -> tuple[str, str]:
    folder = tiny_model_dir("smollm3", **SMOLLM3)
    return folder, str(write_smollm3_gguf(folder, tmp_path_factory.mktemp("gguf") / "s3.gguf"))


@pytest.fixture(scope="module")
def phi3_gguf(tiny_model_dir, tmp_path_factory) -> tuple[str, str]:
    folder = tiny_model_dir("phi3")
    return folder, str(write_phi3_gguf(folder, tmp_path_factory.mktemp("gguf") / "phi3.gguf"))


def _hf_logits(folder: str, tokens: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def _folder_config(folder: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def _same_config(path: str, folder: str, fields: list[str]) -> None:
    ours, theirs = GGUFCheckpoint(path).hf_config(), _folder_config(folder)
    for field in fields:
        assert getattr(ours, field) == getattr(theirs, field), field


COMMON = [
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
]  # fmt: skip


def test_smollm3_config_and_weights_equal_the_folders(smollm3_gguf):
    folder, path = smollm3_gguf
    _same_config(path, folder, COMMON)
    # The rope, the NoPE layers and the windows as the model reads them:
    assert_read_alike(
        GGUFCheckpoint(path).hf_config(), _folder_config(folder), "SmolLM3ForCausalLM"
    )
    ours = dict(GGUFCheckpoint(path).weights())
    theirs = load_file(Path(folder) / "model.safetensors")
    assert set(ours) == set(theirs)  # tied: no lm_head in either
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_smollm3_forward_matches_transformers(smollm3_gguf, prefill_logits):
    folder, path = smollm3_gguf
    model, cfg = load_model(path, torch.float32, "cpu")
    assert cfg.nope_layers == (3,) and cfg.layer_windows == ()
    tokens = [5, 300, 17, 42, 42, 9, 250, 3, 77, 1, 120, 64]
    ours = prefill_logits(model, cfg, tokens)
    torch.testing.assert_close(ours, _hf_logits(folder, tokens), atol=1e-4, rtol=0)


def test_phi3_config_and_weights_equal_the_folders(phi3_gguf):
    """The stacked tensors under the checkpoint's own names; LongRoPE's factors, its
    original length and attention factor, the partial rotary and the window from the file."""
    folder, path = phi3_gguf
    _same_config(path, folder, [*COMMON, "sliding_window", "original_max_position_embeddings"])
    config = GGUFCheckpoint(path).hf_config()
    assert config.eos_token_id == [258, 259]  # the file's, and <|end|> (llama.cpp: an EOG)
    rope, want = config.rope_scaling, load_model_config(folder)
    assert rope["rope_type"] == "longrope" and config.partial_rotary_factor == 0.75
    assert rope["long_factor"] == pytest.approx(want["long_factor"], rel=1e-7)
    assert rope["short_factor"] == pytest.approx(want["short_factor"], rel=1e-7)
    ours = dict(GGUFCheckpoint(path).weights())
    theirs = load_file(Path(folder) / "model.safetensors")
    assert set(ours) == set(theirs)
    assert "model.layers.0.self_attn.qkv_proj.weight" in ours
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def load_model_config(folder: str) -> dict:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder).rope_parameters


@pytest.mark.parametrize("n", [20, 70], ids=["short", "long"])
def test_phi3_forward_matches_transformers(phi3_gguf, prefill_logits, n):
    """Under and over the original length of 64: the short and the long factors, both scaled
    by the file's attention factor, over the first 18 of 24 dims; a window of 40."""
    folder, path = phi3_gguf
    model, cfg = load_model(path, torch.float32, "cpu")
    assert cfg.rope.rotary_dim(cfg.head_dim) == 18 and cfg.layer_windows == (40, 40)
    assert cfg.rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(8) / math.log(64)))
    tokens = [(7 * i + 3) % 300 + 3 for i in range(n)]
    ours = prefill_logits(model, cfg, tokens)
    torch.testing.assert_close(ours, _hf_logits(folder, tokens), atol=1e-4, rtol=0)


def test_phi3_q8_0_keeps_stacked_tensors_packed(tiny_model_dir, tmp_path, prefill_logits):
    """--quantization auto takes attn_qkv and ffn_up (gate and up stacked) as stored, and
    computes what the same file dequantized computes."""
    path = str(write_phi3_gguf(tiny_model_dir("phi3"), tmp_path / "q8.gguf", quantize=True))
    packed, _ = load_model(path, torch.float32, "cpu", quantization="auto")
    dense, cfg = load_model(path, torch.float32, "cpu", quantization="none")
    merged = [m for m in packed.modules() if isinstance(m, MergedLinear)]
    assert len(merged) == 4 and all(m.packed is not None for m in merged)
    tokens = [5, 300, 17, 42, 42, 9, 250, 3]
    want = prefill_logits(dense, cfg, tokens)
    torch.testing.assert_close(prefill_logits(packed, cfg, tokens), want, atol=1e-3, rtol=0)


def test_phi3_block_names():
    assert hf_tensor_name("blk.1.attn_qkv.weight", "phi3") == (
        "model.layers.1.self_attn.qkv_proj.weight"
    )
    assert hf_tensor_name("blk.1.ffn_up.weight", "phi3") == "model.layers.1.mlp.gate_up_proj.weight"
    assert hf_tensor_name("blk.1.ffn_up.weight", "smollm3") == "model.layers.1.mlp.up_proj.weight"
