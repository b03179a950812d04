"""What sampling over a large vocabulary costs beside a decode step: Gemma 3's 262,144 logits
against SmolLM2's 49,152. For batch sizes 1 and 16: the forward of a decode step (its LM head
included), then the sampler on its logits, greedy and sampled (temperature 0.7, top-p 0.9,
top-k 64, a repetition penalty), as the scheduler runs them; median of the runs, in ms.

    python scripts/bench_vocab_sampling.py [--model-path FILE.gguf] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from radixrt.attention.forward_batch import SimpleStep
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.model_runner import ModelRunner
from radixrt.executor.sampler import SamplingBatch, sample
from radixrt.loader.default_model import default_model_path
from radixrt.loader.load import load_model
from radixrt.protocol.sampling_params import SamplingParams

CONTEXT = 128  # tokens of each sequence before the decoded one


def median_ms(fn: Callable[[], object], runs: int = 25) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def sampler_ms(logits: torch.Tensor, params: SamplingParams, vocab: int) -> float:
    rows = logits.shape[0]
    history = [list(range(3, 3 + CONTEXT))] * rows
    batch = SamplingBatch.build([params] * rows, [None] * rows, history, history, vocab, "cpu")
    return median_ms(lambda: sample(logits.clone(), batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", default=None, help="a GGUF file (default model if unset)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    path = args.model_path or default_model_path()
    model, cfg = load_model(path, dtype, "cpu", quantization="auto")
    slots = CONTEXT + 1
    pool = KVPool(16 * slots, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
    table = ReqToTokenTable(16, slots, "cpu")
    for row in range(16):
        table.write(row, 0, torch.arange(row * slots, (row + 1) * slots))
    runner = ModelRunner(model, pool, TorchAttentionBackend(), table, "cpu")  # type: ignore[arg-type]
    greedy = SamplingParams(temperature=0.0)
    sampled = SamplingParams(temperature=0.7, top_p=0.9, top_k=64, repetition_penalty=1.1)
    print(f"vocabulary {cfg.vocab_size}, {args.dtype}, {torch.get_num_threads()} threads")
    print("| batch | decode step (ms) | greedy sampler (ms) | sampled (ms) | sampled ÷ step |")
    print("|---|---|---|---|---|")
    for rows in (1, 16):
        step = SimpleStep(list(range(rows)), [CONTEXT] * rows, [1] * rows, [5] * rows,
                          list(range(rows)))  # fmt: skip
        with torch.inference_mode():
            forward = median_ms(lambda s=step: runner.forward(s), runs=15)
            logits = runner.forward(step).float()
            g, s = (
                sampler_ms(logits, greedy, cfg.vocab_size),
                sampler_ms(logits, sampled, cfg.vocab_size),
            )
        print(f"| {rows} | {forward:.2f} | {g:.2f} | {s:.2f} | {s / forward:.0%} |")


if __name__ == "__main__":
    main()
