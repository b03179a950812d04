"""SGLang's frontend API on a real `radixrt launch` (the session's float32 server), over ZeroMQ
and over HTTP `POST /generate` (transport="http", the path a real SGLang server takes)."""

from __future__ import annotations

import asyncio
import re

import pytest

import radixrt as rt


@pytest.fixture(scope="module")
def http_endpoint(lang_server) -> rt.RuntimeEndpoint:
    backend = rt.RuntimeEndpoint(lang_server.url, transport="http")
    yield backend
    backend.shutdown()


@pytest.fixture(params=["zmq", "http"])
def remote(request, endpoint, http_endpoint) -> rt.RuntimeEndpoint:
    return endpoint if request.param == "zmq" else http_endpoint


@rt.function
def capital(s, country):
    s += "Q: What is the capital of France?\nA: Paris\n"
    s += (
        "Q: What is the capital of " + country + "?\nA:" + rt.gen("answer", max_tokens=6, stop="\n")
    )


def test_transports_are_the_ones_asked_for(endpoint, http_endpoint):
    assert endpoint.transport == "zmq" and http_endpoint.transport == "http"


def test_calling_a_program_is_run_on_both_transports(remote, endpoint):
    called = capital(country="Italy", temperature=0, backend=remote)
    ran = capital.run(country="Italy", temperature=0, backend=endpoint)
    assert called["answer"] == ran["answer"] and called.text() == ran.text()
    assert called.get_meta_info("answer")["completion_tokens"] > 0


def test_forks_item_append_and_lambda_then_concatenate(remote):
    @rt.function
    def prog(s):
        s += "Facts about colors.\n"
        forks = s.fork(2)
        forks += lambda i: f"Color {i}:"
        for i in range(2):
            forks[i] += rt.gen("c", max_tokens=4, stop="\n")
        forks.join(mode="concate_and_append")
        s += "\nDone"

    state = prog.run(temperature=0, backend=remote)
    assert re.search(r"Color 0:.*Color 1:.*\nDone$", state.text(), re.S)


def test_dtype_gens_give_values_of_their_type(remote):
    @rt.function
    def prog(s):
        s += "Q: How many legs does a cat have?\nA: " + rt.gen("i", dtype=int) + "\n"
        s += "Q: What is pi to two decimals?\nA: " + rt.gen("f", dtype=float) + "\n"
        s += "Q: Is water wet? Answer True or False.\nA: " + rt.gen("b", dtype=bool) + "\n"
        s += "Q: Name a fruit in quotes.\nA: " + rt.gen("s", dtype=str, max_tokens=8) + "\n"
        s += "Q: How many days are in a week?\nA: " + rt.gen_int("j") + "\n"

    state = prog.run(temperature=0, max_new_tokens=12, backend=remote)
    int(state["i"]), float(state["f"]), int(state["j"])
    assert state["b"] in ("True", "False")
    assert re.fullmatch(r'"[\w\s]*"?', state["s"])
    assert not state["i"].endswith((" ", "\n"))  # the dtype's stops are trimmed


def test_stop_regex_ends_the_text_without_the_match(remote):
    @rt.function
    def prog(s):
        s += "Count from one: 1, 2, 3, 4," + rt.gen("rest", max_tokens=20, stop_regex=r"[7-9]")

    state = prog.run(temperature=0, backend=remote)
    assert not re.search(r"[7-9]", state["rest"]), state["rest"]
    assert state.get_meta_info("rest")["finish_reason"]["type"] == "stop"


def test_return_text_in_logprobs_and_logprob_length(remote):
    @rt.function
    def prog(s):
        s += "The sky is" + rt.gen(
            "x", max_tokens=4, return_logprob=True, return_text_in_logprobs=True
        )

    state = prog.run(temperature=0, backend=remote)
    meta = state.get_meta_info("x")
    triples = meta["output_token_logprobs"]
    assert meta["output_token_logprobs_length"] == len(triples) == meta["completion_tokens"]
    assert all(isinstance(t[2], str) for t in triples)
    assert "".join(t[2] for t in triples) == state["x"]


