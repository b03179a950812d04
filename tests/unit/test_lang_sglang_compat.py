"""SGLang's frontend behaviour, on a scripted backend (no model): calling a program runs it,
fork item assignment and per-branch lambdas, dtype regexes and stops, the options a gen sends,
run_batch's forms, global_config, separate_reasoning, streamed meta info, named templates."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import radixrt as rt
from radixrt.lang import ir
from radixrt.lang.backends.base import Backend
from radixrt.lang.chat_template import ChatTemplate
from radixrt.lang.named_templates import NAMES, named_template, template_name_for
from radixrt.lang.reasoning import split_reasoning
from radixrt.lang.stream_meta import StreamMeta


class Recorder(Backend):
    """Answers `reply(text)`; records every request. Streams `reply` in three chunks whose
    meta_info repeats every logprob so far (cumulative=True, as radixrt) or only the new ones
    (as SGLang's server), with one empty-text chunk between."""

    def __init__(
        self,
        reply=lambda text: "<ok>",
        cumulative: bool = True,
        template: ChatTemplate | None = None,
        delay=lambda text: 0.0,
    ) -> None:
        self.reply, self.cumulative, self.delay = reply, cumulative, delay
        self.template = template or ChatTemplate.plain()
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def _generate(self, text=None, sampling_params=None, **options):
        time.sleep(self.delay(text))
        with self._lock:
            self.calls.append({"text": text, "params": dict(sampling_params or {}), **options})
        meta = {
            "prompt_tokens": 3,
            "completion_tokens": 1,
            "cached_tokens": 0,
            "finish_reason": {"type": "stop"},
        }
        return {"text": self.reply(text), "meta_info": meta}

    def _generate_stream(self, text=None, sampling_params=None, **options):
        self._generate(text, sampling_params, **options)
        pieces, sent = ["ab", "", "c", "de"], []
        for i, piece in enumerate(pieces):
            new = [(-0.1 * (i + 1), i, None)]
            sent += new
            yield {
                "text": piece,
                "meta_info": {
                    "completion_tokens": i + 1,
                    "prompt_tokens": 3,
                    "cached_tokens": 0,
                    "finish_reason": None if i < 3 else {"type": "length"},
                    "output_token_logprobs": list(sent) if self.cumulative else new,
                },
            }

    def get_chat_template(self) -> ChatTemplate:
        return self.template

    def model_path(self) -> str:
        return "/models/SmolLM2-135M-Instruct.gguf"


@rt.function
def answer(s, question, suffix="?"):
    s += "Q: " + question + suffix + " A:" + rt.gen("a", max_tokens=4)


def test_calling_a_program_runs_it_and_inside_a_program_it_is_a_subprogram():
    backend = Recorder()
    state = answer(question="why", backend=backend, temperature=0)
    assert state["a"] == "<ok>" and backend.calls[0]["params"]["temperature"] == 0

    @rt.function
    def outer(s):
        answer(s, "how", suffix="!")
        s += " done"

    assert outer(backend=backend).text() == "Q: how! A:<ok> done"

    @rt.function
    def no_args(s):
        s += "x" + rt.gen("y")

    no_args(backend=backend).sync()
    assert backend.calls[-1]["text"] == "x"


def test_forks_take_items_back_and_a_lambda_per_branch():
    backend = Recorder(reply=lambda text: text[-1])

    @rt.function
    def prog(s):
        s += "start "
        forks = s.fork(3)
        forks += lambda i: f"b{i}"
        for i in range(3):
            forks[i] += rt.gen("g", max_tokens=1)
        forks.join()
        s += "|".join(forks[i]["g"] for i in range(3))

    assert prog.run(backend=backend).text() == "start 0|1|2"
    with pytest.raises(TypeError, match="cannot be replaced"):
        s = prog.run(backend=backend)
        group = s.fork(2)
        group[0] = group[1]


def test_dtype_gens_send_sglangs_regexes_and_stops():
    assert ir.REGEX_INT == r"[-+]?[0-9]+[ \n]*" and ir.REGEX_STRING == ir.REGEX_STR
    assert ir.REGEX_FLOAT == r"[-+]?[0-9]*\.?[0-9]+[ \n]*" and ir.REGEX_BOOL == "(True|False)"
    assert ir.REGEX_STR == r"\"[\w\d\s]*\""
    backend = Recorder(reply=lambda text: "1")

    @rt.function
    def prog(s):
        s += rt.gen("i", dtype=int, stop="x") + rt.gen("f", dtype="float")
        s += rt.gen("b", dtype=bool) + rt.gen_string("s") + rt.gen_int("j")

    prog.run(backend=backend, stop=["END"])
    params = [c["params"] for c in backend.calls]
    assert [p["regex"] for p in params] == [
        ir.REGEX_INT,
        ir.REGEX_FLOAT,
        ir.REGEX_BOOL,
        ir.REGEX_STR,
        ir.REGEX_INT,
    ]
    assert params[0]["stop"] == ["x", " ", "\n"]  # the gen's own stop, then the dtype's
    assert params[1]["stop"] == ["END", " ", "\n"]  # run's default stop, then the dtype's
    assert params[2]["stop"] == ["END"] and params[4]["stop"] == ["END", " ", "\n"]
    with pytest.warns(UserWarning, match="only dtype"):
        assert rt.gen("x", dtype=int, regex="a").params["regex"] == ir.REGEX_INT


def test_gen_and_run_pass_stop_regex_return_text_in_logprobs_and_n():
    backend = Recorder()

    @rt.function
    def prog(s):
        s += "a" + rt.gen("x", stop_regex=r"\d+", return_text_in_logprobs=True, return_logprob=True)
        s += rt.gen_int("y", stop_regex=["z"]) + rt.gen("w")

    prog.run(backend=backend, n=1, stop_regex="q", return_text_in_logprobs=False)
    first, second, third = backend.calls
    assert first["params"]["stop_regex"] == r"\d+" and first["return_text_in_logprobs"] is True
    assert second["params"]["stop_regex"] == ["z"] and third["params"]["stop_regex"] == "q"
    assert third["return_text_in_logprobs"] is False and third["params"]["n"] == 1
    assert first["params"]["skip_special_tokens"] is True
    assert first["params"]["spaces_between_special_tokens"] is True
    # Positional arguments in SGLang's order: name, max_tokens, min_tokens, n, stop, ...
    g = rt.gen("t", 8, 2, 1, ".", None, "re")
    assert g.params == {
        "max_new_tokens": 8,
        "min_new_tokens": 2,
        "n": 1,
        "stop": ".",
        "stop_regex": "re",
    }
    assert rt.gen_int("t", 5, 1, "x").params["stop"] == "x"


def test_run_batch_forms_generator_style_and_precache_switch():
    backend = Recorder(delay=lambda text: 0.3 if "slow" in text else 0.0)
    states = answer.run_batch(
        [["slow"], ("fast", "!"), {"question": "q"}],
        backend=backend,
        num_threads=3,
        temperature=0,
        stop_regex="x",
    )
    assert [s["a"] for s in states] == ["<ok>"] * 3
    assert states[1].text() == "Q: fast! A:<ok>"
    assert answer.run_batch([], backend=backend) == []
    with pytest.raises(TypeError, match="item 0 must be a dict"):
        answer.run_batch([[]], backend=backend)
    gen = answer.run_batch(
        [{"question": "slow"}, {"question": "fast"}], backend=backend, generator_style=True
    )
    assert not isinstance(gen, list)
    assert [s.text() for s in gen] == ["Q: slow? A:<ok>", "Q: fast? A:<ok>"]  # input order

    backend.calls.clear()
    rt.global_config.enable_precache_with_tracing = False
    try:
        answer.run_batch(
            [{"question": "a long question one"}, {"question": "a long question two"}],
            backend=backend,
        )
    finally:
        rt.global_config.enable_precache_with_tracing = True
    assert all(c["params"].get("max_new_tokens") != 0 for c in backend.calls)


def test_global_config_default_backend_verbosity_and_fields(capsys):
    backend = Recorder()
    rt.global_config.default_backend = backend
    try:
        assert rt.get_default_backend() is backend
        rt.global_config.verbosity = 2
        answer.run(question="v")
        assert "Q: v? A:<ok>" in capsys.readouterr().out
        rt.global_config.skip_special_tokens_in_output = False
        answer.run(question="w")
        assert backend.calls[-1]["params"]["skip_special_tokens"] is False
    finally:
        rt.global_config.verbosity = 0
        rt.global_config.skip_special_tokens_in_output = True
        rt.set_default_backend(None)
    assert rt.global_config.default_backend is None
    assert rt.flush_cache() is False and rt.get_server_info() is None
    with pytest.raises(AttributeError, match="no field 'verbose'.*verbosity"):
        rt.global_config.verbose = 1
    assert rt.__version__


def test_separate_reasoning_splits_the_turn():
    assert split_reasoning("<think>hm</think>42", "qwen3") == ("hm", "42")
    assert split_reasoning("42", "qwen3") == ("", "42")
    assert split_reasoning("hm</think>42", "deepseek-r1") == ("hm", "42")
    assert split_reasoning("still thinking", "deepseek-r1") == ("still thinking", "")
    backend = Recorder(reply=lambda text: "<think>2+2</think>4")

    @rt.function
    def prog(s, model_type="qwen3"):
        s += rt.user("sum?")
        s += rt.assistant(rt.separate_reasoning(rt.gen("a"), model_type=model_type))

    state = prog.run(backend=backend)
    assert state["a"] == "4" and state["a_reasoning_content"] == "2+2"
    assert state.text().endswith("assistant: 4\n")
    assert state.messages()[-1] == {"role": "assistant", "content": "4"}
    with pytest.raises(ValueError, match="model_type must be one of deepseek-r1, qwen3"):
        rt.separate_reasoning(rt.gen("a"), model_type="smollm")
    with pytest.raises(ValueError, match="has no known reasoning format"):
        prog.run(backend=backend, model_type=None)


def test_image_and_video_are_clear_errors():
    with pytest.raises(NotImplementedError, match="multimodal input is not supported"):
        rt.image("cat.png")
    with pytest.raises(NotImplementedError, match="multimodal input is not supported"):
        rt.video("cat.mp4", 4)


@pytest.mark.parametrize("cumulative", [True, False])
def test_streamed_meta_info_chunk_by_chunk(cumulative):
    backend = Recorder(cumulative=cumulative)

    @rt.function
    def prog(s):
        s += "x" + rt.gen("a", return_logprob=True)

    async def collect():
        state = prog(backend=backend, stream=True)
        return state, [p async for p in state.text_async_iter("a", return_meta_data=True)]

    state, pairs = asyncio.run(collect())
    assert [t for t, _ in pairs] == ["ab", "c", "de"]  # the empty chunk merged into "c"
    assert [len(m["output_token_logprobs"]) for _, m in pairs] == [1, 2, 1]
    assert [m["completion_tokens"] for _, m in pairs] == [1, 3, 4]
    assert [m["output_token_logprobs_length"] for _, m in pairs] == [1, 3, 4]
    final = state.get_meta_info("a")
    assert len(final["output_token_logprobs"]) == 4 and final["output_token_logprobs_length"] == 4
    with pytest.raises(ValueError, match="needs a var_name"):
        asyncio.run(anext(state.text_async_iter(return_meta_data=True)))


def test_stream_meta_folds_both_shapes():
    whole, delta = StreamMeta(), StreamMeta()
    for n in range(1, 4):
        lps = [(0.0, i, None) for i in range(n)]
        assert (
            whole.add({"completion_tokens": n, "output_token_logprobs": lps})[
                "output_token_logprobs"
            ]
            == lps[-1:]
        )
        delta.add({"completion_tokens": n, "output_token_logprobs": lps[-1:]})
    assert whole.total["output_token_logprobs"] == delta.total["output_token_logprobs"]


def test_named_templates_and_sglangs_model_path_matching():
    chatml = named_template("chatml")
    assert chatml.begin("user") == "<|im_start|>user\n" and chatml.stop_str == ("<|im_end|>",)
    qwen = named_template("qwen")
    assert qwen.default_system == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    assert named_template("default").begin("assistant") == "ASSISTANT:"
    assert {"chatml", "default", "llama-3-instruct", "qwen"} <= set(NAMES)
    with pytest.raises(ValueError, match="chat_template_name must be one of default"):
        named_template("nope")
    assert template_name_for("meta-llama/Meta-Llama-3-8B-Instruct") == "llama-3-instruct"
    assert template_name_for("Qwen/Qwen2-7B-Instruct") == "qwen"
    assert template_name_for("HuggingFaceTB/SmolLM2-135M-Instruct") == "default"
    backend = Recorder(template=chatml)

    @rt.function
    def prog(s):
        s += rt.user("hi") + rt.assistant(rt.gen("a", stop="\n"))

    prog.run(backend=backend)
    assert backend.calls[0]["params"]["stop"] == ["\n", "<|im_end|>"]


def test_api_speculative_execution_answers_later_gens_from_one_request():
    backend = Recorder(reply=lambda text: " Ann\nBirthday: May 1\nJob: cook\nmore")

    def character(s):
        s += "Name:" + rt.gen("name", stop="\n") + "\nBirthday:" + rt.gen("bday", stop="\n")
        s += "\nJob:" + rt.gen("job", stop="\n")

    spec = rt.function(num_api_spec_tokens=64)(character)
    backend.token_usage.reset()
    state = spec.run(backend=backend)
    assert (state["name"], state["bday"], state["job"]) == (" Ann", " May 1", " cook")
    assert len(backend.calls) == 1 and "stop" not in backend.calls[0]["params"]
    assert backend.calls[0]["params"]["max_new_tokens"] == 128
    assert backend.token_usage.prompt_tokens == 3
    rt.function(character).run(backend=backend)
    assert len(backend.calls) == 4 and backend.token_usage.prompt_tokens == 12
    backend.token_usage.reset()
    assert backend.token_usage.prompt_tokens == 0


def test_copy_is_also_sglangs_context_manager():
    backend = Recorder(reply=lambda text: "!")

    @rt.function
    def prog(s):
        s += "base"
        with s.copy() as c:
            c += rt.gen("x")
        s += "|" + s["x"][0]

    assert prog.run(backend=backend).text() == "base|!"
