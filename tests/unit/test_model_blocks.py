"""Each building block of radixrt/layers against its transformers counterpart on random input,
and the typed config read from Hugging Face configs."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config
from transformers.models.llama import modeling_llama as hf_llama
from transformers.models.qwen3 import modeling_qwen3 as hf_qwen3

from radixrt.attention.forward_batch import ForwardBatch
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.layers import fused
from radixrt.layers.attention import AttentionShape, QKNormAttention
from radixrt.layers.config import RopeConfig, TransformerConfig
from radixrt.layers.embedding import LMHead
from radixrt.layers.mlp import GatedMLP
from radixrt.layers.norm import RMSNorm
from radixrt.layers.rotary import RotaryEmbedding, apply_rotary
from radixrt.models.qwen3 import Qwen3ForCausalLM
from radixrt.models.weight_loader import load_hf_weights

SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-5,
    vocab_size=50,
    num_hidden_layers=1,
)


@pytest.fixture(autouse=True)
def aten_matmuls(monkeypatch):
    """These tests hold the blocks to transformers op for op, and transformers multiplies with
    aten's BLAS matmul: so do ours here. Elsewhere dense_linear uses radixrt's, which sums in
    another order (test_dense_linear.py bounds that)."""
    monkeypatch.setattr(fused, "NATIVE_MATMUL_DTYPES", ())


def no_skip(name: str) -> bool:
    return False


def randomize(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.normal_(0.0, 0.2)
    return module.eval()


def copy_into(ours: torch.nn.Module, theirs: torch.nn.Module) -> torch.nn.Module:
    """Load the transformers block's weights into ours through the HF-name weight loader."""
    load_hf_weights(ours, theirs.state_dict().items(), no_skip)
    return ours.eval()


def test_rmsnorm_equals_transformers():
    theirs = randomize(hf_llama.LlamaRMSNorm(64, eps=1e-5))
    ours = copy_into(RMSNorm(64, 1e-5), theirs)
    x, residual = torch.randn(7, 64), torch.randn(7, 64)
    assert torch.equal(ours(x), theirs(x))
    normed, summed = ours.add_and_norm(x, residual)
    assert torch.equal(summed, x + residual) and torch.equal(normed, theirs(x + residual))


def test_gated_mlp_equals_transformers():
    theirs = randomize(hf_llama.LlamaMLP(LlamaConfig(**SMALL, mlp_bias=True)))
    ours = copy_into(GatedMLP(64, 96, bias=True), theirs)
    x = torch.randn(5, 64)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 10000.0,
        },
    ],
)
def test_rotary_equals_transformers(rope_parameters):
    config = LlamaConfig(**SMALL, rope_parameters=rope_parameters)
    theirs = hf_llama.LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding(32, RopeConfig.from_hf(config))
    positions = torch.tensor([0, 3, 1, 200, 57])
    q = torch.randn(5, 4, 32)
    cos, sin = theirs(q, positions[None])  # [1, T, D]
    want = hf_llama.apply_rotary_pos_emb(q[None], q[None], cos, sin, unsqueeze_dim=2)[0][0]
    got = apply_rotary(q, *ours.cos_sin(positions, torch.float32))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("tied", [False, True])
def test_lm_head_tied_or_not(tied):
    embed = randomize(torch.nn.Embedding(50, 64))
    head = randomize(LMHead(64, 50, tied))
    hidden = torch.randn(3, 64, dtype=torch.float64).float()
    weight = embed.weight if tied else head.weight
    assert (head.weight is None) == tied
    logits = head(hidden, embed)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, hidden @ weight.T)


def one_sequence_batch(n: int, num_kv_heads: int, head_dim: int) -> ForwardBatch:
    pool = KVPool(n, 1, num_kv_heads, head_dim, torch.float32, "cpu")
    ar = torch.arange(n)
    batch = ForwardBatch(
        input_ids=ar,
        positions=ar,
        out_cache_loc=ar,
        qo_indptr=torch.tensor([0, n]),
        kv_indices=ar,
        kv_indptr=torch.tensor([0, n]),
        seq_lens=torch.tensor([n]),
        extend_lens=torch.tensor([n]),
        seq_lens_cpu=[n],
        extend_lens_cpu=[n],
        prefix_lens_cpu=[0],
        kv_pool=pool,
        attn_backend=TorchAttentionBackend(),
    )
    batch.attn_backend.init_forward_metadata(batch)  # the model does it; this is one block
    return batch


@pytest.mark.parametrize("bias", [False, True])
def test_qk_norm_attention_equals_qwen3(bias):
    config = Qwen3Config(**SMALL, attention_bias=bias)
    config._attn_implementation = "eager"
    theirs = randomize(hf_qwen3.Qwen3Attention(config, layer_idx=0))
    shape = AttentionShape(
        hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32, qkv_bias=bias, o_bias=bias
    )
    ours = copy_into(QKNormAttention(0, shape, 1e-5), theirs)
    n = 9
    hidden, positions = torch.randn(n, 64), torch.arange(n)
    cos, sin = hf_qwen3.Qwen3RotaryEmbedding(config)(hidden, positions[None])
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = theirs(hidden[None], (cos, sin), mask)[0][0]
        rotary = RotaryEmbedding(32, RopeConfig.from_hf(config))
        batch = one_sequence_batch(n, 2, 32)
        got = ours(hidden, *rotary.cos_sin(positions, torch.float32), batch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_transformer_config_of_qwen3():
    hf = Qwen3Config(
        **{**SMALL, "head_dim": 16},
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        architectures=["Qwen3ForCausalLM"],
    )
    config = Qwen3ForCausalLM.config_from_hf(hf)
    assert config == TransformerConfig(
        architecture="Qwen3ForCausalLM",
        vocab_size=50,
        hidden_size=64,
        intermediate_size=96,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=1e6),
        max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=True,
    )
    assert (config.q_size, config.kv_size) == (64, 32)
    model = Qwen3ForCausalLM(config)
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (16,) and attn.qkv_proj.bias is None
    with pytest.raises(AttributeError):
        config.head_dim = 8  # type: ignore[misc]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_norm_equals_transformers_bit_for_bit(dtype):
    """(1 + w) in float32 and the product before the cast, fused or not, in both dtypes."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    from radixrt.layers.norm import GemmaRMSNorm

    torch.manual_seed(0)
    theirs = Gemma3RMSNorm(640, 1e-6)
    theirs.weight.data.normal_(0, 0.5)
    ours = GemmaRMSNorm(640, 1e-6)
    ours.weight.data.copy_(theirs.weight.data)
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    ours.weights_loaded()
    x, r = (torch.randn(37, 640) * 3).to(dtype), torch.randn(37, 640).to(dtype)
    assert torch.equal(ours(x), theirs(x))
    normed, stream = ours.add_and_norm(x, r)
    assert torch.equal(stream, r + x) and torch.equal(normed, theirs(r + x))
