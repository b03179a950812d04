"""Few-shot classification with `rt.select`, batched with `run_batch`.

What it shows:
- a few labelled examples form a prefix that every program of the batch starts with;
  `run_batch` prefills that shared prefix once, so the radix cache serves it to every input;
- `rt.select` picks the label by scoring each choice's likelihood: the answer is always one of
  the labels, whatever the (tiny) model would have generated freely;
- the batch's cache hit rate, from `states.get_meta_info()`.

Run: python examples/few_shot_select.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from example_cli import run_example

import radixrt as rt

LABELS = ["positive", "negative"]
EXAMPLES = [
    ("I loved this movie, the acting was wonderful.", "positive"),
    ("The food was cold and the waiter was rude.", "negative"),
    ("What a fantastic day at the beach with friends!", "positive"),
    ("My phone broke after two days, total waste of money.", "negative"),
    ("The concert was amazing and the crowd was great.", "positive"),
]
INPUTS = [
    "This book is a delight, I could not put it down.",
    "The hotel room was dirty and smelled awful.",
    "Great service, friendly staff, I will come back!",
    "The train was late again and I missed my meeting.",
]


@rt.function
def classify(s, sentence):
    # Everything up to the sentence is the same for every input: the shared few-shot prefix.
    s += rt.system("Classify the sentiment of each sentence as positive or negative.")
    for text, label in EXAMPLES:
        s += rt.user(text) + rt.assistant(label)
    s += rt.user(sentence)
    s += rt.assistant(rt.select("label", choices=LABELS))


def main(backend) -> dict:
    states = classify.run_batch(
        [{"sentence": x} for x in INPUTS], backend=backend, temperature=0, progress_bar=False
    )
    labels = [state["label"] for state in states]
    for sentence, label in zip(INPUTS, labels, strict=True):
        print(f"{label:>8}  {sentence}")
    meta = states.get_meta_info()
    print(
        f"batch: {meta['num_requests']} requests, {meta['prompt_tokens']} prompt tokens, "
        f"{meta['cached_tokens']} cached, cache hit rate {meta['cache_hit_rate']:.0%}"
    )
    return {"labels": labels, "cache_hit_rate": meta["cache_hit_rate"]}


if __name__ == "__main__":
    run_example(main, __doc__)
