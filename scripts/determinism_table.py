"""Does a request's answer depend on what else the server is doing? The README's determinism table.

Eight natural chat prompts, greedy, --max-new tokens each, first each alone on an empty cache,
then under each condition: in one batch of 8, in a batch of 16 with 8 other prompts, with
prefill chunks of 16 tokens, with pages of 16, with NGRAM speculation at batch 1, and sent a
second time (a full radix hit). For every condition and dtype it counts the prompts whose
tokens (and, separately, output logprobs) differ from their run alone, and the first token
that differs. Engines run in this process, one at a time.

    .venv/bin/python scripts/determinism_table.py [--model-path F.gguf] [--dtypes auto,float32]
"""

from __future__ import annotations

import argparse
import platform
import sys

import radixrt
from radixrt.loader.default_model import default_model_path
from radixrt.native.cpu import cpu_flags

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain why the sky is blue.",
    "Give me three tips for learning to cook.",
    "What is the difference between a list and a tuple in Python?",
    "Describe a sunrise in the mountains.",
    "How do vaccines work?",
    "Write a haiku about a cat.",
]
OTHERS = [f"Tell me a fact about the number {n}." for n in range(8)]
CONDITIONS = {  # name: (engine arguments, how the prompts are sent)
    "in one batch of 8": ({}, "batch"),
    "in a batch of 16 with 8 other prompts": ({}, "with_others"),
    "engine with chunked_prefill_size=16": ({"chunked_prefill_size": 16}, "batch"),
    "engine with page_size=16": ({"page_size": 16}, "batch"),
    'speculative_algorithm="NGRAM", batch 1': ({"speculative_algorithm": "NGRAM"}, "one_by_one"),
    "sent again (a full radix hit)": ({}, "again"),
}


def answers(engine: radixrt.Engine, prompts: list[str], params: dict) -> list[tuple]:
    tok = engine.tokenizer
    rendered = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                tokenize=False)
        for p in prompts
    ]  # fmt: skip
    ids = [tok.encode(r, add_special_tokens=False) for r in rendered]
    outs = engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)
    return [
        (o["output_ids"], [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]])
        for o in outs
    ]


def run_condition(engine: radixrt.Engine, how: str, params: dict) -> list[tuple]:
    if how == "batch":
        return answers(engine, PROMPTS, params)
    if how == "with_others":
        mixed = [p for pair in zip(OTHERS, PROMPTS, strict=True) for p in pair]
        return answers(engine, mixed, params)[1::2]
    if how == "again":
        return [answers(engine, [p], params)[0] for p in PROMPTS]  # after `alone` cached them
    return [answers(engine, [p], params)[0] for p in PROMPTS]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(model: str, dtype: str, max_new: int) -> dict[str, tuple[int, int, list[int]]]:
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    base = dict(model_path=model, dtype=dtype, device="cpu", in_process=True, log_level="warning")
    engine = radixrt.Engine(**base)
    try:
        alone = []
        for p in PROMPTS:
            engine.flush_cache()
            alone.append(answers(engine, [p], params)[0])
        results = {"sent again (a full radix hit)": run_condition(engine, "again", params)}
    finally:
        engine.shutdown()
    for name, (extra, how) in CONDITIONS.items():
        if name in results:
            continue
        engine = radixrt.Engine(**base, **extra)
        try:
            results[name] = run_condition(engine, how, params)
        finally:
            engine.shutdown()
    table = {}
    for name in CONDITIONS:
        got = results[name]
        firsts = [first_difference(g[0], a[0]) for g, a in zip(got, alone, strict=True)]
        tokens = sum(f is not None for f in firsts)
        logprobs = sum(g != a for g, a in zip(got, alone, strict=True))
        table[name] = (tokens, logprobs, [f for f in firsts if f is not None])
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="default: the default model's GGUF file")
    p.add_argument("--dtypes", default="auto,float32")
    p.add_argument("--max-new", type=int, default=64)
    args = p.parse_args()
    model = args.model_path or default_model_path()
    dtypes = args.dtypes.split(",")
    tables = {d: measure(model, d, args.max_new) for d in dtypes}
    flags = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx"))))
    print(f"model {model}; {platform.processor() or platform.machine()}, flags: {flags}")
    print(f"command: {' '.join(sys.argv)}\n")
    head = " | ".join(f"{d}: prompts whose tokens / logprobs change (first token)" for d in dtypes)
    print(f"| condition | {head} |")
    print("|---|" + "---|" * len(dtypes))
    for name in CONDITIONS:
        cells = []
        for d in dtypes:
            tokens, logprobs, firsts = tables[d][name]
            where = f" (from {min(firsts)})" if firsts else ""
            cells.append(f"{tokens} / {logprobs} of {len(PROMPTS)}{where}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
