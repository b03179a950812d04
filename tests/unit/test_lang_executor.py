"""The program executor's semantics on a scripted backend (no model): ordering, waiting,
errors, forks, streaming and thread lifetimes."""

from __future__ import annotations

import threading
import time

import pytest

import radixrt as rt
from radixrt.lang.backends.base import Backend
from radixrt.lang.chat_template import ChatTemplate


class ScriptedBackend(Backend):
    """Answers every gen with "<N>" (N counts calls); a prompt containing "FAIL" raises."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[dict] = []
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def _generate(self, text=None, sampling_params=None, **options):
        if text and "FAIL" in text:
            raise ValueError("sampling param 'temperature' must be >= 0")
        time.sleep(self.delay_s)
        with self._lock:
            self.calls.append({"text": text, "params": sampling_params, **options})
            n = len(self.calls)
        meta = {
            "prompt_tokens": len(text or ""),
            "completion_tokens": 1,
            "cached_tokens": 0,
            "finish_reason": {"type": "length"},
        }
        return {"text": f"<{n}>", "meta_info": meta}

    def _generate_stream(self, text=None, sampling_params=None, **options):
        result = self._generate(text, sampling_params, **options)
        for piece in ("a", "b", result["text"]):
            yield {"text": piece, "meta_info": result["meta_info"]}

    def get_chat_template(self) -> ChatTemplate:
        return ChatTemplate.plain()


@pytest.fixture
def backend():
    return ScriptedBackend()


def test_gen_sees_the_text_before_it_and_defaults_merge(backend):
    @rt.function(temperature=0)
    def prog(s):
        s += "Q:" + rt.gen("a", max_tokens=3) + " R:" + rt.gen("b")

    state = prog.run(backend=backend, max_new_tokens=9)
    assert state.text() == "Q:<1> R:<2>"
    assert [c["text"] for c in backend.calls] == ["Q:", "Q:<1> R:"]
    assert backend.calls[0]["params"]["max_new_tokens"] == 3
    assert backend.calls[1]["params"]["max_new_tokens"] == 9
    assert backend.calls[1]["params"]["temperature"] == 0


def test_reading_a_variable_never_produced_fails_instead_of_hanging(backend):
    @rt.function
    def prog(s):
        s += "x" + rt.gen("a")
        s += s["b"]

    with pytest.raises(KeyError, match="'b' was never produced.*its variables: a"):
        prog.run(backend=backend)


def test_a_failed_gen_skips_the_rest_and_raises_from_run(backend):
    @rt.function
    def prog(s):
        s += "FAIL" + rt.gen("a") + rt.gen("b")

    with pytest.raises(ValueError, match="temperature"):
        prog.run(backend=backend)
    assert backend.calls == []


def test_fork_branches_run_side_by_side_and_join_gathers():
    backend = ScriptedBackend(delay_s=0.3)

    @rt.function
    def prog(s):
        s += "start"
        forks = s.fork(4)
        forks += rt.gen("idea")
        forks.join()

    start = time.monotonic()
    state = prog.run(backend=backend)
    assert time.monotonic() - start < 4 * 0.3  # the four branches overlapped
    assert sorted(state["idea"]) == ["<2>", "<3>", "<4>", "<5>"]  # <1>: the prefix prefill
    assert backend.calls[0]["params"] == {"max_new_tokens": 0}
    assert state.text() == "start"


def test_a_failed_branch_raises_from_join(backend):
    @rt.function
    def prog(s):
        s += "go "
        forks = s.fork(2)
        forks += ["fine", "FAIL"]
        forks += rt.gen("x")
        forks.join()

    with pytest.raises(ValueError, match="temperature"):
        prog.run(backend=backend)


def test_streaming_yields_pieces_and_threads_end(backend):
    before = threading.active_count()

    @rt.function
    def prog(s):
        s += "Q:" + rt.gen("a")

    state = prog.run(backend=backend, stream=True)
    assert list(state.text_iter("a")) == ["a", "b", "<1>"]
    assert state["a"] == "ab<1>"
    state.sync()
    for _ in range(50):  # the worker exits right after its last expression
        if threading.active_count() == before:
            break
        time.sleep(0.01)
    assert threading.active_count() == before


def test_appending_after_the_end_is_refused(backend):
    @rt.function
    def prog(s):
        s += "x"

    state = prog.run(backend=backend)
    with pytest.raises(RuntimeError, match="has ended"):
        state += "more"


def test_run_batch_keeps_each_programs_error(backend):
    @rt.function
    def prog(s, text):
        s += text + rt.gen("a")

    states = prog.run_batch([{"text": "ok"}, {"text": "FAIL"}, {"text": "fine"}], backend=backend)
    assert states[0]["a"].startswith("<") and states[2]["a"].startswith("<")
    assert isinstance(states[1].error(), ValueError)
    with pytest.raises(ValueError):
        states[1].text()


def test_run_batch_precaches_the_common_leading_text(backend):
    @rt.function
    def prog(s, q):
        s += "A long shared instruction for everyone. " + q + rt.gen("a")

    states = prog.run_batch([{"q": "one"}, {"q": "two"}], backend=backend)
    assert backend.calls[0]["text"] == "A long shared instruction for everyone. "
    assert backend.calls[0]["params"] == {"max_new_tokens": 0}
    assert states.get_meta_info()["num_requests"] == 3


def test_no_default_backend_is_a_clear_error():
    rt.set_default_backend(None)

    @rt.function
    def prog(s):
        s += "x"

    with pytest.raises(RuntimeError, match="set_default_backend"):
        prog.run()
