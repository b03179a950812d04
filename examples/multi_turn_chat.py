"""Multi-turn chat, and streaming an answer as it is generated.

What it shows:
- a program that loops over Python data: one user turn and one generated assistant turn per
  question; each turn sees the whole conversation so far (whose prefix is in the radix cache);
- `state.messages()`, the conversation as {"role", "content"} dicts (it starts with the
  default system prompt that SmolLM2's chat template inserts);
- `run(..., stream=True)` returns at once; `state.text_iter("answer_0")` yields the pieces
  of one variable while the model writes them.

Run: python examples/multi_turn_chat.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from example_cli import run_example

import radixrt as rt

QUESTIONS = ["What is the capital of France?", "What is a famous landmark there?"]


@rt.function
def chat(s, questions):
    for i, question in enumerate(questions):
        s += rt.user(question)
        s += rt.assistant(rt.gen(f"answer_{i}", max_tokens=24))


def main(backend) -> dict:
    # 1. Run the whole conversation, then read it back.
    state = chat.run(questions=QUESTIONS, backend=backend, temperature=0)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content'].strip()}")
    meta = state.get_meta_info("answer_1")
    print(
        f"(second answer: {meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} "
        f"of them already in the radix cache)"
    )

    # 2. Stream: run returns at once; print the first answer piece by piece as it arrives.
    streamed = chat.run(questions=QUESTIONS[:1], backend=backend, temperature=0, stream=True)
    print("streaming: ", end="", flush=True)
    pieces = []
    for piece in streamed.text_iter("answer_0"):
        pieces.append(piece)
        print(piece, end="", flush=True)
    print(f"\n({len(pieces)} pieces)")
    return {"messages": state.messages(), "streamed": "".join(pieces)}


if __name__ == "__main__":
    run_example(main, __doc__)
