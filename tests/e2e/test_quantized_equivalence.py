"""Packed weights against Hugging Face transformers run on the same dequantized values.

The reference model gets exactly the weights our blocks hold (d * q + m per 32-block), so the
only difference left is float32 summation order: logits agree to LOGIT_ATOL, and greedy tokens
agree except after a near-tie (hf_reference.TIE_GAP). For the default model, `auto` runs the
GGUF file's own Q4_1/Q8_0 blocks, which are what transformers dequantizes when it loads the
file: the plain GGUF reference is the reference.

These run with float32 activations (int8_rows / cpu_gguf_int8_rows 0): the default rounds a
narrow step's activations to int8, as llama.cpp does, and tests/e2e/test_gguf_llamacpp.py
holds that default to llama.cpp's greedy tokens on the same files.
"""

from __future__ import annotations

import pytest
import torch
from hf_reference import assert_same_greedy, hf_greedy
from test_equivalence import TINY_OVERRIDES, prompt_sets

import radixrt
from radixrt.layers.gguf_blocks import block_type, dequantize_part
from radixrt.layers.quantized import quantize
from radixrt.loader.load import load_model
from radixrt.native.build import load_native

LOGIT_ATOL = 1e-4  # float32 logits of size ~10; the orders of summation differ
MAX_NEW = 10
# Each projection of a transformers Llama-family layer, as our linear layers pack them.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

pytestmark = pytest.mark.skipif(
    load_native() is None, reason="radixrt's native CPU ops did not build (no compiler?)"
)


def dequantized_reference(hf_model, fmt: str):
    """The transformers model with every linear weight and the LM head replaced by its
    quantize -> dequantize round trip (the embedding stays as it was; the head is untied)."""
    with torch.no_grad():
        for name, module in hf_model.named_modules():
            if name.rpartition(".")[2] in PROJECTIONS:
                w = module.weight
                module.weight = torch.nn.Parameter(_round_trip(w, fmt))
        head = hf_model.lm_head
        head.weight = torch.nn.Parameter(_round_trip(head.weight, fmt))
    hf_model.config.tie_word_embeddings = False
    return hf_model


def _round_trip(w: torch.Tensor, fmt: str) -> torch.Tensor:
    return dequantize_part(block_type(fmt), quantize(w, fmt), w.shape[1]).to(w.dtype)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def arch(request) -> str:
    return request.param


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_quantized_tiny_model_matches_transformers_on_its_dequantized_weights(
    arch, fmt, tiny_model_dir, prefill_logits
):
    from transformers import AutoModelForCausalLM

    path = str(tiny_model_dir(arch, **TINY_OVERRIDES.get(arch, {})))
    hf = dequantized_reference(AutoModelForCausalLM.from_pretrained(path).eval(), fmt)
    model, cfg = load_model(path, torch.float32, "cpu", quantization=fmt, int8_rows=0)
    assert any(m.__class__.__name__ == "GGUFWeight" for m in model.modules())
    tokens = prompt_sets(cfg.vocab_size)["mixed"][1]
    ours = prefill_logits(model, cfg, tokens)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0]
    assert (ours - ref).abs().max() < LOGIT_ATOL
    engine = radixrt.Engine(
        model_path=path, quantization=fmt, dtype="float32", device="cpu", in_process=True,
        cpu_gguf_int8_rows=0,
        skip_tokenizer_init=True, enable_kv_checks=True, chunked_prefill_size=7,
        max_total_tokens=4096,
    )  # fmt: skip
    try:
        sets = prompt_sets(cfg.vocab_size)
        prompts = sets["mixed"] + sets["shared"]
        params = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
            ref_run = hf_greedy(hf, prompt, MAX_NEW)
            assert_same_greedy(out["output_ids"], ref_run, f"{arch}/{fmt}[{i}]")
    finally:
        engine.shutdown()


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_bfloat16_packed_model_is_within_bfloat16s_rounding_of_transformers(
    fmt, tiny_model_dir, prefill_logits
):
    # `--dtype bfloat16` with packed weights: a 40-token prefill multiplies bf16-rounded weight
    # tiles in bf16 (from DENSE_FROM_ROWS rows on) and runs the bf16 attention tile; transformers
    # in bfloat16 holds the same bf16-rounded dequantized weights. 0.1 on logits of size ~10 as
    # tests/unit/test_models.py's dense bfloat16 check: bf16 rounds each op's output to 2^-9.
    from transformers import AutoModelForCausalLM

    path = str(tiny_model_dir("llama"))
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    hf = dequantized_reference(hf_model, fmt)
    model, cfg = load_model(path, torch.bfloat16, "cpu", quantization=fmt, int8_rows=0)
    assert any(m.__class__.__name__ == "GGUFWeight" for m in model.modules())
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, cfg.vocab_size, (40,), generator=gen).tolist()
    ours = prefill_logits(model, cfg, tokens, torch.bfloat16).float()
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].float()
    assert ours.shape == ref.shape and (ours - ref).abs().max() < 0.1


