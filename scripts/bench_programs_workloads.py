"""The programs of scripts/bench_programs.py (the SGLang paper's kinds of workloads) and their
inputs, built from seeded synthetic text (no downloads; identical across runs and servers).

Every workload is a DSL program plus one dict of arguments per program; all of them share
some text (a few-shot prefix, a system prompt, a question their branches start from, earlier
turns), which is what the radix cache can reuse.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import radixrt as rt

TOWNS = [
    "Marlow Creek",
    "Ashby Vale",
    "Pendle Cross",
    "Hollin Ford",
    "Wrenmoor",
    "Calder Mill",
    "Otterbury",
    "Sallow Heath",
    "Brackenridge",
    "Fenwick Hythe",
    "Thornleigh",
    "Eskdown",
    "Larkspur Quay",
    "Moss Hallow",
    "Ravensgill",
    "Quarry End",
    "Tillingham",
    "Dunmere",
    "Harrow Lees",
    "Kestrel Point",
    "Wickham Bay",
    "Stanbridge",
    "Elder Row",
    "Gorsey Bank",
]
FOUNDERS = [
    ("Edith Crane", "miller"),
    ("Tobias Hale", "stonemason"),
    ("Mara Quill", "weaver"),
    ("Jonas Frith", "ferryman"),
    ("Alys Marden", "blacksmith"),
    ("Owen Pryce", "potter"),
    ("Nell Ashdown", "brewer"),
    ("Silas Rook", "shipwright"),
    ("Hester Vane", "printer"),
    ("Caleb Thorne", "glazier"),
    ("Ruth Cobb", "cooper"),
    ("Amos Reed", "tanner"),
]
INDUSTRIES = [
    "glassblowing",
    "the ferry trade",
    "wool dyeing",
    "slate quarrying",
    "cider making",
    "boat building",
    "clock repair",
    "paper milling",
    "oyster farming",
    "rope making",
]
RIVERS = ["Tamsin", "Orrel", "Caddow", "Wyle", "Lunet", "Brisk", "Hembry", "Sorrow", "Alder"]
FESTIVALS = [
    "Lantern Fair",
    "Apple Moot",
    "River Regatta",
    "Harvest Bell",
    "Kite Day",
    "Candle Walk",
    "Fiddlers' Night",
    "Mayfield Show",
]
LANDMARKS = [
    "stone bridge",
    "clock tower",
    "windmill",
    "covered market",
    "lighthouse",
    "chapel",
    "toll house",
    "granary",
]
DIRECTIONS = ["north", "south", "east", "west"]
LETTERS = ["A", "B", "C", "D"]


def _town(rng: random.Random) -> dict[str, Any]:
    founder, trade = rng.choice(FOUNDERS)
    name, other = rng.sample(TOWNS, 2)
    return {
        "name": name,
        "other": other,
        "km": rng.randint(8, 95),
        "dir": rng.choice(DIRECTIONS),
        "river": rng.choice(RIVERS),
        "year": rng.randint(1610, 1890),
        "founder": founder,
        "trade": trade,
        "pop": rng.randint(12, 480) * 100,
        "industry": rng.choice(INDUSTRIES),
        "festival": rng.choice(FESTIVALS),
        "month": rng.choice(["April", "June", "October"]),
        "landmark": rng.choice(LANDMARKS),
        "rebuilt": rng.randint(1895, 1975),
    }


def _passage(t: dict[str, Any]) -> str:
    """Five sentences about a fictional town: an MMLU-like reading passage (~110 tokens)."""
    return (
        f"The town of {t['name']} lies {t['km']} kilometres {t['dir']} of {t['other']}, on "
        f"the bank of the River {t['river']}. It was founded in {t['year']} by "
        f"{t['founder']}, a {t['trade']} who built the first {t['landmark']} there. Today "
        f"about {t['pop']:,} people live in the town, and most of them work in "
        f"{t['industry']}. Every {t['month']} the town holds the {t['festival']}, which "
        f"draws visitors from the whole valley. The {t['landmark']} was rebuilt in "
        f"{t['rebuilt']} after a flood, but its old foundations can still be seen."
    )


def _mc_question(rng: random.Random, answer: bool) -> str:
    """Passage, question, options A-D; with answer=True followed by "Answer: X"."""
    t = _town(rng)
    asks = [
        ("Who founded {name}?", "founder", [f for f, _ in FOUNDERS]),
        ("What is the main industry of {name}?", "industry", INDUSTRIES),
        ("Which festival does {name} hold?", "festival", FESTIVALS),
        ("On which river does {name} lie?", "river", [f"the River {r}" for r in RIVERS]),
    ]
    template, key, pool = rng.choice(asks)
    right = f"the River {t[key]}" if key == "river" else t[key]
    options = rng.sample([x for x in pool if x != right], 3) + [right]
    rng.shuffle(options)
    listed = "".join(f"{letter}. {opt}\n" for letter, opt in zip(LETTERS, options, strict=True))
    text = f"Passage: {_passage(t)}\nQuestion: {template.format(**t)}\n{listed}Answer:"
    return f"{text} {LETTERS[options.index(right)]}\n\n" if answer else text


# -- 1. five_shot_select --------------------------------------------------------------------
@rt.function
def five_shot_select(s, examples: str, question: str):
    s += examples + question
    # "Answer:" then " A": the choices carry the space, as in the examples' "Answer: A".
    s += rt.select("answer", [" " + x for x in LETTERS])


def five_shot_inputs(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """MMLU-style: a header and 5 solved questions (~850 tokens with SmolLM2's tokenizer)
    shared by n test questions (~160 tokens each, the answer left to `select`)."""
    examples = (
        "The following are multiple choice questions (with answers) about the "
        "geography and history of small towns.\n\n"
        + "".join(_mc_question(rng, answer=True) for _ in range(5))
    )
    return [{"examples": examples, "question": _mc_question(rng, answer=False)} for _ in range(n)]


# -- 2. tree_of_thought ---------------------------------------------------------------------
PLANNER_SYSTEM = (
    "You are a careful town planner. When asked about a problem, you propose "
    "one concrete plan in a single sentence, then judge plans honestly: what "
    "they cost, who they help and what could go wrong."
)
STYLES = ["the cheapest way", "the fastest way", "the way that helps the most people"]
PROBLEMS = [
    "the {landmark} floods every spring",
    "young people are leaving for the city",
    "the {industry} workshops are losing money",
    "visitors cannot find parking during the {festival}",
    "the ferry across the River {river} is too slow",
    "the school has no room for new pupils",
]


@rt.function
def tree_of_thought(s, question: str):
    s += rt.system(PLANNER_SYSTEM)
    s += rt.user(question)
    forks = s.fork(3)  # the shared context is prefilled once; the branches reuse it
    # Each branch is asked for a different kind of plan: at temperature 0 the same request
    # would give the same plan three times.
    forks += [rt.user(f"Propose {style} to fix it, in one sentence.") for style in STYLES]
    forks += rt.assistant(rt.gen("plan", max_tokens=24, stop="\n"))
    forks += rt.user("Judge this plan in one sentence: its cost and its risk.")
    forks += rt.assistant(rt.gen("evaluation", max_tokens=16, stop="\n"))
    forks.join()


def tree_of_thought_inputs(n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        t = _town(rng)
        problem = rng.choice(PROBLEMS).format(**t)
        out.append(
            {
                "question": f"{_passage(t)} The council says that {problem}. How should "
                f"{t['name']} fix this?"
            }
        )
    return out


# -- 3. multi_turn_chat ---------------------------------------------------------------------
GUIDE_SYSTEM = (
    "You are a friendly local guide for the towns of the valley. Answer in one "
    "or two short sentences, give concrete details and do not repeat the "
    "question."
)
TURNS = [
    "I am visiting {name} next {month}. What should I see first?",
    "Is the {festival} worth staying an extra day for?",
    "What do people there do for a living? I read something about {industry}.",
    "How do I get from {other} to {name}? It is {km} kilometres, I think.",
]


@rt.function
def multi_turn_chat(s, turns: list[str]):
    s += rt.system(GUIDE_SYSTEM)
    for i, question in enumerate(turns):
        s += rt.user(question)  # each turn's prompt is the previous turn's prompt + answer
        s += rt.assistant(rt.gen(f"answer_{i}", max_tokens=24))


def multi_turn_inputs(n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        t = _town(rng)
        out.append({"turns": [turn.format(**t) for turn in TURNS]})
    return out


# -- 4. few_shot_gen ------------------------------------------------------------------------
def _fact_sheet(t: dict[str, Any]) -> str:
    return (
        f"Facts: {t['name']}; founded {t['year']} by {t['founder']} ({t['trade']}); "
        f"population {t['pop']:,}; river {t['river']}; industry {t['industry']}; "
        f"festival {t['festival']} in {t['month']}; landmark {t['landmark']}.\nSummary:"
    )


@rt.function
def few_shot_gen(s, examples: str, facts: str):
    s += examples + facts
    s += rt.gen("summary", max_tokens=16, stop="\n")


def few_shot_gen_inputs(n: int, rng: random.Random, shots: int = 8) -> list[dict[str, Any]]:
    """8 fact sheets with a one-line summary (~560 tokens) shared by n fact sheets to
    summarize (~55 tokens each; the summary is ~12 tokens and a newline)."""
    examples = "Write a one-line summary of each town.\n\n"
    for _ in range(shots):
        t = _town(rng)
        examples += f"{_fact_sheet(t)} {t['name']}: {t['industry']}, on the River {t['river']}.\n\n"
    return [{"examples": examples, "facts": _fact_sheet(_town(rng))} for _ in range(n)]


# name -> (program, input builder, default number of programs)
WORKLOADS: dict[str, tuple[Any, Callable[[int, random.Random], list[dict]], int]] = {
    "five_shot_select": (five_shot_select, five_shot_inputs, 32),
    "tree_of_thought": (tree_of_thought, tree_of_thought_inputs, 16),
    "multi_turn_chat": (multi_turn_chat, multi_turn_inputs, 16),
    "few_shot_gen": (few_shot_gen, few_shot_gen_inputs, 32),
}


def build(name: str, n: int | None, seed: int) -> tuple[Any, list[dict[str, Any]]]:
    """The program and n argument dicts (the workload's default n when None)."""
    program, make_inputs, default_n = WORKLOADS[name]
    return program, make_inputs(n or default_n, random.Random(f"{name}-{seed}"))


@rt.function
def warm_up_program(s):
    """Touches every request kind the workloads use (gen, select's logprob scoring, fork)."""
    s += rt.user("Say hello.")
    s += rt.assistant(rt.gen("hello", max_tokens=4))
    forks = s.fork(2)
    forks += rt.select("pick", ["yes", "no"])
    forks.join()
