"""Beam search on the CPU: radixrt's beam groups against vLLM's CPU build (`LLM.beam_search`) and
transformers' `generate(num_beams=k)`, on the default model. Every engine runs in its own
process, one after the other, with 2 threads.

    .venv/bin/python scripts/bench_beam.py [--widths 4,8] [--prompts 8] [--max-new-tokens 128]
        [--engines radixrt,vllm,transformers] [--venvs DIR] [--out FILE.json]

Workload: `--prompts` chat prompts (short instructions, chat template applied), each searched
with beam width k for `--max-new-tokens` tokens, EOS ignored, so that every engine computes the
same number of steps; all prompts of a width are submitted at once. radixrt runs the GGUF file
(its default dtype); vLLM and transformers its dequantized Hugging Face copy (vLLM in bfloat16,
transformers in float32: its bfloat16 on the CPU is slower).

Columns: wall seconds of the search (model loading excluded), the ratio peer ÷ radixrt (> 1:
radixrt is faster), and for radixrt the peak of KV pages in use (sampled every 20 ms from
get_stats: pool - free - evictable, pages of --page-size tokens) against the pages that copying
every beam's whole sequence would hold: sum over prompts of k x ceil((prompt + new) / page).
vLLM's KV in use is not read: its beam search runs one-token requests that share the prompt
through its prefix cache.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

import bench_cpu as bcpu

QUESTIONS = [
    "Translate into French: The weather is nice today and we will walk to the river.",
    "Summarize in one sentence: The committee met on Monday to discuss the new budget.",
    "Write a short title for an article about electric buses in small towns.",
    "Give the capital of Australia and one fact about it.",
    "Rewrite more formally: hey, can you send me that report by tomorrow?",
    "Name three uses of copper.",
    "Explain in one sentence what a compiler does.",
    "Suggest a name for a bakery near the sea.",
]


def prompt_ids(count: int) -> list[list[int]]:
    from radixrt.loader.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(bcpu.default_gguf())
    out = []
    for i in range(count):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def save_tokenizer(venvs: Path) -> str:
    """The default model's tokenizer as a Hugging Face folder (vLLM loads it by path)."""
    from radixrt.loader.tokenizer import load_tokenizer

    out = venvs / "hf-models" / "default-tokenizer"
    if not (out / "tokenizer.json").exists():
        load_tokenizer(bcpu.default_gguf()).save_pretrained(out)
    return str(out)


# -- workers (each in its own process) --------------------------------------------------------
def radixrt_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import radixrt

    engine = radixrt.Engine(
        model_path=spec["gguf"], log_level="warning", num_threads=spec["threads"]
    )
    page = engine.server_args.page_size
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            s = engine.get_stats()
            used = s["pool_tokens"] - s["free_tokens"] - s["evictable_tokens"]
            peak[0] = max(peak[0], used)
            time.sleep(0.02)

    params = {
        "beam_width": spec["width"],
        "n": spec["width"],
        "max_new_tokens": spec["new"],
        "ignore_eos": True,
        "temperature": 0,
    }
    engine.generate(input_ids=spec["prompts"][:1], sampling_params={**params, "max_new_tokens": 4})
    engine.flush_cache()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    outs = engine.generate(input_ids=spec["prompts"], sampling_params=params)
    seconds = time.perf_counter() - start
    stop.set()
    thread.join()
    stats = engine.get_stats()
    engine.shutdown()
    return {
        "seconds": seconds,
        "tokens": sum(len(o["output_ids"]) for o in outs),
        "peak_pages": math.ceil(peak[0] / page),
        "page_size": page,
        "forks": stats["beam_forks"],
        "copied_tokens": stats["beam_copied_tokens"],
        "shared_tokens": stats["beam_shared_tokens"],
    }


