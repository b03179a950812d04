"""The workloads of scripts/bench_serving.py, built from local text (seeded, identical across
runs): shared-prefix (few-shot), multi-turn chat, and unrelated prompts with skewed outputs."""

from __future__ import annotations

import random
from dataclasses import dataclass

WORKLOADS = ("shared-prefix", "multi-turn", "skewed")
DEFAULT_REQUESTS = {"shared-prefix": 64, "multi-turn": 48, "skewed": 64}

NAMES = ["Ada", "Bo", "Cyd", "Dee", "Eli", "Fay", "Gil", "Hal", "Ivy", "Jan", "Kit", "Lou"]
ITEMS = [
    "apples",
    "pears",
    "plums",
    "limes",
    "figs",
    "dates",
    "kiwis",
    "melons",
    "grapes",
    "lemons",
    "peaches",
    "cherries",
]
TOPICS = [
    "tides",
    "volcanoes",
    "bread yeast",
    "bird migration",
    "glass making",
    "comets",
    "river deltas",
    "honey bees",
    "tea ceremonies",
    "sail boats",
    "coral",
    "lighthouses",
    "paper money",
    "sundials",
    "maps",
    "windmills",
]
ASKS = [
    "Explain",
    "Describe briefly",
    "Give three facts about",
    "Tell a short story about",
    "Summarize the history of",
    "Compare two views on",
    "List common myths about",
]
FILLER = [
    "Keep it simple.",
    "Use one concrete example.",
    "The reader is curious but busy.",
    "Mention a number if you can.",
    "Avoid jargon.",
    "Be honest about what is unknown.",
    "Write for a twelve-year-old.",
    "End with a question.",
    "Two sentences are enough.",
    "A detail from everyday life would help.",
    "Do not repeat the question.",
]


@dataclass
class Request:
    """One request of a workload; a multi-turn conversation is one Request per turn, the
    later turns' messages completed at run time from the answers."""

    max_tokens: int
    prompt: str | None = None  # /v1/completions
    messages: list[dict[str, str]] | None = None  # /v1/chat/completions
    conversation: int = -1  # multi-turn: the conversation and its turn
    turn: int = 0


# -- workloads ----------------------------------------------------------------------------
def _shop_example(rng: random.Random, items: int, answer: bool) -> str:
    name, goods = rng.choice(NAMES), rng.sample(ITEMS, items)
    buys = [(rng.randint(2, 19), g, rng.randint(5, 95)) for g in goods]
    listed = ", ".join(f"{n} {g} at {p} cents each" for n, g, p in buys)
    text = f"Question: {name} buys {listed}. How many cents does {name} spend?\nAnswer:"
    if not answer:
        return text
    total, steps = 0, []
    for n, g, p in buys:
        total += n * p
        steps.append(f"The {g} cost {n} x {p} = {n * p} cents, so the total is {total}.")
    return f"{text} Step by step. {' '.join(steps)} The answer is {total}.\n\n"


def shared_prefix(
    n: int, rng: random.Random, shots: int = 5, output_len: int = 32
) -> list[Request]:
    """A few-shot prefix (~180 tokens a shot with SmolLM2's tokenizer, ~920 in all) shared by
    n distinct short questions (~40 tokens)."""
    prefix = "Solve each shopping problem step by step.\n\n" + "".join(
        _shop_example(rng, 4, answer=True) for _ in range(shots)
    )
    questions: list[str] = []
    while len(questions) < n:
        q = _shop_example(rng, 2, answer=False)
        if q not in questions:
            questions.append(q)
    return [Request(output_len, prompt=prefix + q) for q in questions]


def _user_turn(rng: random.Random, topic: str) -> str:
    return f"{rng.choice(ASKS)} {topic}. " + " ".join(rng.sample(FILLER, 4))


def multi_turn(n: int, rng: random.Random, turns: int = 4, output_len: int = 32) -> list[Request]:
    """n requests as n // turns conversations of `turns` turns. Each turn's messages hold
    the first turn's system and user messages, then every earlier answer and user turn."""
    out = []
    for c in range(max(1, n // turns)):
        topic = TOPICS[c % len(TOPICS)]
        system = {"role": "system", "content": f"You are a patient tutor on {topic}."}
        users = [_user_turn(rng, topic) for _ in range(turns)]
        for t, text in enumerate(users):
            msgs = (
                [system, {"role": "user", "content": text}]
                if t == 0
                else [{"role": "user", "content": text}]
            )
            out.append(Request(output_len, messages=msgs, conversation=c, turn=t))
    return out


def skewed(n: int, rng: random.Random, long_len: int = 256) -> list[Request]:
    """Unrelated prompts of 20-100 words; outputs of 8-16 tokens, and n // 16 of long_len."""
    out = []
    for _ in range(n):
        words = f"{rng.choice(ASKS)} {rng.choice(TOPICS)}. {' '.join(FILLER)}".split()
        rng.shuffle(words)
        out.append(Request(rng.randint(8, 16), prompt=" ".join(words[: rng.randint(20, 100)])))
    for i in rng.sample(range(n), max(1, n // 16)):
        out[i].max_tokens = long_len
    return out


def build_workload(
    name: str, n: int, seed: int, output_len: int = 32, turns: int = 4
) -> list[Request]:
    rng = random.Random(f"{name}-{seed}")
    if name == "shared-prefix":
        return shared_prefix(n, rng, output_len=output_len)
    if name == "multi-turn":
        return multi_turn(n, rng, turns=turns, output_len=output_len)
    if name == "skewed":
        return skewed(n, rng)
    raise ValueError(f"--workload must be one of {WORKLOADS} or all, got {name!r}")
