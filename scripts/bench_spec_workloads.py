"""The workloads of scripts/bench_spec.py: chat prompts whose answers repeat their context
(n-gram speculation's good case) and random token ids (where nothing matches), built from
seeded synthetic text, so every run and every engine gets the same token ids.

Each workload makes any number of distinct variants of one task (variant i from its own seed):
the batch-1 requests and the batch-16 ones are different variants, so neither reuses the
other's prompts. At the end: the figures of one run (a row of bench_spec.py's table) from the
engines' outputs, and the targets they are held to.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A variant's chat messages and the start of the assistant's answer, written into the prompt
# after the template's generation prompt: it steers the small default model into copying (a
# code fence before a file, the opening quote of a quotation) rather than into commentary.
Chat = tuple[list[dict[str, str]], str]

# (singular, plural, the place that keeps them): the code file's domain, which renames most of
# its identifiers, so variants differ all through the file and not only in the instruction.
DOMAINS = [
    ("book", "books", "library"),
    ("plant", "plants", "nursery"),
    ("tool", "tools", "workshop"),
    ("bike", "bikes", "garage"),
    ("record", "records", "shop"),
    ("lamp", "lamps", "warehouse"),
    ("boat", "boats", "harbour"),
    ("cake", "cakes", "bakery"),
]
# Functions of the code file that a variant renames ({i}: the domain's singular), and new names.
RENAMES = ["add_{i}", "remove_{i}", "total_value", "cheapest", "restock", "find_by_tag"]
NEW_NAMES = "register drop_item inventory_value lowest_priced refill search_tag".split()

CODE = '''"""Keep track of the {s}s in a small {place}."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class {S}:
    name: str
    price: float
    count: int = 0
    tags: list[str] = field(default_factory=list)


class {Place}:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.{p}: dict[str, {S}] = {{}}

    def add_{s}(self, name: str, price: float, count: int = 1) -> {S}:
        if name in self.{p}:
            self.{p}[name].count += count
            return self.{p}[name]
        item = {S}(name=name, price=price, count=count)
        self.{p}[name] = item
        return item

    def remove_{s}(self, name: str, count: int = 1) -> None:
        item = self.{p}[name]
        if item.count < count:
            raise ValueError(f"only {{item.count}} {{name}} left")
        item.count -= count
        if item.count == 0:
            del self.{p}[name]

    def total_value(self) -> float:
        return sum(item.price * item.count for item in self.{p}.values())

    def cheapest(self) -> {S} | None:
        if not self.{p}:
            return None
        return min(self.{p}.values(), key=lambda item: item.price)

    def restock(self, below: int, amount: int) -> list[str]:
        changed = []
        for item in self.{p}.values():
            if item.count < below:
                item.count += amount
                changed.append(item.name)
        return changed

    def find_by_tag(self, tag: str) -> list[{S}]:
        return [item for item in self.{p}.values() if tag in item.tags]


def report({place}: {Place}) -> str:
    lines = [f"{{{place}.owner}}'s {place}"]
    for item in sorted({place}.{p}.values(), key=lambda item: item.name):
        lines.append(f"{{item.name}}: {{item.count}} at {{item.price:.2f}}")
    lines.append(f"total: {{{place}.total_value():.2f}}")
    return "\\n".join(lines)
