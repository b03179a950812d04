"""radixrt's greedy tokens against llama.cpp's on the same GGUF file, for files of every common
block type made by llama.cpp's own quantizer (scripts/gguf_variants.py): K-quants, the legacy
32-blocks and the IQ4 types, in the default model (a real model, natural prompts) and in tiny
random models whose widths are multiples of 256 (every K-quant in full; llama and qwen2).

What may differ. On the float32 files the two engines' logits agree to 1e-4. On a quantized
file llama.cpp multiplies its weights by activations rounded to 8 bits (its q8 dot products),
radixrt by float32 ones, so their logits differ by a few percent: the gap between llama.cpp's
top two logits moved by at most 0.78 (default model) and 0.35 (tiny models) between the two
engines, over 84 steps of each of the 36 files, teacher-forced (2026-12-05, llama-cpp-python
0.3.36, radixrt at c4ffbb9 dequantizing these files at load). MIN_MARGIN is that with ~30%
to spare: where llama.cpp's top-2 margin is below it, the two engines may rank the pair
either way. So the tokens must be equal up to the first step where they differ, and that step
must be such a near-tie (as hf_reference.assert_same_greedy does with transformers); steps
before it count as compared, and each file must compare at least MIN_COMPARED tokens. In the
same runs' free greedy decoding, every first difference came at a margin of 0.25 or less, and
each file compared 18 to 48 of its 48 tokens.
"""

from __future__ import annotations

import os
import sys

import pytest

import radixrt

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import gguf_variants as gv  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not gv.llamacpp_available(),
        reason=f"no llama.cpp venv at {gv.LLAMACPP_PYTHON} (scripts/bench_cpu_setup.sh makes it)",
    ),
]

TEXTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "The sun rises in the east and sets in the",
]
NEW_TOKENS = 16
MIN_MARGIN = {"default": 1.0, "tiny": 0.5, "tiny-qwen2": 0.5}
MIN_COMPARED = len(TEXTS) * NEW_TOKENS // 4  # so that a file whose runs all part early fails
# The tiny llama model in every type. The default model and the qwen2 one in the types that
# together hold every block type their other files hold (`gguf_variants.py --list`), which
# keeps the file near a minute; RADIXRT_GGUF_ALL_VARIANTS=1 runs all 36 files (~3 min).
SUBSET = {
    "default": ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS"),
    "tiny": gv.QTYPES,
    "tiny-qwen2": ("Q4_K_M", "Q2_K", "IQ4_NL"),
}
CASES = [
    (model, qtype)
    for model in gv.MODELS
    for qtype in gv.QTYPES
    if os.environ.get("RADIXRT_GGUF_ALL_VARIANTS") == "1" or qtype in SUBSET[model]
]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from radixrt.loader.default_model import default_model_path

    return gv.llamacpp_tokenize(default_model_path(), TEXTS)


@pytest.fixture(scope="module")
def references(prompts) -> dict[tuple[str, str], list[dict]]:
    """llama.cpp's runs of every case, in one process (made, with the files, on first use)."""
    paths = [gv.variant(qtype, model) for model, qtype in CASES]
    return dict(zip(CASES, gv.llamacpp_greedy(paths, prompts, NEW_TOKENS), strict=True))


# With --cpu-gguf-int8-rows the activations are rounded to int8 as llama.cpp rounds them: the
# tiny model in every type and the default model's Q4_K_M (its Q5_0, Q4_K, Q6_K, Q8_0).
INT8_CASES = [c for c in CASES if c[0] == "tiny" or c == ("default", "Q4_K_M")]


@pytest.mark.parametrize(("model", "qtype"), CASES, ids=[f"{m}-{q}" for m, q in CASES])
def test_greedy_tokens_match_llamacpp(model, qtype, prompts, references):
    check_against_llamacpp(model, qtype, prompts, references, int8_rows=0)


@pytest.mark.parametrize(("model", "qtype"), INT8_CASES, ids=[f"{m}-{q}" for m, q in INT8_CASES])
def test_int8_activations_match_llamacpp_too(model, qtype, prompts, references):
    check_against_llamacpp(model, qtype, prompts, references, int8_rows=8)


def check_against_llamacpp(model, qtype, prompts, references, int8_rows: int) -> None:
    outs = greedy(gv.variant(qtype, model), prompts, int8_rows)
    compared = 0
    for i, (out, ref) in enumerate(zip(outs, references[model, qtype], strict=True)):
        label = f"{model}/{qtype}[{i}]"
        compared += same_until_near_tie(out, ref, MIN_MARGIN[model], label)
    assert compared >= MIN_COMPARED, f"{model}/{qtype}: only {compared} tokens compared"


def greedy(path, prompts: list[list[int]], int8_rows: int) -> list[list[int]]:
    """radixrt's greedy tokens for the prompts (float32 activations, or int8 ones for steps
    of up to int8_rows rows)."""
    engine = radixrt.Engine(
        model_path=str(path), dtype="float32", device="cpu", in_process=True,
        skip_tokenizer_init=True, max_total_tokens=1024, log_level="warning",
        cpu_gguf_int8_rows=int8_rows,
    )  # fmt: skip
    try:
        params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    finally:
        engine.shutdown()


def same_until_near_tie(ours: list[int], ref: dict, min_margin: float, label: str) -> int:
    """How many leading tokens are equal; fails unless the first that differs is at a step
    where llama.cpp's top-2 margin is below min_margin."""
    assert len(ours) == len(ref["tokens"]), f"{label}: {len(ours)} tokens, llama.cpp made {ref}"
    for step, (a, b) in enumerate(zip(ours, ref["tokens"], strict=True)):
        if a != b:
            margin = ref["margins"][step]
            assert margin < min_margin, (
                f"{label}: step {step} is {a}, llama.cpp's {b} by a margin of {margin:.3f} "
                f"(>= {min_margin}); ours {ours}, llama.cpp {ref['tokens']}"
            )
            return step
    return len(ours)


# The released Gemma 3 270M Q4_K_M file (sliding-window and global layers, a 262k vocabulary,
# Q5_0, Q8_0, Q4_K and Q6_K tensors), natural prompts in its own tokens (BOS first). Its
# top-2 logits are closer than SmolLM2's: in free greedy runs against llama.cpp (2026-12-05)
# every first difference came at a margin of 0.12 or less (float32 and int8 activations).
GEMMA3_TEXTS = [*TEXTS, "def fibonacci(n):", "The three primary colors are"]
GEMMA3_MIN_MARGIN = 0.5


@pytest.fixture(scope="module")
def gemma3_references(gemma3_file) -> tuple[list[list[int]], list[dict]]:
    prompts = gv.llamacpp_tokenize(gemma3_file, GEMMA3_TEXTS)
    assert all(p[0] == 2 for p in prompts)  # <bos>, as the file says
    return prompts, gv.llamacpp_greedy([gemma3_file], prompts, NEW_TOKENS)[0]


@pytest.mark.parametrize("int8_rows", [0, 8], ids=["float", "int8"])
def test_gemma3_file_matches_llamacpp(gemma3_file, gemma3_references, int8_rows):
    prompts, references = gemma3_references
    outs = greedy(gemma3_file, prompts, int8_rows)
    compared = sum(
        same_until_near_tie(out, ref, GEMMA3_MIN_MARGIN, f"gemma3[{i}]")
        for i, (out, ref) in enumerate(zip(outs, references, strict=True))
    )
    assert compared >= len(GEMMA3_TEXTS) * NEW_TOKENS // 2, f"only {compared} tokens compared"
