"""--chat-template (issue 13, "Clients"): loading by path, shipped name and inline text; the
errors of a bad one (one line, exit 2); a tiny-model server launched with
`--chat-template chatml-tools` shows the tools to the model; SmolLM2's own template, which
ignores them, gets a warning in the server's log and a header on the response."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from radixrt.cli import main
from radixrt.entrypoints.openai.api import TOOLS_IGNORED, WARNING_HEADER
from radixrt.entrypoints.openai.chat_template import chat_prompt
from radixrt.entrypoints.openai.protocol import ChatCompletionRequest
from radixrt.entrypoints.openai.tool_calls import parse_tool_calls
from radixrt.frontend.chat_template_loader import SHIPPED_DIR, load_chat_template, shipped_names
from radixrt.server_args import ServerArgs

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


# -- loading --------------------------------------------------------------------------------
def test_a_shipped_name_a_path_and_inline_text_all_load(tmp_path):
    assert {"chatml-tools", "smollm2-tools"} <= set(shipped_names())
    shipped = (SHIPPED_DIR / "chatml-tools.jinja").read_text()
    assert load_chat_template("chatml-tools") == load_chat_template("chatml-tools.jinja")
    assert load_chat_template("chatml-tools") == shipped and "<tools>" in shipped
    path = tmp_path / "mine.jinja"
    path.write_text("{{ messages[0].content }}")
    assert load_chat_template(str(path)) == "{{ messages[0].content }}"
    inline = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert load_chat_template(inline) == inline  # Jinja text, as vLLM takes it
    long_inline = inline + "{# " + "x" * 5000 + " #}"  # longer than any file name
    assert load_chat_template(long_inline) == long_inline


@pytest.mark.parametrize("value", ["no-such-template", "/no/such/file.jinja", "chatml"])
def test_an_unknown_name_or_missing_file_names_the_flag_and_the_shipped_ones(value):
    with pytest.raises(ValueError, match="--chat-template") as err:
        ServerArgs(chat_template=value)
    assert all(name in str(err.value) for name in shipped_names()), err.value


def test_an_empty_file_is_refused(tmp_path):
    (tmp_path / "empty.jinja").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))


def test_launch_with_a_bad_template_is_one_line_and_exit_2(capsys):
    assert main(["launch", "--chat-template", "no-such-template"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--chat-template" in err and "chatml-tools" in err, err


# -- rendering ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir) -> str:
    return tiny_model_dir("llama", max_position_embeddings=2048)  # byte tokens: long prompts


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def _request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": ASK, **fields})


def test_chatml_tools_shows_the_tools_and_the_call_format(tokenizer):
    tokenizer.chat_template = load_chat_template("chatml-tools")
    ids, ignored = chat_prompt(tokenizer, _request(tools=TOOLS))
    text = tokenizer.decode(ids)
    assert not ignored
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert "<tool_call>" in text and text.endswith("<|im_start|>assistant\n"), text
    # Without tools it is plain ChatML; a past call renders in the format "auto" parses.
    plain, _ = chat_prompt(tokenizer, _request())
    assert tokenizer.decode(plain) == "<|im_start|>user\nWeather in Paris?<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather"}}
    call["function"]["arguments"] = '{"city": "Paris"}'
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}]
    ids, _ = chat_prompt(tokenizer, ChatCompletionRequest.model_validate({"messages": history}))
    turn = tokenizer.decode(ids).split("<|im_start|>assistant\n", 1)[1]
    parsed = parse_tool_calls(turn.split("<|im_end|>")[0], ("get_weather",))
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Paris"}')]


def test_a_template_that_ignores_tools_is_detected(tokenizer):
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert chat_prompt(tokenizer, _request(tools=TOOLS)).tools_ignored
    assert not chat_prompt(tokenizer, _request()).tools_ignored  # no tools: nothing to say


# -- servers --------------------------------------------------------------------------------
def _chat(server, **fields) -> httpx.Response:
    body = {"messages": ASK, "max_tokens": 1, **fields}
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp


def test_a_server_with_chatml_tools_shows_the_model_the_tools(launch_server, tiny_dir, tokenizer):
    server = launch_server("--model-path", tiny_dir, "--chat-template", "chatml-tools")
    shipped = load_chat_template("chatml-tools")
    info = httpx.get(server.url + "/model_info", timeout=30).json()
    assert info["chat_template"] == shipped
    tokenizer.chat_template = shipped
    resp = _chat(server, tools=TOOLS)
    assert WARNING_HEADER not in resp.headers
    expected = chat_prompt(tokenizer, _request(tools=TOOLS)).ids  # one token per byte
    assert resp.json()["usage"]["prompt_tokens"] == len(expected)
    without = _chat(server).json()["usage"]["prompt_tokens"]
    assert len(expected) - without > len(str(TOOLS))  # the tools' JSON is in the prompt
    tokens = httpx.post(server.url + "/tokenize", json={"messages": ASK}, timeout=30).json()
    assert tokens["count"] == without  # /tokenize renders with the same template
    assert "does not render `tools`" not in server.log_text()


def test_smollm2_s_own_template_warns_that_it_ignores_tools(server):
    first = _chat(server, tools=TOOLS)
    assert first.headers[WARNING_HEADER] == TOOLS_IGNORED
    _chat(server, tools=TOOLS, tool_choice="none")
    assert WARNING_HEADER not in _chat(server).headers
    assert server.log_text().count(TOOLS_IGNORED) == 1  # once per server
