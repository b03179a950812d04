"""Tree of thought with `s.fork`: branch, judge each branch, keep the best.

What it shows:
- `s.fork(3)` makes three branches that continue from the same text; the shared text is
  prefilled once, and each branch then finds it in the radix cache (see cached_tokens);
- the branches run side by side (each on its own thread, batched by the server);
- per branch, a short idea with `rt.gen` (each branch starts differently) and a
  self-evaluation with `rt.select`; `forks.join()` gathers each variable into a list.

Run: python examples/tree_of_thought.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from example_cli import run_example

import radixrt as rt

TASK = "Suggest one way to save water at home."
STARTS = ["In the kitchen,", "In the bathroom,", "In the garden,"]
NUM_BRANCHES = len(STARTS)
VERDICTS = ["good", "bad"]


@rt.function
def tree_of_thought(s, task):
    s += rt.system("You are a helpful assistant. Answer in one short sentence.")
    s += rt.user(task)
    forks = s.fork(NUM_BRANCHES)
    # Each branch starts its answer differently (`forks += [one item per branch]`), then the
    # model completes it greedily: three different, reproducible ideas.
    forks += [rt.assistant_begin() + start for start in STARTS]
    forks += rt.gen("idea", max_tokens=20, stop="\n", temperature=0) + rt.assistant_end()
    # Then judges it; select scores the two verdicts and keeps the more likely one.
    forks += rt.user("Is your idea practical? Answer good or bad.")
    forks += rt.assistant(rt.select("verdict", choices=VERDICTS))
    forks.join()  # now s["idea"] and s["verdict"] are lists, one item per branch
    # select's meta info has each choice's score (mean logprob): rank by good minus bad.
    margins = [m["scores"][0] - m["scores"][1] for m in s.get_meta_info("verdict")]
    s["best"] = max(range(NUM_BRANCHES), key=lambda i: margins[i])
    return forks


def main(backend) -> dict:
    state = tree_of_thought.run(task=TASK, backend=backend)
    forks = state.ret_value
    print(f"Task: {TASK}")
    for i in range(NUM_BRANCHES):
        cached = forks[i].get_meta_info("idea")["cached_tokens"]
        prompt = forks[i].get_meta_info("idea")["prompt_tokens"]
        print(
            f"branch {i} [{state['verdict'][i]}] ({cached}/{prompt} prompt tokens cached): "
            f"{STARTS[i]} {state['idea'][i].strip()}"
        )
    best = state["best"]
    print(f"Best: branch {best}: {STARTS[best]} {state['idea'][best].strip()}")
    return {
        "ideas": state["idea"],
        "verdicts": state["verdict"],
        "best": state["best"],
        "cached_tokens": [f.get_meta_info("idea")["cached_tokens"] for f in forks],
    }


if __name__ == "__main__":
    run_example(main, __doc__)
