"""Rotary position embedding (RoPE), with linear, Llama-3 and LongRoPE frequency scaling, over
the whole head or its first dims (partial rotary).

The inverse frequencies are computed exactly as transformers computes them, and cos/sin are taken
in float32 then cast to the activation dtype, so that our q/k equal the reference's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from radixrt.layers.config import RopeConfig
from radixrt.layers.fused import native_cpu, use_triton

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch


def compute_inv_freq(head_dim: int, rope: RopeConfig, long: bool = False) -> torch.Tensor:
    """Inverse frequencies, [rotary_dim // 2] float32 on the CPU; longrope's short ones, or
    with `long` its long ones."""
    dim = rope.freq_dim(head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    if rope.kind == "longrope":
        factors = torch.tensor(rope.long_factor if long else rope.short_factor, device="cpu")
        return 1.0 / (factors * rope.theta**exponents)
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.kind == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.kind == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, and the band in
    # between interpolated smoothly.
    factor = rope.factor
    low, high = rope.low_freq_factor, rope.high_freq_factor
    old_len = rope.original_max_positions
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Neox-style RoPE (the rotate-half layout Hugging Face Llama/Qwen2/Mistral use) over the
    first `rotary_dim` dims of each head.

    LongRoPE (`switch_length` set) follows transformers' rule per sequence: a sequence whose
    length exceeds `switch_length` takes the long frequencies at every position, a shorter one
    the short frequencies (docs/longrope.md says how the scheduler keeps each request's K/V
    in one set). Not an nn.Module on purpose: it holds no weights, and a plain attribute
    survives building the model on the meta device.
    """

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        self.head_dim = head_dim
        self.rotary_dim = rope.rotary_dim(head_dim)
        self.switch_length = rope.switch_length
        self.scale = rope.attention_factor  # longrope's; 1.0 otherwise
        sets = [compute_inv_freq(head_dim, rope)]  # [R/2] float32, CPU
        if self.switch_length is not None:
            sets.append(compute_inv_freq(head_dim, rope, long=True))
        self.inv_freq = torch.stack(sets)  # [1 or 2, R/2]: short (or only), long
        self._per_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, long: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for each position: [T] -> two [T, 1, R/2] tensors in `dtype`; `long`
        [T] bool marks the tokens that take the long frequencies (longrope).

        Computed once per forward and shared by every layer.
        """
        device = positions.device
        inv_freq = self._per_device.get(device)
        if inv_freq is None:
            inv_freq = self._per_device.setdefault(device, self.inv_freq.to(device))
        per_token = inv_freq[0][None, :] if long is None else inv_freq[long.long()]
        freqs = positions.float()[:, None] * per_token  # [T, R/2]
        cos, sin = freqs.cos(), freqs.sin()
        if self.scale != 1.0:  # as transformers: cos * attention_scaling, in float32
            cos, sin = cos * self.scale, sin * self.scale
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]

    def for_batch(
        self, positions: torch.Tensor, dtype: torch.dtype, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos_sin of a forward's tokens: with longrope, each token's set chosen by its
        sequence's whole length (`batch.rope_lens`, else its length after this step)."""
        if self.switch_length is None:
            return self.cos_sin(positions, dtype)
        lens = batch.rope_lens if batch.rope_lens is not None else batch.seq_lens  # [B]
        long = (lens > self.switch_length).repeat_interleave(
            batch.extend_lens, output_size=positions.numel()
        )
        return self.cos_sin(positions, dtype, long)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by cos/sin [T, 1, D/2]; returns a new [T, H, D] tensor."""
    x1, x2 = x.chunk(2, dim=-1)
    # Same products and sums as transformers' q*cos + rotate_half(q)*sin, hence the same rounding.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotate_qk(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary for the model, over the first R = 2 * cos.shape[-1] dims of each head (all
    of them but for a partial rotary; the rest pass as they are). On CUDA and the CPU a fused
    kernel rotates qk [T, H, D] in place (a view into the qkv projection: no copy; a partial
    rotary rotates the view of its first R dims, which the kernels' head strides allow) and
    returns it; else a new tensor."""
    rotated = 2 * cos.shape[-1]
    part = qk if rotated == qk.shape[-1] else qk[..., :rotated]
    if use_triton(qk):
        from radixrt.kernels.fused_layers import rotary_inplace

        rotary_inplace(part, cos, sin)
        return qk
    ops = native_cpu(qk)
    if ops is not None and qk.stride(-1) == 1 and cos.dtype == qk.dtype:
        ops.rotary_(part, cos.contiguous(), sin.contiguous())
        return qk
    if part is qk:
        return apply_rotary(qk, cos, sin)
    return torch.cat((apply_rotary(part, cos, sin), qk[..., rotated:]), dim=-1)
