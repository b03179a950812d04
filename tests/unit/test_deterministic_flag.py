"""--enable-deterministic-inference (SGLang's flag): accepted, and refusing by name the settings
that would make a request's bits depend on its batch (docs/determinism.md)."""

from __future__ import annotations

import pytest

from radixrt.server_args import ServerArgs


def test_the_flag_is_accepted_with_the_defaults_and_int8_every_step_or_never():
    for rows in (None, -1, 0):
        assert ServerArgs(enable_deterministic_inference=True, cpu_gguf_int8_rows=rows)


def test_on_cuda_the_flag_takes_the_triton_attention():
    """CUDA's default attention is triton, whose invariant kernels the flag selects."""
    for backend in (None, "triton"):
        assert ServerArgs(
            enable_deterministic_inference=True, device="cuda", attention_backend=backend
        )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (dict(cpu_gguf_int8_rows=31), "cpu_gguf_int8_rows"),
        (dict(enable_torch_compile=True), "enable_torch_compile"),
        (dict(device="cuda", attention_backend="torch"), "attention_backend triton"),
    ],
)
def test_what_breaks_it_is_refused_by_name(args, field):
    with pytest.raises(ValueError, match=field):
        ServerArgs(enable_deterministic_inference=True, **args)
    ServerArgs(**args)  # without the flag these settings stay allowed


@pytest.mark.parametrize("flag", [False, True])
def test_the_flag_reaches_the_attention_backend(flag, tiny_model_dir, monkeypatch):
    """The scheduler builds its backend with the flag (the triton backend's invariant kernels)
    and the context length that sizes their chunk grid."""
    from radixrt.kernels.invariant_attention import extend_attention_invariant
    from radixrt.scheduler.components import build_components

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the triton backend on the CPU
    args = ServerArgs(
        model_path=tiny_model_dir("llama"), device="cpu", attention_backend="triton",
        enable_deterministic_inference=flag, context_length=300,
    )  # fmt: skip
    backend = build_components(args).runner.attn_backend
    assert (backend._extend is extend_attention_invariant) is flag
    assert backend._context_length == 300
