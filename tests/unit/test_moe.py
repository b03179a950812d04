"""The sparse MoE block (layers/moe.py) against a naive per-token reference and transformers'
Qwen3MoeSparseMoeBlock on the same weights; its grouping (each active expert multiplied once a
step); the experts' checkpoint forms; which layers Qwen3-MoE makes sparse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe import modeling_qwen3_moe as hf_moe

from radixrt.layers import fused
from radixrt.layers.config import MoEConfig
from radixrt.layers.moe import SparseMoE, split_experts
from radixrt.layers.sharding import Narrow
from radixrt.loader.load import load_model
from radixrt.models.qwen3_moe import moe_config
from radixrt.models.weight_loader import load_hf_weights

HIDDEN, EXPERTS, INTERMEDIATE = 32, 6, 16


@pytest.fixture(autouse=True)
def aten_matmuls(monkeypatch):
    """transformers multiplies with aten's matmul: so do ours here (see test_model_blocks)."""
    monkeypatch.setattr(fused, "NATIVE_MATMUL_DTYPES", ())


def hf_block(top_k: int, norm: bool, implementation: str) -> hf_moe.Qwen3MoeSparseMoeBlock:
    config = Qwen3MoeConfig(
        hidden_size=HIDDEN,
        num_experts=EXPERTS,
        num_experts_per_tok=top_k,
        moe_intermediate_size=INTERMEDIATE,
        norm_topk_prob=norm,
    )
    config._experts_implementation = implementation
    torch.manual_seed(top_k)
    block = hf_moe.Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0.0, 0.3)
    return block.eval()


def ours_from(block: hf_moe.Qwen3MoeSparseMoeBlock) -> SparseMoE:
    """Our block with the transformers block's weights, loaded from its fused names."""
    moe = MoEConfig(
        num_experts=EXPERTS,
        top_k=block.gate.top_k,
        intermediate_size=INTERMEDIATE,
        norm_topk_prob=block.gate.norm_topk_prob,
    )
    ours = SparseMoE(HIDDEN, moe)
    weights = [p for name, t in block.state_dict().items() for p in split_or_keep(name, t)]
    load_hf_weights(ours, weights, lambda name: False)
    return ours.eval()


def split_or_keep(name: str, tensor: torch.Tensor) -> list:
    return split_experts(name, tensor) or [(name, tensor)]


