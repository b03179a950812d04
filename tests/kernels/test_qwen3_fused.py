"""Qwen3's per-head q/k norms through the fused Triton kernels (under the interpreter): the
forward with every layer forced onto its kernel gives the torch path's logits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the `test` extra installs it)")


def test_qwen3_layers_use_the_fused_kernels(tiny_model_dir, monkeypatch, prefill_logits):
    from radixrt.layers import activation, norm, rotary
    from radixrt.loader.load import load_model

    model, cfg = load_model(tiny_model_dir("qwen3", head_dim=32), torch.float32, "cpu")
    tokens = list(range(3, 12))
    want = prefill_logits(model, cfg, tokens)
    calls = []
    for module in (norm, activation, rotary):
        monkeypatch.setattr(module, "use_triton", lambda x: calls.append(1) or True)
    got = prefill_logits(model, cfg, tokens)
    # Per layer: two residual norms, the q and k head norms, rotary, SiLU-and-mul.
    assert len(calls) >= 6 * cfg.num_layers
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
