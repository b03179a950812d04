"""The DSL against references: the text a program builds is what the chat API builds (the
model's template through transformers), its answers are what /generate gives for those
prompts, select's scores are the prompt logprobs /generate returns, and a client needs only
the light dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import httpx
import pytest

import radixrt as rt


@pytest.fixture(scope="module")
def hf_tokenizer(default_tokenizer):
    return default_tokenizer


def http_generate(server, text: str, max_new_tokens: int, **extra) -> dict:
    body = {
        "text": text,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens},
        **extra,
    }
    resp = httpx.post(server.url + "/generate", json=body, timeout=120)
    resp.raise_for_status()
    return resp.json()


@rt.function
def two_turns(s, q1, q2):
    s += rt.system("You answer in one sentence.")
    s += rt.user(q1)
    s += rt.assistant(rt.gen("a1", max_tokens=16))
    s += rt.user(q2)
    s += rt.assistant(rt.gen("a2", max_tokens=16))


def test_program_equals_chat_template_and_generate(lang_server, endpoint, hf_tokenizer):
    q1, q2 = "What is the capital of Italy?", "And of Spain?"
    state = two_turns.run(q1=q1, q2=q2, temperature=0, backend=endpoint)

    def prompt(messages):
        return hf_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    messages = [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": q1},
    ]
    a1 = http_generate(lang_server, prompt(messages), 16)["text"]
    messages += [{"role": "assistant", "content": a1}, {"role": "user", "content": q2}]
    a2 = http_generate(lang_server, prompt(messages), 16)["text"]
    messages += [{"role": "assistant", "content": a2}]
    assert (state["a1"], state["a2"]) == (a1, a2)
    assert state.text() == hf_tokenizer.apply_chat_template(messages, tokenize=False)
    assert state.messages() == messages


def test_select_scores_are_the_choices_prompt_logprobs(lang_server, endpoint):
    @rt.function
    def pick(s):
        s += rt.user("Which animal barks? Answer with one word.")
        s += rt.assistant(rt.select("animal", ["dog", "cat", "fish tank"]))

    state = pick.run(backend=endpoint)
    meta = state.get_meta_info("animal")
    prefix = state.text()[: -len(state["animal"] + "<|im_end|>\n")]
    n_prefix = http_generate(lang_server, prefix, 0)["meta_info"]["prompt_tokens"]
    expected = []
    for choice in ["dog", "cat", "fish tank"]:
        out = http_generate(
            lang_server, prefix + choice, 0, return_logprob=True, logprob_start_len=n_prefix
        )
        lps = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]]
        expected.append(sum(lps) / len(lps))
    assert meta["scores"] == pytest.approx(expected, abs=1e-4)
    assert state["animal"] == ["dog", "cat", "fish tank"][expected.index(max(expected))]


def test_a_client_imports_no_torch(lang_server):
    code = textwrap.dedent(f"""
        import sys
        import radixrt as rt
        @rt.function
        def prog(s):
            s += "One, two," + rt.gen("x", max_tokens=3)
        rt.set_default_backend(rt.RuntimeEndpoint({lang_server.url!r}))
        state = prog.run(temperature=0)
        assert state["x"], state.text()
        assert rt.get_server_info()["max_total_num_tokens"] > 0
        heavy = [m for m in ("torch", "transformers", "triton") if m in sys.modules]
        assert not heavy, heavy
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_runtime_starts_serves_checks_the_key_reports_death_and_stops():
    runtime = rt.Runtime(dtype="float32", max_total_tokens=4096, api_key="sesame")
    try:
        with pytest.raises(PermissionError, match="refused the API key"):
            rt.RuntimeEndpoint(runtime.url)
        with pytest.raises(PermissionError, match="refused the API key"):
            rt.RuntimeEndpoint(runtime.url, api_key="wrong")
        rt.set_default_backend(runtime)
        state = two_turns.run(q1="Hi!", q2="Bye!", max_new_tokens=4, temperature=0)
        assert state["a2"] and rt.get_server_info()["zmq_frontend_address"]
        assert rt.flush_cache() is True
        # SGLang's Runtime shape: .url, .endpoint (a RuntimeEndpoint), accepted by the helpers.
        assert runtime.endpoint.get_model_name() == runtime.model_info["model_path"]
        assert isinstance(runtime.endpoint, rt.RuntimeEndpoint) and runtime.url.startswith("http")
        assert rt.get_server_info(runtime)["port"] and rt.flush_cache(runtime) is True
        assert rt.global_config.default_backend.endpoint is runtime
        runtime.process.kill()  # the server dies under a running program
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="is gone"):
            two_turns.run(q1="Hi!", q2="Bye!", max_new_tokens=4)
        assert time.monotonic() - start < 30
    finally:
        rt.set_default_backend(None)
        runtime.shutdown()
    assert runtime.process.poll() is not None
