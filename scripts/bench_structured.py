"""Structured-generation throughput: JSON extraction under a 6-field schema, one process, one run.

    python scripts/bench_structured.py [--num-requests 64] [--repeats 3] [--json out.json]

64 short bios (built here from fixed lists) each ask the model to extract name, age, city,
email, occupation and is_active as JSON. Three runs of the same 64 prompts, greedy:
  1. constrained by the schema, jump-forward on;
  2. constrained by the schema, jump-forward off (a second engine, `disable_jump_forward=True`);
  3. unconstrained, with each request's `max_new_tokens` set to the token count of its run-1
     output and `ignore_eos=True`, so every request generates exactly as many tokens as its
     constrained twin (min_new_tokens alone would let a request run on to max_new_tokens or stop
     early at EOS; ignore_eos pins the length, which is what a throughput comparison needs).
tok/s = generated tokens (sum of completion_tokens, jump-forward tokens included) / wall s.
Scheduler steps are get_stats()["steps"] deltas (prefill and decode steps of the run).
Each engine is warmed up first with one request under the same schema, so the one-off grammar
compile (a few ms, cached by text) is not timed; the radix cache is flushed before every run.
Each run is repeated `--repeats` times (runs 1 and 3 alternating) and the table shows the run
of median wall time: this shared 2-core machine varies by +-20% from run to run.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass

FIRST = [
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
LAST = ["Smith", "Okafor", "Ng", "Garcia", "Novak", "Haddad", "Berg", "Rossi"]
CITIES = ["Lisbon", "Denver", "Osaka", "Nairobi", "Oslo", "Lima", "Toronto", "Hanoi"]
JOBS = ["nurse", "carpenter", "data analyst", "teacher", "pilot", "chef", "architect", "baker"]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "email": {"type": "string", "pattern": r"^[a-z][a-z0-9.]{0,15}@[a-z]{1,10}\.(com|org)$"},
        "occupation": {"type": "string", "maxLength": 24},
        "is_active": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "email", "occupation", "is_active"],
    "additionalProperties": False,
}


@dataclass
class Row:
    run: str
    wall_s: float
    tokens: int
    steps: int
    jump_forward_tokens: int

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s


def bios(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        age, city, job = rng.randint(21, 70), rng.choice(CITIES), rng.choice(JOBS)
        active = rng.choice(["still works there", "retired last year"])
        bio = (
            f"{first} {last} is a {age}-year-old {job} from {city} who {active}. "
            f"Reach {first} at {first.lower()}.{last.lower()}@mail.com."
        )
        prompts.append(
            "<|im_start|>user\nExtract name, age, city, email, occupation and "
            f"is_active from this bio as JSON.\n{bio}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
    return prompts


def timed(engine, label: str, prompts: list[str], params: list[dict]) -> tuple[Row, list]:
    assert engine.flush_cache(), "flush_cache refused: requests still running"
    before = engine.get_stats()
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    after = engine.get_stats()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    row = Row(
        label,
        wall,
        tokens,
        after["steps"] - before["steps"],
        after["jump_forward_tokens"] - before["jump_forward_tokens"],
    )
    log(f"  {label}: {wall:.2f} s, {tokens} tokens, {row.steps} steps")
    return row, outs


def check_valid(outs: list, label: str) -> None:
    import jsonschema

    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop", (label, o["text"])
        jsonschema.validate(json.loads(o["text"]), SCHEMA)


def constrained_run(engine, label: str, prompts: list[str], max_new: int) -> tuple[Row, list]:
    params = {"json_schema": SCHEMA, "temperature": 0.0, "max_new_tokens": max_new}
    engine.generate(prompts[0], params)  # warm-up: compiles the schema
    row, outs = timed(engine, label, prompts, [params] * len(prompts))
    check_valid(outs, label)
    return row, outs


def markdown(rows: dict[str, Row]) -> str:
    free, on, off = rows["free"], rows["on"], rows["off"]
    lines = [
        "| run | wall s | generated tokens | tok/s | tok/s vs unconstrained | "
        "scheduler steps | steps vs jump-off | jump-forward tokens |",
        "|" + "---|" * 8,
    ]
    for key, name in (
        ("on", "constrained, jump-forward on"),
        ("off", "constrained, jump-forward off"),
        ("free", "unconstrained, same lengths"),
    ):
        r = rows[key]
        lines.append(
            f"| {name} | {r.wall_s:.2f} | {r.tokens} | {r.tok_s:.1f} | "
            f"{r.tok_s / free.tok_s:.2f}x | {r.steps} | {r.steps / off.steps:.2f}x | "
            f"{r.jump_forward_tokens} |"
        )
    lines.append("")
    lines.append(
        f"jump-forward on vs off: {1 - on.steps / off.steps:.0%} fewer scheduler steps, "
        f"{on.tok_s / off.tok_s:.2f}x tok/s"
    )
    return "\n".join(lines)


def _median(rows: list[Row]) -> Row:
    return sorted(rows, key=lambda r: r.wall_s)[len(rows) // 2]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--repeats", type=int, default=3, help="runs of each; the median is shown")
    p.add_argument("--json", default=None, help="also write the results to this path")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    command = "python " + shlex.join(sys.argv)
    print(command, flush=True)
    import radixrt

    prompts = bios(args.num_requests)
    kwargs = dict(dtype=args.dtype, log_level="warning")
    on, free, off = [], [], []
    with radixrt.Engine(**kwargs) as engine:
        log(f"dtype {engine.get_server_info().get('dtype')}, {len(prompts)} requests")
        for _ in range(args.repeats):
            row, outs = constrained_run(engine, "jump-forward on", prompts, args.max_new_tokens)
            on.append(row)
            lengths = [o["meta_info"]["completion_tokens"] for o in outs]
            params = [
                {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True} for n in lengths
            ]
            row, free_outs = timed(engine, "unconstrained", prompts, params)
            assert [o["meta_info"]["completion_tokens"] for o in free_outs] == lengths
            free.append(row)
    with radixrt.Engine(disable_jump_forward=True, **kwargs) as engine:
        for _ in range(args.repeats):
            off.append(constrained_run(engine, "jump-forward off", prompts, args.max_new_tokens)[0])
    rows = {"on": _median(on), "free": _median(free), "off": _median(off)}
    table = markdown(rows)
    print("\n" + table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"command": command, "rows": {k: asdict(r) for k, r in rows.items()}}, f, indent=1
            )


if __name__ == "__main__":
    main()
