"""Fused RMSNorm(+residual), rotary in place, SiLU-and-mul and KV store against the torch
references, under the interpreter or compiled on a GPU (tests/kernels/triton_device.py); and
the model's layers wired to them (CPU, interpreter only).

Tolerances: float32 and float16 to 1 unit in the last place of the output (the kernels round
where torch rounds; only the sum of squares may add in another order); bfloat16 to 1/64
relative plus 1/32 absolute (a step or two of the intermediates near 4): the interpreter
truncates float32 -> bfloat16 where the GPU and torch round to nearest, and a difference of two
truncated products can cancel down to a small result.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the `test` extra installs it)")

from triton_device import KERNEL_DEVICE, interpreter_only, on_kernel_device  # noqa: E402

from radixrt.kernels import fused_layers as fused  # noqa: E402
from radixrt.kernels import reference as ref  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
RTOL = {torch.float32: 2.4e-7, torch.float16: 9.8e-4, torch.bfloat16: 1 / 64}
ATOL = {torch.float32: 1e-6, torch.float16: 1e-6, torch.bfloat16: 1 / 32}


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    dtype = got.dtype
    got, want = got.float().cpu(), want.float().cpu()
    torch.testing.assert_close(got, want, rtol=RTOL[dtype], atol=ATOL[dtype])


def on_device(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(KERNEL_DEVICE) for t in tensors]


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@on_kernel_device
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm(gen, dtype, with_residual):
    x = torch.randn(5, 96, generator=gen).to(dtype)  # 96: not a power of two
    residual = torch.randn(5, 96, generator=gen).to(dtype) if with_residual else None
    weight = (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype)
    y, h = fused.rmsnorm(*on_device(x, weight), 1e-6, *on_device(residual))
    y_ref, h_ref = ref.rmsnorm_ref(x, weight, 1e-6, residual)
    close(y, y_ref)
    close(h, h_ref)


@on_kernel_device
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_on_a_qkv_view(gen, dtype):
    t, hq, hkv, d = 7, 6, 2, 64
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype).to(KERNEL_DEVICE)
    before = qkv.clone()
    qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)  # strided, as in the model
    freqs = torch.arange(t).float()[:, None] * 0.1 ** torch.arange(d // 2).float()
    cos, sin = on_device(freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :])
    want = ref.rotary_ref(qk.clone(), cos, sin)
    assert fused.rotary_inplace(qk, cos, sin).data_ptr() == qk.data_ptr()
    close(qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d), want)
    assert torch.equal(qkv[:, (hq + hkv) * d :], before[:, (hq + hkv) * d :])  # v untouched


@on_kernel_device
def test_rotary_in_place_on_the_first_dims_of_each_head(gen):
    """Partial rotary (Phi-3): the first 18 of 24 dims of each head turn, as a strided view of
    the qkv output (head stride 24); the other 6 dims are left as they are."""
    t, h, d, r = 5, 3, 24, 18
    qkv = torch.randn(t, h * d, generator=gen).to(KERNEL_DEVICE)
    before = qkv.clone()
    part = qkv.view(t, h, d)[..., :r]
    freqs = torch.arange(t).float()[:, None] * 0.1 ** torch.arange(r // 2).float()
    cos, sin = on_device(freqs.cos()[:, None, :], freqs.sin()[:, None, :])
    want = ref.rotary_ref(part.clone(), cos, sin)
    fused.rotary_inplace(part, cos, sin)
    close(qkv.view(t, h, d)[..., :r], want)
    assert torch.equal(qkv.view(t, h, d)[..., r:], before.view(t, h, d)[..., r:])


@on_kernel_device
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(gen, dtype):
    gate_up = (3 * torch.randn(4, 2 * 40, generator=gen)).to(dtype)
    close(fused.silu_and_mul(*on_device(gate_up)), ref.silu_and_mul_ref(gate_up))


@on_kernel_device
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_store_kv_skips_padding(gen, pool_dtype):
    t, hkv, d = 4, 2, 64
    qkv = torch.randn(t, 4 * hkv * d, generator=gen).to(KERNEL_DEVICE)
    k = qkv[:, 2 * hkv * d : 3 * hkv * d].view(t, hkv, d)  # strided views, as in the model
    v = qkv[:, 3 * hkv * d :].view(t, hkv, d)
    loc = torch.tensor([3, -1, 17, 0], device=KERNEL_DEVICE)  # -1: CUDA-graph padding
    bufs = [torch.full((20, hkv, d), 7.0, dtype=pool_dtype, device=KERNEL_DEVICE) for _ in "abcd"]
    fused.store_kv(bufs[0], bufs[1], loc, k, v)
    ref.store_kv_ref(bufs[2], bufs[3], loc, k, v)
    if pool_dtype == torch.float32:
        assert torch.equal(bufs[0], bufs[2]) and torch.equal(bufs[1], bufs[3])
    else:
        close(bufs[0], bufs[2])
        close(bufs[1], bufs[3])
    assert bool((bufs[0][[1, 2, 4, 19]] == 7.0).all())  # other slots untouched


# (tiny model, its options, kernel calls per layer at least): Qwen2's two residual norms,
# rotary and SiLU-and-mul; Qwen3 adds its per-head q and k norms.
FUSED_CASES = {"qwen2": ({}, 3), "qwen3": ({"head_dim": 32}, 6)}


@interpreter_only
@pytest.mark.parametrize("arch", list(FUSED_CASES))
def test_model_layers_use_the_fused_kernels(arch, tiny_model_dir, monkeypatch, prefill_logits):
    """With the fused path forced on (on CUDA it is the default), a tiny model's forward gives
    the torch path's logits: the in-place rotary on the qkv view, the deferred residual adds,
    Qwen3's per-head q/k norms."""
    from radixrt.layers import activation, norm, rotary
    from radixrt.loader.load import load_model

    options, per_layer = FUSED_CASES[arch]
    model, cfg = load_model(tiny_model_dir(arch, **options), torch.float32, "cpu")
    # The modules' path (CUDA's): on the CPU the native layer stack would take Qwen2's layers.
    model.model.use_native_stack = False
    tokens = list(range(3, 12))
    want = prefill_logits(model, cfg, tokens)
    calls = []
    for module in (norm, activation, rotary):
        monkeypatch.setattr(module, "use_triton", lambda x: calls.append(1) or True)
    got = prefill_logits(model, cfg, tokens)
    assert len(calls) >= per_layer * cfg.num_layers  # every one went through Triton
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
