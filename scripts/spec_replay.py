"""How far a draft-length rule can take prompt lookup on the workloads of bench_spec.py: the
greedy outputs are generated once (float32, no speculation), then replayed step by step with
radixrt's own prompt lookup and a table of step times (one request, k positions), so that
rules compare without running the model again.

    python scripts/spec_replay.py [--workloads code_rewrite,extraction,quote,multi_turn]
        [--times 7.2,8.1,8.4,9.2,10.4,11.7,12.3,13.9,15.0,16.1,17.2,18.2] [--requests 4]

--times: ms of a step of 1, 2, ... 12 positions (scripts/bench_cpu_step.py --positions gives
them; the default is this repository's AVX-512 Xeon figure at 800 keys, docs/speculative.md).
Rules: "oracle" drafts exactly the tokens the step will keep (a bound no rule reaches), and
"adaptive" is radixrt's (speculative/adaptive.py: acceptance per request and server, the
cost's threshold and jump, one free trial a step without drafts). Prints the speedup over
decoding without drafts and the tokens per step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_spec_workloads as wl  # noqa: E402

import radixrt  # noqa: E402
from radixrt.scheduler.speculation import LONG_MATCH, LONG_PRIOR  # noqa: E402
from radixrt.speculative.adaptive import PRIOR_RATE, Acceptance, StepCost, draft_size  # noqa: E402
from radixrt.speculative.ngram import prompt_lookup  # noqa: E402

MAX_DRAFTS = 11


def kept(draft: list[int], rest: list[int]) -> int:
    n = 0
    while n < len(draft) and n < len(rest) and draft[n] == rest[n]:
        n += 1
    return n


def replay(pairs: list[tuple[list[int], list[int]]], times: list[float], oracle: bool) -> tuple:
    cost = StepCost()
    for k, t in enumerate(times, start=1):  # the table as the steps the fit has seen
        for _ in range(5):
            cost.record(k, t, k > 1)
    server = [Acceptance(PRIOR_RATE, 0.05), Acceptance(LONG_PRIOR, 0.05)]
    total = steps = tokens = 0.0
    for prompt, out in pairs:
        rates = [Acceptance(s.rate) for s in server]
        t = 0
        while t < len(out):
            room = min(MAX_DRAFTS, len(out) - t - 1)
            look = prompt_lookup(np.array(prompt + out[:t], dtype=np.int64), 1, 12, room)
            which = int(look.matched >= LONG_MATCH)
            good = kept(look.draft, out[t:])
            if oracle:
                k = good
            else:
                k = draft_size(cost, rates[which].rate, len(look.draft), 1) if look.draft else 0
            n = kept(look.draft[:k], out[t:])
            trial = (k, n) if k else (1, int(good > 0)) if look.draft else (0, 0)
            for acc in (rates[which], server[which]):
                acc.record(*trial)
            total += times[k]
            steps += 1
            t += n + 1
        tokens += len(out)
    return tokens * times[0] / total, tokens / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="code_rewrite,extraction,quote,multi_turn")
    p.add_argument("--times", default="7.2,8.1,8.4,9.2,10.4,11.7,12.3,13.9,15.0,16.1,17.2,18.2")
    p.add_argument("--requests", type=int, default=4)
    args = p.parse_args()
    times = [float(x) for x in args.times.split(",")]
    engine = radixrt.Engine(dtype="float32")
    try:
        for name in args.workloads.split(","):
            task = wl.TASKS[name]
            prompts = wl.prompts(task, engine.tokenizer, 0, args.requests)
            params = {"temperature": 0, "max_new_tokens": 256}
            if task.json_schema:
                params["json_schema"] = task.json_schema
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            pairs = [(p_, o["output_ids"]) for p_, o in zip(prompts, outs, strict=True)]
            cells = []
            for rule, oracle in (("oracle", True), ("adaptive", False)):
                speedup, per_step = replay(pairs, times, oracle)
                cells.append(f"{rule} {speedup:.2f}x ({per_step:.2f} tokens/step)")
            print(f"{name}: " + ", ".join(cells), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
