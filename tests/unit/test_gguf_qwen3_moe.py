"""Qwen3-MoE from GGUF: a tiny random Qwen3-MoE written as llama.cpp's converter writes it (its
metadata keys, each projection of every expert stacked into one 3-D tensor) loads to the
folder's weights and logits; with the experts in Q8_0 they stay packed, one GGUFWeight per
expert, and compute what their dequantized floats compute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_writing import assert_read_alike, finish, shape_keys
from safetensors.torch import load_file

from radixrt.layers.linear import PackableLinear
from radixrt.layers.moe import SparseMoE
from radixrt.loader.gguf_loader import GGUFCheckpoint
from radixrt.loader.load import load_model

# llama.cpp's qwen3moe has no dense layers: every layer sparse here.
TINY = dict(num_hidden_layers=2, mlp_only_layers=[])
TOKENS = [5, 300, 17, 42, 42, 9, 250, 3, 77, 1]


def write_qwen3moe_gguf(model_dir: str, out: Path, expert_type: str = "F32") -> Path:
    """The folder's model as convert_hf_to_gguf.py writes it (Qwen2MoeModel's expert stacks:
    experts.{gate,up,down}_proj [E, out, in]), the stacks in `expert_type` (F32 or Q8_0)."""
    import gguf
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    writer = gguf.GGUFWriter(str(out), "qwen3moe")
    shape_keys(writer, hf)
    writer.add_rope_dimension_count(hf.head_dim)
    writer.add_rope_freq_base(hf.rope_parameters["rope_theta"])
    writer.add_expert_count(hf.num_experts)
    writer.add_expert_used_count(hf.num_experts_per_tok)
    writer.add_expert_feed_forward_length(hf.moe_intermediate_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, hf.num_hidden_layers)
    for name, array in _stacked(load_file(Path(model_dir) / "model.safetensors"), hf):
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        if array.ndim == 3 and expert_type == "Q8_0":
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name, array)
    return finish(writer, out)


def _stacked(tensors: dict[str, torch.Tensor], hf) -> list[tuple[str, np.ndarray]]:
    out = [(n, t.numpy()) for n, t in tensors.items() if ".experts." not in n]
    for layer in range(hf.num_hidden_layers):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            prefix = f"model.layers.{layer}.mlp.experts"
            parts = [tensors[f"{prefix}.{e}.{proj}.weight"] for e in range(hf.num_experts)]
            out.append((f"{prefix}.{proj}.weight", torch.stack(parts).numpy()))
    return out


@pytest.fixture(scope="module")
def moe_gguf(tiny_model_dir, tmp_path_factory) -> tuple[str, str, str]:
    """(folder, F32 file, file with Q8_0 experts)."""
    folder = tiny_model_dir("qwen3_moe", **TINY)
    tmp = tmp_path_factory.mktemp("gguf")
    f32 = write_qwen3moe_gguf(folder, tmp / "moe-f32.gguf")
    q8 = write_qwen3moe_gguf(folder, tmp / "moe-q8.gguf", "Q8_0")
    return folder, str(f32), str(q8)


def test_config_equals_the_folders(moe_gguf):
    from transformers import AutoConfig

    folder, path, _ = moe_gguf
    ours, theirs = GGUFCheckpoint(path).hf_config(), AutoConfig.from_pretrained(folder)
    fields = [
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim",
        "num_attention_heads", "num_key_value_heads", "vocab_size", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "mlp_only_layers",
        "decoder_sparse_step",
    ]  # fmt: skip
    for field in fields:
        assert getattr(ours, field) == getattr(theirs, field), field
    arch = "Qwen3MoeForCausalLM"
    assert_read_alike(ours, theirs, arch)
    assert ours.architectures == ["Qwen3MoeForCausalLM"]


def test_weights_equal_the_folders(moe_gguf):
    folder, path, _ = moe_gguf
    ours = dict(GGUFCheckpoint(path).weights())
    theirs = load_file(Path(folder) / "model.safetensors")
    assert set(ours) == set(theirs)
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in ours
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_forward_matches_transformers(moe_gguf, prefill_logits):
    from transformers import AutoModelForCausalLM

    folder, path, _ = moe_gguf
    model, cfg = load_model(path, torch.float32, "cpu")
    assert cfg.moe is not None and (cfg.moe.num_experts, cfg.moe.top_k) == (8, 2)
    ours = prefill_logits(model, cfg, TOKENS)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([TOKENS])).logits[0].float()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_quantized_experts_stay_packed(moe_gguf, prefill_logits):
    """Each expert's gate/up and down multiply its Q8_0 blocks as stored (the router stays
    float); the logits are those of the same blocks dequantized (--quantization none)."""
    _, _, path = moe_gguf
    packed, cfg = load_model(path, torch.float32, "cpu", quantization="auto")
    dense, _ = load_model(path, torch.float32, "cpu", quantization="none")
    moe = [m for m in packed.modules() if isinstance(m, SparseMoE)]
    experts = [p for m in moe for p in m.experts.modules() if isinstance(p, PackableLinear)]
    assert len(experts) == 2 * 8 * 2 and all(p.packed is not None for p in experts)
    assert {p.packed.fmt for p in experts} == {"Q8_0"}
    assert all(m.gate.weight.dtype == torch.float32 for m in moe)
    got, want = prefill_logits(packed, cfg, TOKENS), prefill_logits(dense, cfg, TOKENS)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
