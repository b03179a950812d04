"""radixrt's native CPU layer ops (native/csrc/cpu_layers.cpp) against the torch paths of the
layers they replace (the reference: transformers' order of operations).

Exactness: RMSNorm (its mean of squares is torch's own reduction), the rotary, the residual add
and the KV store round exactly where torch rounds, so they must be bit-identical in float32 and
bfloat16. SwiGLU's exp may differ from torch's vectorized exp by an ulp, so a few float32 ulps
after the product.
"""

from __future__ import annotations

import pytest
import torch

from radixrt.cache.kv_pool import KVPool
from radixrt.layers import activation, norm, rotary
from radixrt.layers.config import RopeConfig
from radixrt.layers.norm import RMSNorm
from radixrt.native import build as native

OPS = native.load_native()
pytestmark = pytest.mark.skipif(
    OPS is None, reason="native CPU kernels unavailable (no compiler/ninja, or disabled)"
)
DTYPES = [torch.float32, torch.bfloat16]
# One unit in the last place, relative: an upper bound over a binade (a step of the dtype).
ULP = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7}


def torch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (norm, rotary, activation):
        monkeypatch.setattr(module, "native_cpu", lambda x: None)


def within_ulps(out: torch.Tensor, ref: torch.Tensor, ulps: float) -> bool:
    bound = ulps * ULP[ref.dtype] * ref.float().abs().clamp_min(1e-3)
    return bool(((out.float() - ref.float()).abs() <= bound).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 3, 7, 700])  # 700: split over threads
@pytest.mark.parametrize("hidden", [64, 576, 100])  # 100: not a multiple of 8 or 16 lanes
def test_rms_norm_and_residual_add_match_torch(dtype, tokens, hidden, monkeypatch):
    layer = RMSNorm(hidden, eps=1e-5).to(dtype)
    layer.weight.data = torch.randn(hidden).to(dtype)
    x = torch.randn(tokens, hidden, dtype=dtype)
    residual = torch.randn(tokens, hidden, dtype=dtype)
    out, (normed, summed) = layer(x), layer.add_and_norm(x, residual)
    torch_only(monkeypatch)
    ref, (ref_normed, ref_summed) = layer(x), layer.add_and_norm(x, residual)
    assert torch.equal(summed, ref_summed)
    assert torch.equal(out, ref) and torch.equal(normed, ref_normed)
    assert not torch.equal(out, x)  # the op did something


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 5, 300])
@pytest.mark.parametrize("d", [64, 20])  # 20: pairs of 10, one vector of 8 and 2 alone
def test_rotary_in_place_on_the_qkv_view_matches_torch(dtype, tokens, d):
    heads, kv_heads = 9, 3
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, dtype=dtype)
    qk = qkv[:, : (heads + kv_heads) * d].view(tokens, -1, d)  # strided, as in the model
    rope = rotary.RotaryEmbedding(d, RopeConfig(theta=10000.0))
    cos, sin = rope.cos_sin(torch.arange(tokens) * 7, dtype)
    expected = rotary.apply_rotary(qk.clone(), cos, sin)
    v_before = qkv[:, (heads + kv_heads) * d :].clone()
    out = rotary.rotate_qk(qk, cos, sin)
    assert out.data_ptr() == qk.data_ptr()  # in place
    assert torch.equal(out, expected)
    assert torch.equal(qkv[:, (heads + kv_heads) * d :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 40])
def test_silu_and_mul_matches_torch(dtype, tokens, monkeypatch):
    gate_up = torch.randn(tokens, 2 * 1536, dtype=dtype) * 4
    out = activation.silu_and_mul(gate_up)
    torch_only(monkeypatch)
    ref = activation.silu_and_mul(gate_up)
    assert out.shape == ref.shape == (tokens, 1536)
    assert within_ulps(out, ref, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_at_extremes_and_a_width_off_the_vector(dtype, monkeypatch):
    """Gates far into exp's clamp on both sides, zeros, and 13 columns (8 in vectors, 5 after)."""
    extremes = [-120.0, -89.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 0.5, 20.0, 87.5, 89.0, 120.0, -3.0]
    gate = torch.tensor(extremes).repeat(3, 1)
    gate_up = torch.cat([gate, torch.randn(3, 13)], dim=1).to(dtype)
    out = activation.silu_and_mul(gate_up)
    torch_only(monkeypatch)
    ref = activation.silu_and_mul(gate_up)
    assert out.shape == (3, 13)
    assert within_ulps(out, ref, 4)


def test_store_kv_writes_the_slots_and_rejects_a_slot_outside_the_pool():
    pool = KVPool(32, 2, 3, 8, torch.float32, "cpu")
    qkv = torch.randn(4, 9 * 8)
    k, v = qkv[:, 24:48].view(4, 3, 8), qkv[:, 48:].view(4, 3, 8)  # strided views
    loc = torch.tensor([5, 0, 31, 17])
    pool.set_kv(1, loc, k, v)
    assert torch.equal(pool.k_buffer[1][loc], k) and torch.equal(pool.v_buffer[1][loc], v)
    assert pool.k_buffer[0].abs().sum() == 0 and pool.k_buffer[1][1].abs().sum() == 0
    with pytest.raises(RuntimeError, match="slot 32 outside the pool"):
        pool.set_kv(0, torch.tensor([3, 32, 1, 2]), k, v)