def vllm_worker(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import BeamSearchParams

    llm = LLM(
        model=spec["hf_dir"],
        tokenizer=spec["tokenizer_dir"],  # its beam search decodes each beam's text
        enable_prefix_caching=True,
        max_model_len=2048,
        dtype="bfloat16",
        seed=0,
    )
    params = BeamSearchParams(beam_width=spec["width"], max_tokens=spec["new"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    llm.beam_search(prompts[:1], BeamSearchParams(beam_width=2, max_tokens=4))
    start = time.perf_counter()
    outs = llm.beam_search(prompts, params)
    seconds = time.perf_counter() - start
    pairs = zip(outs, spec["prompts"], strict=True)
    tokens = sum(len(s.tokens) - len(p) for o, p in pairs for s in o.sequences)
    return {"seconds": seconds, "tokens": tokens}


def transformers_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["hf_dir"], dtype=torch.float32).eval()
    width, prompts = spec["width"], spec["prompts"]
    longest = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        max_new_tokens=spec["new"],
        min_new_tokens=spec["new"],  # EOS ignored, as the others
        pad_token_id=pad,
    )
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, generation_config=config)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": int(out[:, longest:].numel())}


WORKERS = {"radixrt": radixrt_worker, "vllm": vllm_worker, "transformers": transformers_worker}


# -- the driver ----------------------------------------------------------------------------------
def run(engine: str, spec: dict[str, Any], venvs: Path, timeout: float) -> dict[str, Any]:
    # transformers runs in radixrt's own environment (it is a dependency).
    python = sys.executable if engine != "vllm" else str(venvs / engine / "bin" / "python")
    return bcpu.run_json_worker([python, __file__, "worker", engine], spec, timeout)


def copy_all_pages(prompts: list[list[int]], width: int, new: int, page: int) -> int:
    return sum(width * math.ceil((len(p) + new) / page) for p in prompts)


def table(results: dict[int, dict[str, dict[str, Any]]], prompts, new: int) -> str:
    lines = [
        "| beam width | engine | seconds | peer ÷ radixrt | KV pages at peak | copying every "
        "beam | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for width, by_engine in results.items():
        ours = by_engine.get("radixrt", {})
        for engine, r in by_engine.items():
            if "error" in r:
                lines.append(f"| {width} | {engine} | {r['error']} | | | | |")
                continue
            ratio = ""
            if engine != "radixrt" and "seconds" in ours:
                ratio = f"{r['seconds'] / ours['seconds']:.2f}x"
            pages = copy = share = ""
            if engine == "radixrt":
                full = copy_all_pages(prompts, width, new, r["page_size"])
                pages, copy = str(r["peak_pages"]), str(full)
                share = f"{r['peak_pages'] / full:.2f}"
            cells = [str(width), engine, f"{r['seconds']:.1f}", ratio, pages, copy, share]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        spec = json.loads(Path(argv[2]).read_text())
        Path(argv[3]).write_text(json.dumps(WORKERS[argv[1]](spec)))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="4,8")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--engines", default="radixrt,vllm,transformers")
    ap.add_argument("--venvs", type=Path, default=Path(bcpu.DEFAULT_VENVS))
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    prompts = prompt_ids(args.prompts)
    engines = args.engines.split(",")
    hf_dir = tokenizer_dir = ""
    if any(e != "radixrt" for e in engines):
        hf_dir = str(bcpu.ensure_hf_dir(bcpu.default_gguf(), args.venvs))
        tokenizer_dir = save_tokenizer(args.venvs)
    results: dict[int, dict[str, dict[str, Any]]] = {}
    for width in [int(w) for w in args.widths.split(",")]:
        spec = {
            "gguf": bcpu.default_gguf(),
            "hf_dir": hf_dir,
            "tokenizer_dir": tokenizer_dir,
            "prompts": prompts,
            "width": width,
            "new": args.max_new_tokens,
            "threads": bcpu.THREADS,
        }
        results[width] = {}
        for engine in engines:
            print(f"width {width}: {engine}", file=sys.stderr, flush=True)
            results[width][engine] = run(engine, spec, args.venvs, args.timeout)
    print(f"CPU: {bcpu.cpu_model()}")
    print(table(results, prompts, args.max_new_tokens))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
