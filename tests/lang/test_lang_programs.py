"""Every DSL primitive on a real server over ZeroMQ; the tests taking `backend` also run on the
in-process backend (both share everything above the two request primitives)."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest

import radixrt as rt


@rt.function
def qa(s, question):
    s += rt.system("You are a terse assistant.")
    s += rt.user(question)
    s += rt.assistant(rt.gen("answer", max_tokens=12, stop="\n"))


def test_gen_fills_variables_text_messages_and_meta_info(backend):
    state = qa.run(question="What is the capital of France?", temperature=0, backend=backend)
    answer = state["answer"]
    assert answer and "\n" not in answer
    assert state.text().endswith(answer + "<|im_end|>\n")
    assert state.messages() == [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": answer},
    ]
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] > 10 and 0 < meta["completion_tokens"] <= 12
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert state.get_meta_info()["num_requests"] == 1


def test_role_context_managers_var_scope_and_set_var(endpoint):
    @rt.function
    def prog(s):
        with s.user():
            s += "Say hi."
        with s.assistant(), s.var_scope("reply"):
            s += "Hello" + rt.gen("rest", max_tokens=3)
        s["note"] = "mine"

    state = prog.run(temperature=0, backend=endpoint)
    assert state["reply"] == "Hello" + state["rest"]
    assert state.get_var("note") == "mine"
    # The first turn is not a system turn: the template's default system prompt comes first.
    assert state.messages()[0]["role"] == "system"
    assert state.messages()[-1] == {"role": "assistant", "content": state["reply"]}


def test_run_defaults_and_gen_override(endpoint):
    @rt.function
    def prog(s):
        s += "Count: one, two," + rt.gen("a") + "\nAgain:"
        s += rt.gen("b", max_tokens=2, return_logprob=True, top_logprobs_num=3)

    state = prog.run(max_new_tokens=4, temperature=0, ignore_eos=True, backend=endpoint)
    assert state.get_meta_info("a")["completion_tokens"] == 4
    meta = state.get_meta_info("b")
    assert meta["completion_tokens"] == 2 and len(meta["output_token_logprobs"]) == 2
    assert [len(top) for top in meta["output_top_logprobs"]] == [3, 3]
    assert "output_token_logprobs" not in state.get_meta_info("a")


def test_n_samples_give_a_list(endpoint):
    @rt.function
    def prog(s):
        s += "A random word:" + rt.gen("w", max_tokens=4, n=3, temperature=1.0)

    state = prog.run(backend=endpoint, seed=7)
    assert isinstance(state["w"], list) and len(state["w"]) == 3
    assert prog.run(backend=endpoint, seed=7)["w"] == state["w"]  # seeded: reproducible
    assert state.text().endswith(state["w"][0])
    assert len(state.get_meta_info("w")) == 3


def test_fork_prefills_the_shared_prefix_once(backend):
    @rt.function
    def tot(s):
        s += rt.user("Give three short ideas for a weekend. " * 4)
        s += rt.assistant_begin()
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Idea {i + 1}:" + rt.gen("idea", max_tokens=6)
        forks.join()
        s += rt.assistant_end()

    backend.flush_cache()
    state = tot.run(temperature=0, backend=backend)
    log = state.stream_executor.log.requests
    prefills = [m for m in log if m["completion_tokens"] == 0]
    assert len(prefills) == 1  # the prefix, committed once before the branches
    prefix_tokens = prefills[0]["prompt_tokens"]
    branches = state.get_meta_info("idea")
    assert len(state["idea"]) == 3 and len(branches) == 3
    for meta in branches:  # every branch found the prefix (but its last token) in the cache
        assert meta["cached_tokens"] >= prefix_tokens - 1
    assert state.get_meta_info()["cache_hit_rate"] > 0.5


def test_join_concate_and_append_copy_and_nested_programs(endpoint):
    @rt.function
    def heading(s, title):
        s += title + ":"

    @rt.function
    def prog(s):
        heading(s, "List")
        forks = s.fork(2)
        forks += [" apples", " pears"]
        forks.join("concate_and_append")
        other = s.copy()
        other += " and more"
        s += "."
        return other

    state = prog.run(backend=endpoint)
    assert state.text() == "List: apples pears."
    assert state.ret_value.text() == "List: apples pears and more"


def test_streaming_text_iter_and_async_iter(backend):
    state = qa.run(
        question="Tell me about the sea.",
        stream=True,
        max_new_tokens=12,
        temperature=0,
        backend=backend,
    )
    pieces = list(state.text_iter("answer"))
    assert len(pieces) > 1 and "".join(pieces) == state["answer"]
    assert "".join(state.text_iter()) == state.text()

    async def collect():
        st = qa.run(
            question="Tell me about the sea.",
            stream=True,
            max_new_tokens=12,
            temperature=0,
            backend=backend,
        )
        return [p async for p in st.text_async_iter("answer")], st

    pieces2, state2 = asyncio.run(collect())
    assert "".join(pieces2) == state2["answer"] == state["answer"]


def test_run_batch_matches_single_runs_and_caches_the_common_prefix(endpoint):
    questions = ["What is 2+2?", "Name a color.", "Name a fruit.", "What is ice?"]
    endpoint.flush_cache()
    states = qa.run_batch(
        [{"question": q} for q in questions],
        temperature=0,
        num_threads=4,
        progress_bar=True,
        backend=endpoint,
    )
    assert len(states.prefix_metas) == 1  # the shared system turn, prefilled once
    for q, state in zip(questions, states, strict=True):
        assert state["answer"] == qa.run(question=q, temperature=0, backend=endpoint)["answer"]
    summary = states.get_meta_info()
    assert summary["num_requests"] == 5 and summary["cache_hit_rate"] > 0.3


def test_gen_regex_json_schema_int_and_string(endpoint):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }

    @rt.function
    def extract(s):
        s += rt.user("Alice is 31 years old. Give her name and age as JSON.")
        s += rt.assistant(rt.gen("info", json_schema=schema, max_tokens=40))
        s += "Phone: " + rt.gen("phone", regex=r"\d{3}-\d{4}", max_tokens=12)
        s += "\nAge: " + rt.gen_int("age", max_tokens=4) + "\nName: "
        s += rt.gen_string("name", max_tokens=12)

    import json

    import jsonschema

    for _ in range(3):  # sampled at temperature 1.0: the constraints still hold
        state = extract.run(temperature=1.0, backend=endpoint)
        jsonschema.validate(json.loads(state["info"]), schema)
        assert re.fullmatch(r"\d{3}-\d{4}", state["phone"])
        assert re.fullmatch(r"[-+]?[0-9]+", state["age"])  # its stops " ", "\n" trimmed
        if state.get_meta_info("name")["finish_reason"]["type"] != "length":
            assert re.fullmatch(rt.lang.ir.REGEX_STR, state["name"])


def test_errors_surface_from_run_and_reads(backend):
    before = threading.active_count()

    @rt.function
    def bad_argument(s):
        s += "x" + rt.gen("a", max_tokens=-1)

    with pytest.raises(ValueError, match="max_new_tokens' must be >= 0, got -1"):
        bad_argument.run(backend=backend)

    @rt.function
    def broken(s):
        s += "x" + rt.gen("a", max_tokens=1)
        raise RuntimeError("the program's own bug")

    with pytest.raises(RuntimeError, match="the program's own bug"):
        broken.run(backend=backend)

    state = qa.run(question="hi", max_new_tokens=2, backend=backend)
    with pytest.raises(KeyError, match="'missing' was never produced.*answer"):
        state["missing"]
    with pytest.raises(TypeError, match=r"qa\(\): unexpected arguments \['questoin'\]"):
        qa.run(questoin="hi", backend=backend)

    states = qa.run_batch(
        [{"question": "hi"}, {"question": "hey"}],
        max_new_tokens=2,
        temperature=-3.0,
        backend=backend,
    )
    for st in states:
        assert isinstance(st.error(), ValueError)
        with pytest.raises(ValueError, match="temperature"):
            st["answer"]
    assert threading.active_count() == before  # no program thread outlives its program
