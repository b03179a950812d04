"""Helpers for scripts/bench_offline.py (workload texts and the transformers baselines) and
scripts/bench_cpu.py (its load figures: ready seconds and resident memory).

The transformers model is built from radixrt's own dequantized GGUF weights (not from
`from_pretrained(gguf_file=...)`), so both sides run the same numbers in the same dtype.
torch is imported where it is used: bench_cpu.py's helpers need none of it.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FRUITS = [
    "apples",
    "pears",
    "plums",
    "lemons",
    "melons",
    "grapes",
    "limes",
    "peaches",
    "cherries",
    "mangoes",
    "kiwis",
    "figs",
    "dates",
    "oranges",
]
NAMES = [
    "Ada",
    "Ben",
    "Cleo",
    "Dev",
    "Emma",
    "Farid",
    "Gus",
    "Hana",
    "Ivan",
    "Jo",
    "Kai",
    "Lena",
    "Milo",
    "Nora",
    "Omar",
    "Pia",
]
TASKS = [
    "Write a short poem about",
    "Explain to a ten-year-old",
    "List three surprising facts about",
    "Summarize the debate around",
    "Describe a day in the life connected to",
    "Give a beginner's guide to",
    "Compare two schools of thought on",
    "Draft an email to a colleague about",
    "Tell a brief story involving",
    "What are common misconceptions about",
]
TOPICS = [
    "the printing press",
    "coral reefs",
    "sourdough baking",
    "black holes",
    "the Silk Road",
    "jazz improvisation",
    "urban beekeeping",
    "glaciers",
    "the stock market",
    "medieval castles",
    "quantum computing",
    "marathon training",
    "volcanoes",
    "origami",
    "the water cycle",
    "chess openings",
]
FILLER = [
    "Keep the tone friendly and concrete.",
    "Mention at least one number.",
    "The audience knows very little about the subject.",
    "Avoid jargon where you can.",
    "Use an example from everyday life.",
    "It should fit on a postcard.",
    "Assume the reader is in a hurry and wants the key point first.",
    "Please end with a question that invites further thought.",
    "A historical detail or two would help, if you know any that are accurate.",
    "My teacher asked for this and I want it to sound natural, not like a textbook.",
    "Think about what would surprise a curious visitor from another century.",
    "Be honest about what is uncertain or still debated among experts.",
]


def shop_question(rng: random.Random, items: int) -> tuple[str, list[tuple[int, str, int]]]:
    name, fruits = rng.choice(NAMES), rng.sample(FRUITS, items)
    buys = [(rng.randint(2, 19), f, rng.randint(5, 95)) for f in fruits]
    listed = ", ".join(f"{n} {f} at {p} cents each" for n, f, p in buys)
    return f"Question: {name} buys {listed}. How many cents does {name} spend?\n", buys


def worked_example(rng: random.Random, tokenizer, target_tokens: int = 200) -> str:
    """One Q/A few-shot example, grown item by item until it is ~target_tokens long."""
    for items in range(2, len(FRUITS) + 1):
        question, buys = shop_question(random.Random(rng.random()), items)
        steps, total = [], 0
        for n, f, p in buys:
            total += n * p
            steps.append(
                f"The {f} cost {n} x {p} = {n * p} cents, so the total is now {total} cents."
            )
        text = f"{question}Answer: Step by step. {' '.join(steps)} The answer is {total}.\n\n"
        if len(tokenizer.encode(text, add_special_tokens=False)) >= target_tokens:
            break
    return text


def prefix_workload(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    """(a): one 5-shot prefix of ~1,000 tokens followed by n distinct short questions."""
    rng = random.Random(seed)
    head = "Solve each shopping problem. Show the steps, then give the answer.\n\n"
    prefix = head + "".join(worked_example(rng, tokenizer) for _ in range(5))
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    questions: list[str] = []
    while len(questions) < n:
        q = shop_question(rng, 2)[0] + "Answer:"
        if q not in questions:
            questions.append(q)
    return [prefix_ids + tokenizer.encode(q, add_special_tokens=False) for q in questions]


def unrelated_workload(tokenizer, n: int, long_len: int, seed: int = 1) -> tuple[list, list]:
    """(b): n distinct prompts of 20-100 tokens; output lengths mostly 8-16, n//16 of long_len."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    while len(prompts) < n:
        words = [f"{rng.choice(TASKS)} {rng.choice(TOPICS)}."] + rng.sample(FILLER, len(FILLER))
        ids = tokenizer.encode(" ".join(words), add_special_tokens=False)[: rng.randint(20, 100)]
        if ids not in prompts:
            prompts.append(ids)
    max_new = [rng.randint(8, 16) for _ in range(n)]
    for i in rng.sample(range(n), max(1, n // 16)):
        max_new[i] = long_len
    return prompts, max_new


def short_question(tokenizer, seed: int = 3) -> list[int]:
    text = shop_question(random.Random(seed), 3)[0] + "Answer: Step by step."
    return tokenizer.encode(text, add_special_tokens=False)


def long_prompt(tokenizer, length: int, seed: int = 2) -> list[int]:
    rng, ids = random.Random(seed), []
    while len(ids) < length:
        text = worked_example(rng, tokenizer) + " ".join(rng.sample(FILLER, len(FILLER)))
        ids += tokenizer.encode(text, add_special_tokens=False)
    return ids[:length]


# -- transformers ---------------------------------------------------------------------------
def load_hf_model(gguf_path: str, dtype: torch.dtype):
    """AutoModelForCausalLM.from_config + our dequantized weights, in `dtype`, eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from radixrt.loader.gguf_loader import GGUFCheckpoint
    from radixrt.loader.gguf_metadata import ARCHS

    ckpt = GGUFCheckpoint(gguf_path)  # its hf_config() is a plain object: transformers' class
    cfg = AutoConfig.for_model(ARCHS[ckpt.gguf_arch][0], **ckpt.config_fields())
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    state = {name: w.to(dtype) for name, w in ckpt.weights()}
    result = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    assert set(result.missing_keys) <= tied and not result.unexpected_keys, result
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval().requires_grad_(False)


def eos_ids(model, tokenizer) -> list[int]:
    ids = model.config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids]) | {tokenizer.eos_token_id}
    return sorted(i for i in ids if i is not None)


def hf_static(
    model, prompts: list[list[int]], max_new: list[int], eos: list[int], pad_id: int
) -> tuple[float, list[list[int]]]:
    """One left-padded greedy `generate` over all prompts, EOS suppressed, to the batch max.
    Returns (wall seconds, each row's first max_new[i] tokens)."""
    import torch

    with torch.inference_mode():
        return _hf_static(model, prompts, max_new, eos, pad_id)


def _hf_static(
    model, prompts: list[list[int]], max_new: list[int], eos: list[int], pad_id: int
) -> tuple[float, list[list[int]]]:
    import torch
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    cfg = GenerationConfig(
        max_new_tokens=max(max_new),
        do_sample=False,
        suppress_tokens=eos,
        eos_token_id=eos,
        pad_token_id=pad_id,
    )
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    wall = time.perf_counter() - start
    assert out.shape[1] == width + max(max_new), "a row stopped before max_new_tokens"
    return wall, [out[i, width : width + m].tolist() for i, m in enumerate(max_new)]


def hf_continuous(model, prompts: list[list[int]], max_new: list[int], pad_id: int) -> float:
    """transformers' continuous batching (paged cache, block sharing on), each request with its
    own max_new_tokens and EOS disabled (eos_token_id=-1). The manager is set up and warmed
    with two short requests before the clock starts. Returns wall seconds."""
    import torch

    with torch.inference_mode():
        return _hf_continuous(model, prompts, max_new, pad_id)


def _hf_continuous(model, prompts: list[list[int]], max_new: list[int], pad_id: int) -> float:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page = 64
    blocks = sum(-(-(len(p) + m) // page) for p, m in zip(prompts, max_new, strict=True)) + 8
    cb_cfg = ContinuousBatchingConfig(
        page_size=page, num_blocks=blocks, max_batch_tokens=2048, allow_block_sharing=True
    )
    gen_cfg = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=pad_id)
    with model.continuous_batching_context_manager(
        generation_config=gen_cfg, continuous_batching_config=cb_cfg
    ) as manager:
        _drain(
            manager,
            [
                manager.add_request([5, 6, 7, 8], max_new_tokens=2, eos_token_id=-1)
                for _ in range(2)
            ],
        )
        start = time.perf_counter()
        rids = [
            manager.add_request(p, max_new_tokens=m, eos_token_id=-1)
            for p, m in zip(prompts, max_new, strict=True)
        ]
        results = _drain(manager, rids)
        wall = time.perf_counter() - start
    got = [len(results[r].generated_tokens) for r in rids]
    assert got == max_new, f"continuous batching produced {got}, asked {max_new}"
    return wall


def _drain(manager, rids: list[str]) -> dict:
    results: dict = {}
    while len(results) < len(rids):
        out = manager.get_result(timeout=1)
        if out is None and not manager.is_running():
            raise RuntimeError("the continuous batching thread stopped")
        if out is not None and out.is_finished():
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id}: {out.error}")
            results[out.request_id] = out
    return results


# -- scripts/bench_cpu.py: the load figures ----------------------------------------------------
# (key in a worker's result, the row's title, its "counts" column, format): lower is better.
LOAD_FIGURES = (
    ("ready_s", "ready (s)", "s, lower is better", "{:.2f}"),
    ("rss_load_mib", "resident memory after load (MiB)", "MiB, lower is better", "{:,.0f}"),
    ("rss_end_mib", "resident memory after the workloads (MiB)", "MiB, lower is better", "{:,.0f}"),
    ("pss_load_mib", "PSS after load (MiB)", "MiB, lower is better", "{:,.0f}"),
    ("pss_end_mib", "PSS after the workloads (MiB)", "MiB, lower is better", "{:,.0f}"),
)


def median_load(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The load figures of one engine's rounds: each the median, every round's in KEY_each."""
    merged: dict[str, Any] = {}
    for key, *_ in LOAD_FIGURES:
        each = [r[key] for r in runs if key in r]
        if len(each) == len(runs):
            merged[key], merged[f"{key}_each"] = statistics.median(each), each
    return merged


def load_rows(results: dict[str, dict[str, Any]], pairs: list[tuple[str, str]]) -> list[str]:
    """The table's rows for the load figures, in the tok/s rows' columns: each engine's figure
    (or its error), no cache column, then radixrt ÷ peer (below 1.00×: radixrt is ready sooner,
    or holds less memory)."""
    rows = []
    for key, title, counts, fmt in LOAD_FIGURES:
        row = [title, counts]
        for r in results.values():
            row.append(r["error"] if "error" in r else fmt.format(r[key]) if key in r else "—")
        row.append("—")
        for ours, peer in pairs:
            a, b = results[ours].get(key), results[peer].get(key)
            row.append(f"{a / b:.2f}×" if a is not None and b else "—")
        rows.append("| " + " | ".join(row) + " |")
    return rows