def test_run_takes_n_and_run_batch_yields_as_a_generator(remote):
    @rt.function
    def prog(s, topic):
        s += "A word about " + topic + ":" + rt.gen("w", max_tokens=3)

    state = prog.run(topic="rain", n=2, temperature=1.0, backend=remote)
    assert isinstance(state["w"], list) and len(state["w"]) == 2
    items = [{"topic": t} for t in ("sun", "snow", "wind")]
    rows = prog.run_batch(items, temperature=0, backend=remote, generator_style=True, num_threads=2)
    assert not isinstance(rows, list)
    texts = [st.text() for st in rows]
    assert [t.split(":")[0] for t in texts] == ["A word about " + i["topic"] for i in items]
    assert texts == [st.text() for st in prog.run_batch(items, temperature=0, backend=remote)]


def test_global_config_backend_and_verbosity(remote, capsys):
    rt.global_config.default_backend = remote
    rt.global_config.verbosity = 2
    try:
        assert rt.get_default_backend() is remote
        state = capital(country="Spain", temperature=0)
        assert state.text() in capsys.readouterr().out
    finally:
        rt.global_config.verbosity = 0
        rt.set_default_backend(None)


def test_streamed_logprobs_chunk_by_chunk_as_sglangs_test(remote):
    @rt.function
    def qa(s, question):
        s += rt.system("You are a helpful assistant.")
        s += rt.user(question)
        s += rt.assistant(rt.gen("answer", return_logprob=True))

    async def collect():
        state = qa(
            question="Describe Hawaii.",
            stream=True,
            temperature=0,
            max_new_tokens=16,
            backend=remote,
        )
        return state, [p async for p in state.text_async_iter("answer", return_meta_data=True)]

    state, chunks = asyncio.run(collect())
    assert len(chunks) > 1
    prev = 0
    for text, meta in chunks:
        assert text
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - prev
        prev = meta["completion_tokens"]
    assert "".join(t for t, _ in chunks) == state["answer"]
    final = state.get_meta_info("answer")
    assert len(final["output_token_logprobs"]) == final["completion_tokens"] == prev


def test_select_and_errors_over_both_transports(remote):
    @rt.function
    def pick(s):
        s += "Is the sun hot? Answer:" + rt.select("a", ["Yes", "No"])

    assert pick.run(backend=remote)["a"] in ("Yes", "No")

    @rt.function
    def bad(s):
        s += "x" + rt.gen("a", max_tokens=-1)

    with pytest.raises(ValueError, match="max_new_tokens"):
        bad.run(backend=remote)


def test_endpoint_methods_as_sglangs(remote, lang_server):
    assert remote.get_model_name() == remote.model_info["model_path"]
    assert remote.endpoint is remote and remote.is_chat_model is False
    assert remote.chat_template_name is None  # the model's own template
    info = remote.get_server_info()
    assert "zmq_frontend_address" in info and rt.get_server_info(remote) == info
    assert remote.flush_cache() is True and rt.flush_cache(remote) is True
    meta = remote.cache_prefix("A prefix worth caching for later requests.")
    assert meta["prompt_tokens"] > 5
    assert remote.uncache_prefix("any") is None
    chatml = rt.RuntimeEndpoint(
        lang_server.url, chat_template_name="chatml", transport=remote.transport
    )
    try:
        assert chatml.chat_template_name == "chatml"
        assert chatml.get_chat_template().begin("user") == "<|im_start|>user\n"
        state = capital(country="Peru", temperature=0, backend=chatml)
        assert state["answer"]
    finally:
        chatml.shutdown()
    with pytest.raises(ValueError, match="chat_template_name must be one of"):
        rt.RuntimeEndpoint(lang_server.url, chat_template_name="nope")
    with pytest.raises(ValueError, match="transport must be one of auto, zmq, http"):
        rt.RuntimeEndpoint(lang_server.url, transport="grpc")


def test_separate_reasoning_and_multimodal_errors(endpoint):
    @rt.function
    def prog(s, model_type):
        s += rt.user("Say hi.")
        s += rt.assistant(rt.separate_reasoning(rt.gen("a", max_tokens=4), model_type))

    state = prog.run(model_type="qwen3", temperature=0, backend=endpoint)
    assert state["a_reasoning_content"] == "" and state["a"]
    with pytest.raises(ValueError, match="has no known reasoning format; give model_type="):
        prog.run(model_type=None, temperature=0, backend=endpoint)
    with pytest.raises(NotImplementedError, match="multimodal"):
        rt.user(rt.image("example_image.png") + "describe")