def naive(block: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: the definition, without any grouping."""
    routing = block.gate(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, e in zip(routing.weights[t], routing.experts[t].tolist(), strict=True):
            out[t] += weight * block.experts[e](x[t : t + 1])[0]
    return out


# 40 tokens over 6 experts: every active expert serves several tokens of the step.
@pytest.mark.parametrize(("top_k", "norm"), [(2, True), (3, False), (1, True)])
def test_block_matches_transformers_and_naive(top_k, norm):
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = ours_from(hf_block(top_k, norm, "grouped_mm"))(x)
        torch.testing.assert_close(ours, naive(ours_from(hf_block(top_k, norm, "eager")), x))
        for implementation in ("grouped_mm", "eager"):  # the default, and the loop
            theirs = hf_block(top_k, norm, implementation)(x[None])[0]
            torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)


def test_routing_is_transformers():
    block = hf_block(3, True, "eager")
    x = torch.randn(9, HIDDEN)
    with torch.no_grad():
        _, weights, experts = block.gate(x)
        routing = ours_from(block).gate(x)
    assert torch.equal(routing.experts, experts) and torch.equal(routing.weights, weights)
    assert torch.allclose(routing.weights.sum(-1), torch.ones(9))  # norm_topk_prob


def test_each_active_expert_runs_once_a_step():
    ours = ours_from(hf_block(2, True, "eager"))
    calls: list[int] = []
    for e, expert in enumerate(ours.experts):
        expert.register_forward_hook(lambda m, args, out, e=e: calls.append(args[0].shape[0]))
    x = torch.randn(30, HIDDEN)
    with torch.no_grad():
        ours(x)
    assert len(calls) <= EXPERTS and sum(calls) == 30 * 2  # one call per expert, all pairs


def test_bfloat16_within_rounding_of_transformers():
    block = hf_block(2, True, "grouped_mm").bfloat16()
    x = torch.randn(16, HIDDEN).bfloat16()
    with torch.no_grad():
        ours, theirs = ours_from(block).bfloat16()(x), block(x[None])[0]
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), atol=2e-2, rtol=2e-2)


def test_split_experts_names_and_lazy_parts():
    fused_gate_up = torch.arange(2 * 6 * 3.0).reshape(2, 6, 3)  # [E, 2I, hidden]
    parts = dict(split_experts("m.layers.0.mlp.experts.gate_up_proj", fused_gate_up))
    assert list(parts) == [
        f"m.layers.0.mlp.experts.{e}.{p}_proj.weight" for e in (0, 1) for p in ("gate", "up")
    ]
    assert torch.equal(parts["m.layers.0.mlp.experts.1.up_proj.weight"], fused_gate_up[1, 3:])
    stack = torch.randn(2, 4, 5)  # llama.cpp's converter's stack [E, out, in]
    names = [n for n, _ in split_experts("m.experts.down_proj.weight", stack)]
    assert names == ["m.experts.0.down_proj.weight", "m.experts.1.down_proj.weight"]
    assert split_experts("m.mlp.gate.weight", torch.randn(2, 4)) is None

    class Lazy:  # a LazyTensor: reads only what it is asked for
        shape = tuple(fused_gate_up.shape)

        def read(self, narrow):
            return fused_gate_up if narrow is None else narrow.apply(fused_gate_up)

    lazy = dict(split_experts("x.experts.gate_up_proj", Lazy()))["x.experts.1.up_proj.weight"]
    assert lazy.shape == (3, 3)
    assert torch.equal(lazy.read(Narrow(1, 1, 2, 3)), fused_gate_up[1, 3:, 1:])


def test_fused_checkpoint_loads_like_per_expert(tiny_model_dir, tmp_path):
    """transformers 5's own parameters (experts fused) saved as they are load to the weights
    of the folder save_pretrained wrote (per-expert tensors)."""
    from transformers import AutoModelForCausalLM

    folder = Path(tiny_model_dir("qwen3_moe"))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    state = {n: t.contiguous() for n, t in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    per_expert, fused_ = (load_model(str(p), torch.float32, "cpu")[0] for p in (folder, tmp_path))
    want = per_expert.state_dict()
    assert "model.layers.2.mlp.experts.7.gate_up_proj.weight" in want
    for name, tensor in fused_.state_dict().items():
        assert torch.equal(tensor, want[name]), name


def test_sparse_layers_follow_transformers(make_tiny_config):
    config = make_tiny_config("qwen3_moe", num_hidden_layers=6, decoder_sparse_step=2)
    assert moe_config(config).dense_layers == (0, 1, 2, 4)  # mlp_only [1]; odd steps dense
    hf = hf_moe.Qwen3MoeForCausalLM(config)
    for i, layer in enumerate(hf.model.layers):
        assert isinstance(layer.mlp, hf_moe.Qwen3MoeMLP) == (i in (0, 1, 2, 4))
    assert moe_config(make_tiny_config("qwen3_moe", num_experts=0)) is None
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        moe_config(make_tiny_config("qwen3_moe", num_experts_per_tok=9))
    with pytest.raises(ValueError, match="decoder_sparse_step"):
        moe_config(make_tiny_config("qwen3_moe", decoder_sparse_step=0))


def test_routing_on_the_host_keeps_graphs_and_compile_off(tiny_model_dir):
    from radixrt.executor.compiled_forward import can_compile

    model, _ = load_model(tiny_model_dir("qwen3_moe"), torch.float32, "cpu")
    assert not model.static_graphs and not can_compile(model)
