"""Retrieval-augmented generation with a citation.

What it shows:
- ordinary Python around the program: a naive keyword retriever picks documents from an
  in-file corpus, and the program puts them, numbered [k], in the user turn;
- a short free-form answer with `rt.gen`, then a constrained citation with
  `rt.gen(regex=...)`: the citation is always of the form [k] (k one of the shown documents).

Run: python examples/rag_citations.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import re

from example_cli import run_example

import radixrt as rt

DOCUMENTS = [
    "The Eiffel Tower is in Paris. It was completed in 1889 and is 330 metres tall.",
    "The Great Wall of China is thousands of kilometres long and was built over centuries.",
    "Mount Everest, on the border of Nepal and China, is the highest mountain on Earth.",
    "The Amazon river in South America carries more water than any other river.",
    "Honey bees live in colonies with one queen, many workers and a few drones.",
]
QUESTION = "When was the Eiffel Tower completed?"
STOPWORDS = {"the", "a", "an", "is", "was", "in", "of", "and", "on", "what", "when", "how"}


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS}


def retrieve(question: str, k: int = 2) -> list[str]:
    """The k documents sharing the most words with the question (a stand-in for a real index)."""
    ranked = sorted(DOCUMENTS, key=lambda doc: -len(words(doc) & words(question)))
    return ranked[:k]


@rt.function
def answer_with_citation(s, question, docs):
    context = "\n".join(f"[{i}] {doc}" for i, doc in enumerate(docs, 1))
    s += rt.system(
        "Answer the question in one sentence using only the documents. "
        "Then cite the document you used, like [1]."
    )
    s += rt.user(f"Documents:\n{context}\n\nQuestion: {question}")
    with s.assistant():
        s += rt.gen("answer", max_tokens=32, stop=["\n", "["])
        s += "\nSource: "
        # Only [1]..[n] can be produced: the regex lists the documents actually shown.
        s += rt.gen("citation", regex=rf"\[[1-{len(docs)}]\]")


def main(backend) -> dict:
    docs = retrieve(QUESTION)
    state = answer_with_citation.run(question=QUESTION, docs=docs, backend=backend, temperature=0)
    cited = int(state["citation"].strip("[]"))
    print(f"Question: {QUESTION}")
    for i, doc in enumerate(docs, 1):
        print(f"  [{i}] {doc}")
    print(f"Answer: {state['answer'].strip()}")
    print(f"Citation: {state['citation']} -> {docs[cited - 1]}")
    return {"answer": state["answer"], "citation": state["citation"], "docs": docs}


if __name__ == "__main__":
    run_example(main, __doc__)
