"""One offline-engine workload, timed inside the process (model load excluded): for comparing
two versions of radixrt on the same machine (run it under `farm-bench --vs`, or alternate by
hand), since the Engine API it uses is stable across versions.

    python scripts/bench_engine.py [--prompts 64] [--new 32] [--prompt-len 64] [--dtype bfloat16]

Prints one line: requests, output tokens, seconds, output tok/s. Seeded random token ids,
EOS ignored, greedy; the radix cache is on but the prompts share nothing.
"""

from __future__ import annotations

import argparse
import random
import time

import radixrt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new", type=int, default=32, help="new tokens per request")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    rng = random.Random(0)
    prompts = [
        [rng.randrange(100, 40000) for _ in range(args.prompt_len)] for _ in range(args.prompts)
    ]
    params = {"temperature": 0, "max_new_tokens": args.new, "ignore_eos": True}
    engine = radixrt.Engine(dtype=args.dtype, device="cpu", log_level="warning")
    try:
        engine.generate(input_ids=prompts[0][:8], sampling_params={"max_new_tokens": 2})
        start = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    tokens = args.prompts * args.new
    print(
        f"{args.prompts} requests, {tokens} output tokens, {seconds:.2f} s, "
        f"{tokens / seconds:.1f} tok/s"
    )


if __name__ == "__main__":
    main()
