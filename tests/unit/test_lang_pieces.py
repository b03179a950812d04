"""The DSL's pure pieces: IR construction and its errors, the three choices methods on
constructed logprobs, and chat-template role rendering."""

from __future__ import annotations

import json

import pytest

import radixrt as rt
from radixrt.lang import ir
from radixrt.lang.chat_template import ChatTemplate
from radixrt.lang.choices import METHODS, decide, greedy_winner

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nDefault prompt<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
)


def test_gen_keeps_only_what_the_caller_set():
    g = rt.gen("x", max_tokens=5, stop="\n", temperature=0)
    assert isinstance(g, ir.Gen) and g.name == "x"
    assert g.params == {"max_new_tokens": 5, "stop": "\n", "temperature": 0}


def test_gen_constraints():
    assert rt.gen_int("n").params["regex"] == ir.REGEX_INT
    assert rt.gen_string("w").params["regex"] == ir.REGEX_STRING
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(rt.gen("j", json_schema=schema).params["json_schema"]) == schema
    with pytest.raises(ValueError, match="at most one of regex and json_schema"):
        rt.gen("j", regex="a", json_schema="{}")
    with pytest.raises(ValueError, match="dtype must be one of int, float, bool, str"):
        rt.gen("j", dtype=complex)
    with pytest.raises(TypeError, match="json_schema must be"):
        rt.gen("j", json_schema=3)


def test_gen_with_choices_is_a_select():
    s = rt.gen("c", choices=["a", "b"], choices_method=rt.greedy_token_selection)
    assert isinstance(s, ir.Select) and s.choices_method == "greedy_token_selection"


def test_select_validates_its_arguments():
    with pytest.raises(ValueError, match="choices must be a non-empty list"):
        rt.select("c", [])
    with pytest.raises(ValueError, match="choices_method must be one of token_length_normalized"):
        rt.select("c", ["a"], choices_method="best")
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        rt.select("c", ["a"], temperature=-1)


def test_concatenation_flattens():
    expr = "a" + rt.gen("x") + rt.user("q")
    kinds = [type(e).__name__ for e in expr.items]
    assert kinds == ["Text", "Gen", "RoleBegin", "Text", "RoleEnd"]
    with pytest.raises(TypeError, match="cannot append a dict"):
        ir.to_expr({})


# Choice 0: best first token, poor rest. Choice 1: best mean. Choice 2: likely only in context
# (its unconditional logprobs are very low), mediocre otherwise. A first token has no
# unconditional logprob (None, counted as 0).
CONDITIONAL = [[-0.1, -5.0, -5.0], [-1.0, -0.5], [-2.0, -1.5]]
UNCONDITIONAL = [[None, -4.0, -4.0], [None, -0.2], [None, -9.0]]


@pytest.mark.parametrize(
    "method, expected",
    [
        ("token_length_normalized", 1),
        ("greedy_token_selection", 0),
        ("unconditional_likelihood_normalized", 2),
    ],
)
def test_each_method_picks_its_best_choice(method, expected):
    scores = METHODS[method].scores(CONDITIONAL, UNCONDITIONAL)
    assert decide(scores, temperature=0) == expected


def test_greedy_breaks_ties_on_later_tokens_and_prefers_the_first_of_equals():
    assert greedy_winner([[-1.0, -3.0], [-1.0, -2.0], [-2.0]]) == 1
    assert greedy_winner([[-1.0], [-1.0]]) == 0
    # A shorter choice counts its mean where it has no token: -1.0 beats -3.0 at position 1.
    assert greedy_winner([[-1.0, -3.0], [-1.0]]) == 1


def test_sampled_select_follows_the_scores():
    import random

    rng = random.Random(0)
    picks = [decide([0.0, -50.0], temperature=1.0, rng=rng) for _ in range(50)]
    assert picks == [0] * 50
    picks = {decide([0.0, 0.0], temperature=1.0, rng=rng) for _ in range(50)}
    assert picks == {0, 1}


def test_chatml_roles_and_default_system_prompt():
    t = ChatTemplate.from_jinja(CHATML)
    assert t.begin("user") == "<|im_start|>user\n" and t.end("user") == "<|im_end|>\n"
    assert t.begin("assistant") == "<|im_start|>assistant\n"
    assert t.default_system == "<|im_start|>system\nDefault prompt<|im_end|>\n"
    assert t.default_system_prompt == "Default prompt"
    with pytest.raises(ValueError, match="role must be one of system, user, assistant"):
        t.begin("tool")


def test_llama3_style_template_keeps_bos_once():
    t = ChatTemplate.from_jinja(LLAMA3, bos_token="<s>")
    assert t.begin("system") == "<s><|start_header_id|>system<|end_header_id|>\n\n"
    assert t.begin("user") == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert t.default_system == "<s>" and t.default_system_prompt is None


def test_no_template_falls_back_to_plain_roles():
    t = ChatTemplate.from_jinja(None)
    assert t.begin("user") == "user: " and t.end("user") == "\n"


def test_trace_gives_the_ir_with_placeholders():
    @rt.function
    def qa(s, question, n, suffix=""):
        s += rt.user(question + suffix)
        s += rt.assistant(rt.gen("answer", max_tokens=n))
        s += "You said: " + s["answer"]

    assert qa.bind(n=2).trace().nodes[4].params == {"max_new_tokens": 2}
    program = qa.trace(n=4)
    kinds = [type(node).__name__ for node in program.nodes]
    assert kinds == ["RoleBegin", "Text", "RoleEnd", "RoleBegin", "Gen", "RoleEnd", "Text"]
    assert program.nodes[1].value == "{question}"
    assert program.nodes[4].params == {"max_new_tokens": 4}
    assert program.nodes[-1].value == "You said: {answer}"
    assert "Gen(name='answer'" in str(program)
    leading = program.leading_text(ChatTemplate.from_jinja(CHATML))
    assert leading.endswith("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def test_lang_names_are_reexported_by_radixrt():
    import radixrt.lang

    for name in radixrt.lang.__all__:
        assert getattr(rt, name) is getattr(radixrt.lang, name)
    assert "gen" in dir(rt)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = rt.nonexistent


def test_bind_and_argument_errors():
    @rt.function
    def prog(s, a, b):
        s += a + b

    bound = prog.bind(a="x")
    assert bound.bind_arguments == {"a": "x"}
    with pytest.raises(TypeError, match="unknown arguments"):
        prog.bind(c=1)
    with pytest.raises(TypeError, match="unknown sampling defaults"):
        rt.function(temprature=0)(lambda s: None)


def test_endpoint_reaches_a_wildcard_bound_frontend_at_the_url_host():
    from radixrt.lang.backends.runtime_endpoint import _reachable

    assert _reachable("tcp://0.0.0.0:5555", "http://10.1.2.3:30000") == "tcp://10.1.2.3:5555"
    assert _reachable("tcp://127.0.0.1:5555", "http://localhost:1") == "tcp://127.0.0.1:5555"
    assert _reachable("tcp://[::]:5555", "http://[::1]:30000") == "tcp://[::1]:5555"
