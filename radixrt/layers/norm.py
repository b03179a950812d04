"""RMSNorm, computed the way Hugging Face Llama computes it so that outputs match bit for bit."""

from __future__ import annotations

import torch
from torch import nn

from radixrt.layers.fused import native_cpu, use_triton


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)).

    The statistics are taken in float32 and the normalized value is cast back to the input dtype
    before the weight multiply: that is the order transformers uses, and in bfloat16 a different
    order changes the rounding (and, rarely, a greedy token).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        if use_triton(x):
            from radixrt.kernels.fused_layers import rmsnorm

            return rmsnorm(x, self.weight, self.eps)[0]
        ops = native_cpu(x)
        if ops is not None and x.dim() == 2 and x.dtype == self.weight.dtype:
            return ops.rms_norm(x, self.weight, self.eps)
        return self._norm(x)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, hidden] normalized, [T, hidden] x + residual)
        """Add the residual stream, then normalize; one fused kernel on CUDA and the CPU."""
        if use_triton(x):
            from radixrt.kernels.fused_layers import rmsnorm

            return rmsnorm(x, self.weight, self.eps, residual)
        ops = native_cpu(x)
        if ops is not None and x.dim() == 2 and x.dtype == residual.dtype == self.weight.dtype:
            return ops.add_rms_norm(x, residual, self.weight, self.eps)  # type: ignore[no-any-return]
        h = x + residual
        return self._norm(h), h

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: y = (x / sqrt(mean(x^2) + eps)) * (1 + weight), all in float32, then
    cast to x's dtype (transformers' Gemma3RMSNorm order: the product before the cast).

    `weight` is the checkpoint's (zero-centred); the float32 multiplier 1 + weight is taken
    once, after loading (`weights_loaded`), so a step does not add it again per norm. In
    float32 the fused kernels compute exactly this with the multiplier as their weight.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.multiplier: torch.Tensor | None = None

    def weights_loaded(self) -> None:
        self.multiplier = 1.0 + self.weight.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        multiplier = self._multiplier()
        if x.dim() == 2:
            ops = native_cpu(x)
            if ops is not None and x.stride(1) == 1:
                return ops.gemma_rms_norm(x, multiplier, self.eps)
            if use_triton(x) and x.dtype == torch.float32:
                from radixrt.kernels.fused_layers import rmsnorm

                return rmsnorm(x, multiplier, self.eps)[0]
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * multiplier).to(x.dtype)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype == residual.dtype == torch.float32 and x.dim() == 2:
            if use_triton(x):
                from radixrt.kernels.fused_layers import rmsnorm

                return rmsnorm(x, self._multiplier(), self.eps, residual)
            ops = native_cpu(x)
            if ops is not None:
                return ops.add_rms_norm(x, residual, self._multiplier(), self.eps)  # type: ignore[no-any-return]
        h = x + residual
        return self.forward(h), h

    def _multiplier(self) -> torch.Tensor:
        if self.multiplier is None:  # a module used without its model's load_weights
            return 1.0 + self.weight.float()
        return self.multiplier