'''

EDITOR = (
    "You are a code editor. You output the user's file exactly as given, with only the "
    "requested change."
)

FIRST = "Ada Ben Cleo Dev Emma Farid Gus Hana Ivan Jo Kai Lena Milo Nora Omar Pia".split()
LAST = "Smith Okafor Ng Garcia Novak Haddad Berg Rossi Adler Moreau Silva Tanaka".split()
CITIES = "Lisbon Denver Osaka Nairobi Oslo Lima Toronto Hanoi Porto Quito Tallinn Perth".split()
STREETS = "Oak Mill Harbour Station Church Bridge Market Willow Chapel Garden".split()
PRODUCTS = [
    "a cordless drill",
    "a pair of hiking boots",
    "a standing desk",
    "an espresso machine",
    "a mountain bike helmet",
    "a set of kitchen knives",
    "a robot vacuum cleaner",
    "a wool winter coat",
]
PROBLEMS = [
    "arrived with a cracked casing and does not switch on",
    "was delivered to the wrong address and came back two weeks late",
    "stopped working after three days of normal use",
    "is missing the charger that the listing said was included",
    "was charged twice on my card even though I placed one order",
]
EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "customer_name": {"type": "string"},
        "email": {"type": "string"},
        "city": {"type": "string"},
        "street_address": {"type": "string"},
        "order_number": {"type": "string"},
        "product": {"type": "string"},
        "problem": {"type": "string"},
    },
    "required": [
        "customer_name",
        "email",
        "city",
        "street_address",
        "order_number",
        "product",
        "problem",
    ],
    "additionalProperties": False,
}

TOWNS = """Marlow Ashby Pendle Hollin Wrenmoor Calder Otterbury Sallow Brackenridge Fenwick
    Thornleigh Eskdown Larkspur Dunmere Tillingham Ravensgill""".split()
TRADES = "miller weaver ferryman blacksmith potter brewer shipwright printer glazier".split()
GOODS = "flour cloth rope nails jugs ale sails books glass barrels salt cheese".split()
SIGHTS = "a stone bridge|a clock tower|a covered market|a lighthouse|a walled garden".split("|")

PACKING = "passport|charger|rain jacket|walking shoes|sun cream|water bottle|notebook".split("|")
SWAPS = "umbrella|camera|scarf|map|snacks|headphones|sunglasses|gloves".split("|")
TRIPS = "Lisbon|the Alps|Kyoto|the Scottish Highlands|Iceland|Crete|Patagonia|Quebec".split("|")


@dataclass(frozen=True)
class Task:
    """One workload: its variants' chat messages (or None: random ids) and how they decode."""

    name: str
    describe: str
    messages: Callable[[random.Random, int], Chat] | None
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    json_schema: str | None = None


def code_rewrite(rng: random.Random, i: int) -> Chat:
    s, p, place = DOMAINS[i % len(DOMAINS)]
    k = (i // len(DOMAINS) + rng.randrange(len(RENAMES))) % len(RENAMES)
    old, new = RENAMES[k].format(i=s), NEW_NAMES[k]
    code = CODE.format(s=s, S=s.capitalize(), p=p, place=place, Place=place.capitalize())
    ask = f"Rename the function `{old}` to `{new}` in this file.\n\n```python\n{code}```"
    return [{"role": "system", "content": EDITOR}, {"role": "user", "content": ask}], "```python\n"


def extraction(rng: random.Random, i: int) -> Chat:
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    email = f"{name.split()[0].lower()}.{name.split()[1].lower()}{rng.randint(1, 99)}@mail.com"
    city, street = rng.choice(CITIES), f"{rng.randint(2, 240)} {rng.choice(STREETS)} Street"
    order, product = f"A-{rng.randint(10000, 99999)}", rng.choice(PRODUCTS)
    problem = rng.choice(PROBLEMS)
    letter = (
        f"Hello, my name is {name} and I am writing about order {order}. I bought {product} "
        f"from your website last month. Unfortunately it {problem}. I live at {street} in "
        f"{city}, and you can reach me at {email} at any time. I have been a customer for "
        f"{rng.randint(2, 9)} years and I would like a replacement or a full refund. Thank "
        f"you for your help.\n{name}"
    )
    ask = (
        f"Extract the fields of this JSON schema from the letter below, as JSON. Copy each "
        f"value from the letter word for word.\n\nSchema: {json.dumps(EXTRACT_SCHEMA)}\n\n"
        f"Letter:\n{letter}"
    )
    return [{"role": "user", "content": ask}], ""


def town_paragraph(rng: random.Random, town: str) -> str:
    trade, good, sight = rng.choice(TRADES), rng.choice(GOODS), rng.choice(SIGHTS)
    year, people = rng.randint(1200, 1850), rng.randint(300, 9000)
    return (
        f"{town} was founded in {year} by a {trade} who traded {good} along the river. "
        f"Today about {people} people live there, and visitors come to see {sight}. "
        f"Every spring the town holds a fair where the best {good} of the year wins a prize, "
        f"and the oldest families still keep the {trade}'s tools in the town hall."
    )


def quote(rng: random.Random, i: int) -> Chat:
    towns = rng.sample(TOWNS, len(TOWNS))
    passage = "\n\n".join(town_paragraph(rng, t) for t in towns)
    first, second = rng.sample(towns, 2)
    ask = (
        f"{passage}\n\nQuestion: what does the passage say about {first} and {second}? Answer "
        f"by quoting the paragraphs about {first} and {second} word for word, in full."
    )
    return [{"role": "user", "content": ask}], f'"{first} was'


def multi_turn(rng: random.Random, i: int) -> Chat:
    trip, items = rng.choice(TRIPS), rng.sample(PACKING, len(PACKING))
    listed = "\n".join(f"{n}. {item.capitalize()}" for n, item in enumerate(items, 1))
    who = rng.choice(FIRST)
    note = (
        f"Dear {who},\n\nThank you so much for lending me your car last weekend. It made the "
        f"trip to {trip} so much easier, and I have filled the tank and cleaned the seats. "
        "Let me know when I can take you out for dinner to say thanks properly.\n\nBest wishes"
    )
    old, new = rng.choice(items), rng.choice(SWAPS)
    other = rng.choice([n for n in FIRST if n != who])
    return [
        {"role": "user", "content": f"Write a packing list for a trip to {trip}."},
        {"role": "assistant", "content": f"Here is a packing list for {trip}:\n{listed}"},
        {"role": "user", "content": f"Write a short thank-you note to {who} for the car."},
        {"role": "assistant", "content": note},
        {
            "role": "user",
            "content": f"Repeat the thank-you note, addressed to {other} instead, then the "
            f"packing list from before with {old} replaced by {new}.",
        },
    ], ""


TASKS = {
    t.name: t
    for t in (
        Task("code_rewrite", "rename a function in a 60-line Python file", code_rewrite),
        Task(
            "extraction",
            "7 fields of a letter as JSON, json_schema constrained",
            extraction,
            json_schema=json.dumps(EXTRACT_SCHEMA),
        ),
        Task("quote", "quote two paragraphs of a 16-paragraph context", quote),
        Task("multi_turn", "repeat a note and a list from earlier turns", multi_turn),
        # Greedy decoding after random ids falls into a loop within a few dozen tokens
        # ("2222...", "Sin-Sin-..."), which speculation then matches (accept length 2-4 with the
        # default model): the penalty keeps the output from repeating itself, so that nothing
        # matches (accept length ~1.05).
        Task(
            "random",
            "random token ids, EOS ignored, repetition_penalty",
            None,
            ignore_eos=True,
            repetition_penalty=1.2,
        ),
    )
}
# (workload, batch) -> the least radixrt spec ÷ base tok/s the issue asks for; at batch 16 (or
# any other above 1) 0.95 for every workload.
TARGETS = {("code_rewrite", 1): 2.0, ("extraction", 1): 1.3, ("random", 1): 0.97}
RANDOM_PROMPT_LEN = 256
TOKEN_RANGE = (100, 40000)


def prompts(task: Task, tokenizer, first: int, n: int, seed: int = 0) -> list[list[int]]:
    """Variants first .. first+n-1 of a task as token ids (each from its own seed)."""
    out = []
    for i in range(first, first + n):
        rng = random.Random(f"{seed}:{task.name}:{i}")
        if task.messages is None:
            out.append([rng.randrange(*TOKEN_RANGE) for _ in range(RANDOM_PROMPT_LEN)])
            continue
        messages, answer_start = task.messages(rng, i)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer.encode(text + answer_start, add_special_tokens=False))
    return out


def context_match(prompts: list[list[int]], outputs: list[dict], n: int = 3) -> float:
    """The share of output tokens (outputs[i]["ids"]) whose n preceding tokens occur in their
    prompt: how much the answers copy their context, whatever the engine made of it."""
    hits = total = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        grams = {tuple(prompt[j : j + n]) for j in range(len(prompt) - n + 1)}
        seq = prompt + out["ids"]
        hits += sum(tuple(seq[j - n : j]) in grams for j in range(len(prompt), len(seq)))
        total += len(out["ids"])
    return hits / max(1, total)


def build_runs(
    tokenizer, names: list[str], requests: int, batches: list[int], cap: int | None, max_new: int
) -> list[dict]:
    """Each workload at each batch size: at batch 1, `requests` prompts (sent one at a time),
    else `batch` prompts (sent together), at most `cap` (a smoke run); each run has its own
    variants, so no prompt is seen twice."""
    runs = []
    for name in names:
        task, first = TASKS[name], 0
        for batch in batches:
            n = requests if batch == 1 else batch
            n = min(n, cap) if cap else n
            params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": task.ignore_eos}
            if task.repetition_penalty != 1.0:
                params["repetition_penalty"] = task.repetition_penalty
            if task.json_schema:
                params["json_schema"] = task.json_schema
            ids = prompts(task, tokenizer, first, n)
            runs.append({"workload": name, "batch": batch, "prompts": ids, "params": params})
            first += n
    return runs


def describe(run: dict) -> str:
    lens = [len(p) for p in run["prompts"]]
    return (
        f"{run['workload']} ({TASKS[run['workload']].describe}) batch {run['batch']}: "
        f"{len(lens)} prompts of {min(lens)}-{max(lens)} tokens, {json.dumps(run['params'])[:100]}"
    )


# -- the figures of one run (scripts/bench_spec.py's rows) ----------------------------------------
def tok_s(result: dict[str, Any] | None, i: int) -> float | None:
    if not result or "error" in result:
        return None
    run = result["runs"][i]
    return sum(len(o["ids"]) for o in run["outputs"]) / run["seconds"]


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def outputs(result: dict[str, Any] | None, i: int) -> list[dict[str, Any]] | None:
    return None if not result or "error" in result else result["runs"][i]["outputs"]


def differing(a: list[dict] | None, b: list[dict] | None) -> int | None:
    """How many requests' greedy tokens differ between two runs of the same prompts."""
    if a is None or b is None:
        return None
    return sum(x["ids"] != y["ids"] for x, y in zip(a, b, strict=True))


def accept_rate(outs: list[dict] | None) -> float | None:
    """Drafted tokens accepted / proposed, over a run's requests (meta_info's counts)."""
    proposed = sum(o.get("spec_num_proposed_drafts", 0) for o in outs or [])
    return sum(o["spec_num_correct_drafts"] for o in outs or []) / proposed if proposed else None


def row(i: int, run: dict, res: dict[str, dict], jobs: tuple[str, ...]) -> dict[str, Any]:
    """The figures of run i, from every job's result (res[job]: a worker's, or {'error': ...})."""
    fig = {k: tok_s(res[k], i) for k in jobs}
    outs = {k: outputs(res[k], i) for k in jobs}
    accepts = [
        o["spec_accept_length"] for o in outs["radixrt-spec"] or [] if "spec_accept_length" in o
    ]
    any_out = next((o for o in outs.values() if o is not None), None)
    return {
        "workload": run["workload"],
        "batch": run["batch"],
        "requests": len(run["prompts"]),
        "prompt_tokens_mean": statistics.mean(len(p) for p in run["prompts"]),
        "tok_s": fig,
        "spec_speedup": div(fig["radixrt-spec"], fig["radixrt-base"]),
        "accept_length": statistics.mean(accepts) if accepts else None,
        "accept_rate": accept_rate(outs["radixrt-spec"]),
        "vs_llamacpp_lookup": div(fig["radixrt-spec"], fig["llamacpp-lookup"]),
        "spec_differs": differing(outs["radixrt-base"], outs["radixrt-spec"]),
        "lookup_differs": differing(outs["llamacpp-base"], outs["llamacpp-lookup"]),
        "context_match": context_match(run["prompts"], any_out) if any_out else None,
        "errors": {k: res[k]["error"] for k in jobs if "error" in res[k]},
        "target": TARGETS.get((run["workload"], run["batch"]), 0.95 if run["batch"] > 1 else None),
    }