# bfloat16's 0.1 (above) plus as much again for the activations' int8 rounding. Measured on this
# tiny model (seeds 0-2, logits up to ~3): 0.10-0.125 with int8 copies, 0.03-0.05 with bf16
# copies of the same weights against the same reference (2026-12-04).
W8A8_LOGIT_ATOL = 0.2


def test_int8_copies_are_within_bfloat16s_rounding_of_transformers_on_their_weights(
    tiny_model_dir, prefill_logits
):
    # `--cpu-dense-copy-dtype int8`: a 40-token prefill multiplies each row of activations,
    # rounded to int8 (half a step: max|x| / 254, 0.4% of the row's largest), by the int8
    # per-channel copy of the int4 weights. transformers in bfloat16 holds exactly those
    # weights' values, so what is left is bf16's rounding of each op and the activations'.
    # This bound catches wiring errors (a wrong scale or layout moves logits by O(1)); the
    # arithmetic itself is checked bit for bit in tests/unit/test_w8a8.py.
    from transformers import AutoModelForCausalLM

    from radixrt.layers.quantized import can_keep_dense, quantize_channels

    if not can_keep_dense():
        pytest.skip("int8 copies are kept with the bf16 ones: oneDNN and a bf16 CPU")
    path = str(tiny_model_dir("llama"))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for name, module in [*hf.named_modules()]:
            if name.rpartition(".")[2] in (*PROJECTIONS, "lm_head"):
                wq, ws = quantize_channels(_round_trip(module.weight.float(), "int4"))
                w = (wq.float() * ws[:, None]).to(torch.bfloat16)
                module.weight = torch.nn.Parameter(w)
    hf.config.tie_word_embeddings = False
    model, cfg = load_model(
        path, torch.bfloat16, "cpu", quantization="int4", dense_copy_gb=1.0, int8_rows=0,
        dense_copy_dtype="int8",
    )  # fmt: skip
    assert model.lm_head.packed.dense.dtype == torch.int8
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, cfg.vocab_size, (40,), generator=gen).tolist()
    ours = prefill_logits(model, cfg, tokens, torch.bfloat16).float()
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].float()
    assert ours.shape == ref.shape and (ours - ref).abs().max() < W8A8_LOGIT_ATOL


def test_auto_on_the_default_model_runs_the_files_blocks_and_matches_transformers(
    hf_loader, default_tokenizer_dir
):
    from radixrt.loader.default_model import default_model_path

    path = default_model_path()
    engine = radixrt.Engine(
        model_path=path, tokenizer_path=default_tokenizer_dir, dtype="float32", device="cpu",
        cpu_gguf_int8_rows=0,
        in_process=True, enable_kv_checks=True, page_size=16, chunked_prefill_size=7,
        max_total_tokens=8192,
    )  # fmt: skip
    assert engine.server_args.quantization == "auto"
    try:
        sets = prompt_sets(engine.info.vocab_size, engine.tokenizer.encode)
        prompts = sets["mixed"] + sets["shared"]
        params = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        hf = hf_loader(path)
        for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
            assert_same_greedy(out["output_ids"], hf_greedy(hf, prompt, MAX_NEW), f"auto[{i}]")
    finally:
        engine.shutdown()


def test_auto_packs_the_default_models_q4_1_and_q8_0_tensors_unchanged():
    from radixrt.loader.default_model import default_model_path

    model, _ = load_model(default_model_path(), torch.float32, "cpu", quantization="auto")
    packed = {name: m for name, m in model.named_modules() if m.__class__.__name__ == "GGUFWeight"}
    formats = {m.fmt for m in packed.values()}
    assert formats == {"Q4_1", "Q8_0"}  # the file: Q4_1 projections, a Q8_0 tied embedding
    assert len(packed) == 30 * 4 + 1
    dense, _ = load_model(default_model_path(), torch.float32, "cpu", quantization="none")
    qkv = dense.model.layers[3].self_attn.qkv_proj.weight
    assert torch.equal(packed["model.layers.3.self_attn.qkv_proj.packed"].dequantize(), qkv)
