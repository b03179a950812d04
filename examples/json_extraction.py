"""Structured extraction: JSON that follows a schema, and a single integer.

What it shows:
- `rt.gen("info", json_schema=SCHEMA)`: the output is constrained (by the engine's grammar
  support) to JSON matching the schema, so `json.loads` always works, even on a tiny model;
- `rt.gen_int("age")`: a one-field extraction constrained to an integer.

Run: python examples/json_extraction.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import json

from example_cli import run_example

import radixrt as rt

SENTENCE = "Maria Lopez is a 34-year-old nurse who lives in Madrid."
SCHEMA = {  # a dict, a JSON string or a pydantic model class all work
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@rt.function
def extract(s, sentence):
    s += rt.system("Extract facts about the person as JSON with keys name, age and city.")
    s += rt.user(sentence)
    s += rt.assistant(rt.gen("info", json_schema=SCHEMA, max_tokens=48))


@rt.function
def extract_age(s, sentence):
    s += rt.system("Extract facts about the person.")
    s += rt.user(sentence)
    # Lead in with "Age: " so that the model ends its turn after the number. (The regex allows
    # only digits: a model that wants to go on with " years old" must write more digits.)
    s += rt.assistant("Age: " + rt.gen_int("age", max_tokens=4))


def main(backend) -> dict:
    state = extract.run(sentence=SENTENCE, backend=backend, temperature=0)
    info = json.loads(state["info"])  # valid by construction (unless cut off by max_tokens)
    print(f"Sentence: {SENTENCE}")
    print(f"JSON: {state['info']}")
    print(f"Parsed: name={info['name']!r} age={info['age']!r} city={info['city']!r}")

    age = extract_age.run(sentence=SENTENCE, backend=backend, temperature=0)["age"]
    print(f"gen_int age: {int(age)}")
    return {"info": info, "age": int(age)}


if __name__ == "__main__":
    run_example(main, __doc__)
