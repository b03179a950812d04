"""What each weight setting costs in accuracy on the default model: the perplexity of a fixed
English passage, and how often each position's top token equals float32 `none`'s (the
transformers-equal reference), teacher-forced in one prefill step (docs/quantization.md).

    python scripts/bench_quant_accuracy.py [--text FILE] [--threads 2]
        [--model-path REFERENCE.gguf --model-path Q4_K_M.gguf ...]

One prefill of the whole passage takes the wide-batch path (12+ rows): the dense copies, bf16
or int8 (W8A8), where a setting keeps them. Settings: float32 none, float32 auto (the GGUF
blocks), bfloat16 auto with bf16 copies (the default), bfloat16 auto with int8 copies.

With --model-path (repeated): the first file in float32 `none` is the reference (an F32 or
F16 GGUF of the model: scripts/gguf_variants.py writes one), and every file after it runs in
float32 `auto`, its block types multiplied as stored: what each GGUF type costs in accuracy.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from bench_cpu_step import ROW_LEN, make_runner

from radixrt.attention.forward_batch import SimpleStep
from radixrt.loader.default_model import default_model_path

PASSAGE = (
    "The lighthouse stood at the end of a long spit of sand, and for most of the year nobody "
    "visited it except the keeper and the gulls. Every evening he climbed the spiral stairs, "
    "wiped the salt from the great lens, and lit the lamp before the sun had quite gone down. "
    "Ships that passed in the night saw its beam sweep across the water every twelve seconds, "
    "and they knew where the rocks were. In the winter the storms came from the north and "
    "threw spray over the gallery, and the keeper wrote in his logbook the speed of the wind, "
    "the height of the waves and the names of the vessels he could read through his glass. "
    "When the electric light arrived, engineers from the city replaced the old oil lamp with a "
    "bulb that needed no tending. The keeper stayed on for a few more years, mostly to paint "
    "the railings and answer letters from children who wanted to know what it was like to live "
    "alone by the sea. He told them that it was never really lonely, because the sea was always "
    "talking, and because somewhere out in the dark there was always someone glad of the light. "
    "Today the tower is a small museum. Visitors can climb the same stairs, look at the brass "
    "fittings and the logbooks behind glass, and read the children's letters pinned to a board "
    "by the door. On clear days you can see the coast of the next country from the top."
)

SETTINGS = [  # (name, dtype, quantization, dense copy dtype or None)
    ("float32 none (reference)", torch.float32, "none", None),
    ("float32 auto (GGUF blocks)", torch.float32, "auto", None),
    ("bfloat16 auto, bf16 copies (default)", torch.bfloat16, "auto", "bfloat16"),
    ("bfloat16 auto, int8 copies (W8A8)", torch.bfloat16, "auto", "int8"),
]


def settings(paths: list[str]) -> list[tuple[str, torch.dtype, str, str | None, str | None]]:
    """(name, dtype, quantization, copy dtype, model path) of each row of the table."""
    if not paths:
        return [(*setting, None) for setting in SETTINGS]
    reference = [(f"{Path(paths[0]).name}, float32 none (reference)", torch.float32, "none")]
    files = [(f"{Path(p).name}, float32 auto", torch.float32, "auto") for p in paths[1:]]
    return [(*row, None, path) for row, path in zip(reference + files, paths, strict=True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", type=Path, help="a text file instead of the built-in passage")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model-path", action="append", default=[], help="reference, then files")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from radixrt.loader.tokenizer import load_tokenizer

    text = args.text.read_text() if args.text else PASSAGE
    tokens = load_tokenizer(default_model_path()).encode(text)
    if len(tokens) > ROW_LEN:
        raise SystemExit(f"--text: {len(tokens)} tokens, at most {ROW_LEN} fit one table row")
    target = torch.tensor(tokens[1:])
    reference_top: torch.Tensor | None = None
    print(f"{len(tokens)} tokens\n")
    print("| setting | perplexity | top-1 equal to the reference |")
    print("|---|---|---|")
    # Table row 0 of bench_cpu_step's runner, every position's logits but the last.
    step = SimpleStep([0], [0], [len(tokens)], tokens, list(range(len(tokens) - 1)))
    for name, dtype, quantization, copy_dtype, path in settings(args.model_path):
        runner = make_runner(
            quantization, False, dtype, dense_copy_gb=1.0 if copy_dtype else 0.0,
            dense_copy_dtype=copy_dtype or "bfloat16", model_path=path,
        )  # fmt: skip
        with torch.no_grad():
            logits = runner.forward(step)
        del runner  # its KV pool: one setting's at a time
        nll = torch.nn.functional.cross_entropy(logits, target).item()
        top = logits.argmax(dim=-1)
        reference_top = top if reference_top is None else reference_top
        agree = (top == reference_top).float().mean().item()
        print(f"| {name} | {math.exp(nll):.3f} | {agree:.1%} |", flush=True)


if __name__ == "__main__":
    main()
