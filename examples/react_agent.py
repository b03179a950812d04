"""A ReAct-style agent: the model picks tools, Python runs them, the results go back in.

What it shows:
- control flow in Python around the model: a bounded loop, reading `s["action_i"]` to decide
  what to do next (reading a variable waits for the model to produce it);
- `rt.select` to choose the tool (the model cannot invent a tool name), `rt.gen(stop="\\n")`
  for its argument, and the tool's result appended as an "Observation:" line;
- robustness with a weak model: at most MAX_STEPS steps, and a tool error is just an
  observation the model sees next, never a crash.

Run: python examples/react_agent.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import ast
import operator

from example_cli import run_example

import radixrt as rt

MAX_STEPS = 3
QUESTION = "What is 17 * 23?"
CAPITALS = {
    "france": "Paris",
    "japan": "Tokyo",
    "italy": "Rome",
    "kenya": "Nairobi",
    "canada": "Ottawa",
    "brazil": "Brasilia",
    "germany": "Berlin",
}
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
}


def calculator(expression: str) -> str:
    """Evaluate + - * / % on numbers; anything else (names, calls, **) is refused."""

    def evaluate(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](evaluate(node.operand))
        raise ValueError(f"unsupported expression {ast.unparse(node)!r}")

    return str(evaluate(ast.parse(expression.strip(), mode="eval").body))


def capital(country: str) -> str:
    key = country.strip().strip(".?!\"'").lower()
    if key not in CAPITALS:
        raise ValueError(f"unknown country {country.strip()!r}")
    return CAPITALS[key]


TOOLS = {"calculator": calculator, "capital": capital}
SYSTEM = """You answer questions using tools. Tools:
calculator: evaluates an arithmetic expression, e.g. 3 * (4 + 5)
capital: gives the capital city of a country, e.g. Japan
finish: gives the final answer
Use this format:
Action: calculator
Action Input: 2 + 2
Observation: 4
Action: finish
Action Input: 4"""


@rt.function
def agent(s, question):
    s += rt.system(SYSTEM)
    s += rt.user(question)
    with s.assistant():
        for step in range(MAX_STEPS):
            # The first step must use a tool (else the tiny model tends to "finish" at once).
            choices = list(TOOLS) if step == 0 else [*TOOLS, "finish"]
            s += "Action: " + rt.select(f"action_{step}", choices=choices) + "\n"
            s += "Action Input: " + rt.gen(f"input_{step}", max_tokens=16, stop="\n") + "\n"
            action, argument = s[f"action_{step}"], s[f"input_{step}"]
            if action == "finish":
                s["answer"] = argument.strip()
                return
            try:
                observation = TOOLS[action](argument)
            except Exception as exc:  # the model sees the error and can try something else
                observation = f"error: {exc}"
            s += f"Observation: {observation}\n"
        s["answer"] = None  # out of steps


def main(backend) -> dict:
    state = agent.run(question=QUESTION, backend=backend, temperature=0)
    print(f"Question: {QUESTION}")
    # The transcript of the assistant turn: the actions and the observations.
    print(state.messages()[-1]["content"].strip())
    print(f"Final answer: {state['answer'] or f'(none within {MAX_STEPS} steps)'}")
    return {"answer": state["answer"], "transcript": state.messages()[-1]["content"]}


if __name__ == "__main__":
    run_example(main, __doc__)
