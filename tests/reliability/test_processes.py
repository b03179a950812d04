"""The server's processes under faults, each test on a server of its own (it kills or stops it):
kill -9 of `radixrt launch` takes its children (and their socket folder) with it; SIGTERM with
32 streams running ends every request with an answer (an error event and [DONE], or a 503) and
exits within seconds, without the interpreter's teardown (an atexit hook that would take 60 s
never runs); a child killed with -9 stops everything within 2 s, naming it; a grace
period lets running requests finish; once a child is dead every engine call fails at once.

A tiny random-weight model (long context: requests run for as long as a test needs) starts in
seconds. Timings are asserted with margins for a loaded 2-core machine; nominal values are in
the comments."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import tempfile
import threading
import time

import httpx
import pytest

ARGS = ("--dtype", "float32", "--max-total-tokens", "131072", "--log-level", "info")
ENDLESS = {"max_new_tokens": 30000, "ignore_eos": True}  # runs until the test stops it
ERROR_KEYS = {"message", "type", "param", "code"}
SIGTERM_EXIT_S = 5 + 2.5  # the target, plus a margin (nominal: ~2 s)
CHILD_DEATH_EXIT_S = 2 + 2.0  # nominal: ~1.1 s
ORPHAN_EXIT_S = 1 + 2.0  # nominal: ~0.1 s


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return tiny_model_dir("llama", max_position_embeddings=32768)


class Requests:
    """Requests sent on threads of their own, recording what came back: a stream's `data:`
    payloads (with the time each arrived), a plain request's response, or the exception."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[dict] = []
        self._threads: list[threading.Thread] = []
        self._started = threading.Semaphore(0)

    def stream(self, path: str, body: dict) -> dict:
        return self._start(self._stream, path, {**body, "stream": True}, stream=True)

    def plain(self, path: str, body: dict) -> dict:
        return self._start(self._plain, path, body, stream=False)

    def wait_streaming(self, count: int, timeout: float = 60) -> None:
        """Until `count` streams have their first event."""
        for _ in range(count):
            assert self._started.acquire(timeout=timeout), "a stream did not start"

    def join(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), "a request did not end"

    def _start(self, fn, path: str, body: dict, stream: bool) -> dict:
        result: dict = {"events": [], "times": [], "error": None, "response": None}
        self.results.append(result)
        t = threading.Thread(target=self._run, args=(fn, path, body, result, stream), daemon=True)
        self._threads.append(t)
        t.start()
        return result

    def _run(self, fn, path: str, body: dict, result: dict, stream: bool) -> None:
        try:
            fn(path, body, result)
        except Exception as e:  # noqa: BLE001 - recorded for the test to report
            result["error"] = repr(e)
        if stream and not result["events"]:
            self._started.release()  # it failed before its first event: do not wait for it

    def _stream(self, path: str, body: dict, result: dict) -> None:
        with httpx.stream("POST", self.url + path, json=body, timeout=60) as r:
            result["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    if not result["events"]:
                        self._started.release()
                    result["events"].append(line[len("data: ") :])
                    result["times"].append(time.monotonic())

    def _plain(self, path: str, body: dict, result: dict) -> None:
        result["response"] = httpx.post(self.url + path, json=body, timeout=60)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent (or init) to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], limit_s: float, since: float) -> float:
    """Seconds from `since` until every pid has exited; fails past `limit_s`."""
    while any(_alive(p) for p in pids):
        if time.monotonic() - since > limit_s:
            pytest.fail(
                f"processes {[p for p in pids if _alive(p)]} still alive "
                f"{limit_s} s after the fault"
            )
        time.sleep(0.02)
    return time.monotonic() - since


def _ipc_dirs(owner_pid: int) -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"radixrt-{owner_pid}-*"))


def _pids(server) -> tuple[int, int]:
    """(scheduler, detokenizer) pids of a running server."""
    scheduler = httpx.get(server.url + "/get_server_info", timeout=30).json()["scheduler_pid"]
    children = server.children()
    assert scheduler in children and len(children) == 2, children
    return scheduler, next(p for p in children if p != scheduler)


def _assert_ended_with_error(result: dict, says: str) -> None:
    """The stream's last events: an OpenAI error object (503) naming the cause, then [DONE]."""
    assert result["error"] is None, result["error"]  # no dropped connection
    assert len(result["events"]) >= 3 and result["events"][-1] == "[DONE]", result["events"][-3:]
    error = json.loads(result["events"][-2])["error"]
    assert set(error) == ERROR_KEYS and error["code"] == "service_unavailable", error
    assert says in error["message"], error


def test_children_die_with_a_killed_parent_and_stale_socket_folders_go(launch_server, model):
    # A folder left by a server that is gone (nobody holds its lock): the next start removes it.
    stale = tempfile.mkdtemp(prefix="radixrt-999999-")
    open(os.path.join(stale, "owner.lock"), "w").close()
    server = launch_server("--model-path", model, *ARGS)
    assert not os.path.exists(stale)
    children = _pids(server)
    assert len(_ipc_dirs(server.proc.pid)) == 1
    load = Requests(server.url)
    for i in range(4):  # a busy scheduler: today's check of the parent runs only when idle
        load.stream("/generate", {"input_ids": [5, 6, i], "sampling_params": ENDLESS})
    load.wait_streaming(4)
    server.proc.kill()
    start = time.monotonic()
    server.proc.wait()
    _wait_gone(list(children), ORPHAN_EXIT_S, start)
    while _ipc_dirs(server.proc.pid):  # removed by the children on their way out
        assert time.monotonic() - start < ORPHAN_EXIT_S, _ipc_dirs(server.proc.pid)
        time.sleep(0.02)
    load.join()


SLOW_TEARDOWN = """\
import atexit, time
with open("/proc/self/cmdline", "rb") as f:
    if b"radixrt.cli" in f.read():  # the server's main process only
        atexit.register(time.sleep, 60)
"""


def test_sigterm_under_load_answers_every_request_and_exits_fast(
    launch_server, model, tmp_path, monkeypatch
):
    # The interpreter's teardown of the main process (seconds with torch or transformers
    # loaded, on a busy machine) is skipped: here it would take a minute.
    (tmp_path / "sitecustomize.py").write_text(SLOW_TEARDOWN)
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    server = launch_server("--model-path", model, *ARGS)
    pids = [server.proc.pid, *_pids(server)]
    load = Requests(server.url)
    streams = [
        load.stream("/generate", {"input_ids": [5, 6, i], "sampling_params": ENDLESS})
        for i in range(16)
    ]
    streams += [
        load.stream(
            "/v1/completions", {"prompt": [7, 8, i], "max_tokens": 30000, "ignore_eos": True}
        )
        for i in range(16)
    ]
    plain = [
        load.plain("/generate", {"input_ids": [9, 9], "sampling_params": ENDLESS}),
        load.plain(
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 30000,
                "ignore_eos": True,
            },
        ),
    ]
    load.wait_streaming(len(streams))
    deadline = time.monotonic() + 60
    while httpx.get(server.url + "/server_info", timeout=30).json()["running"] < 34:
        assert time.monotonic() < deadline, "the requests did not all start"
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    elapsed = _wait_gone(pids, SIGTERM_EXIT_S, start)
    assert server.proc.wait() == 0, server.log_text()
    load.join()
    for result in streams:
        _assert_ended_with_error(result, "shutting down")
    for result in plain:
        assert result["error"] is None, result["error"]
        r = result["response"]
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
    assert not _ipc_dirs(server.proc.pid)
    print(f"SIGTERM with 34 requests running: all processes gone in {elapsed:.2f} s")


@pytest.mark.parametrize("victim", ["scheduler", "detokenizer"])
def test_a_killed_child_stops_everything_within_2_s_naming_it(launch_server, model, victim):
    server = launch_server("--model-path", model, *ARGS)
    scheduler, detokenizer = _pids(server)
    pid = scheduler if victim == "scheduler" else detokenizer
    load = Requests(server.url)
    streams = [
        load.stream("/v1/completions", {"prompt": [7, i], "max_tokens": 30000, "ignore_eos": True})
        for i in range(4)
    ]
    plain = load.plain("/generate", {"input_ids": [9, 9], "sampling_params": ENDLESS})
    load.wait_streaming(len(streams))
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    _wait_gone([server.proc.pid, scheduler, detokenizer], CHILD_DEATH_EXIT_S, start)
    assert server.proc.wait() == 1
    named = f"the {victim} process (pid {pid}) was killed by signal 9"
    assert named in server.log_text(), server.log_text()
    load.join()
    for result in streams:
        _assert_ended_with_error(result, named)
    r = plain["response"]
    assert plain["error"] is None and r.status_code == 503 and named in r.text, plain
    assert not _ipc_dirs(server.proc.pid)


def test_graceful_shutdown_timeout_lets_running_requests_finish(launch_server, model):
    # A grace period longer than the test: the short request finishes in it (however slow the
    # machine), and a second SIGTERM ends the wait for the endless one.
    server = launch_server("--model-path", model, *ARGS, "--graceful-shutdown-timeout", "60")
    load = Requests(server.url)
    short = load.stream(
        "/generate",
        {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 128, "ignore_eos": True}},
    )
    endless = load.stream("/generate", {"input_ids": [5, 7], "sampling_params": ENDLESS})
    load.wait_streaming(2)
    server.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # Draining: a new request gets 503 (the listener is still open), /health says so too.
    late = httpx.post(
        server.url + "/generate",
        json={"input_ids": [5], "sampling_params": {"max_new_tokens": 1}},
        timeout=30,
    )
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
    assert httpx.get(server.url + "/health", timeout=30).status_code == 503
    deadline = time.monotonic() + 60
    while not short["events"] or short["events"][-1] != "[DONE]":
        assert short["error"] is None and time.monotonic() < deadline, short["error"]
        time.sleep(0.02)
    assert any(t > signalled for t in short["times"]), "the short request ended before SIGTERM"
    last = json.loads(short["events"][-2])["meta_info"]
    assert last["finish_reason"]["type"] == "length" and last["completion_tokens"] == 128, last
    finished = time.monotonic()
    while not endless["times"] or endless["times"][-1] <= finished:  # and the other one runs
        assert time.monotonic() < deadline, "the endless request stopped"
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=SIGTERM_EXIT_S) == 0
    load.join()
    _assert_ended_with_error(endless, "shutting down")


def test_engine_calls_fail_fast_naming_a_dead_child(model):
    import radixrt
    from radixrt.errors import SchedulerDied

    engine = radixrt.Engine(model_path=model, dtype="float32", max_total_tokens=32768)
    try:
        (detokenizer,) = _child_pids("radixrt.detokenizer.process")
        stream = engine.generate(input_ids=[5, 6], sampling_params=ENDLESS, stream=True)
        next(stream)
        os.kill(detokenizer, signal.SIGKILL)
        named = f"the detokenizer process (pid {detokenizer}) was killed by signal 9"
        start = time.monotonic()
        with pytest.raises(SchedulerDied, match=re.escape(named)):
            for _ in stream:
                pass
        calls = {
            "generate": lambda: engine.generate(
                input_ids=[5], sampling_params={"max_new_tokens": 2}
            ),
            "flush_cache": engine.flush_cache,
            "get_stats": engine.get_stats,
            "get_server_info": engine.get_server_info,
            "abort_request": lambda: engine.abort_request(abort_all=True),
        }
        for call in calls.values():
            with pytest.raises(SchedulerDied, match=re.escape(named)):
                call()
        assert time.monotonic() - start < CHILD_DEATH_EXIT_S
    finally:
        engine.shutdown()
    assert not _alive(detokenizer) and not _alive(engine.info.pid)


def _child_pids(module: str) -> list[int]:
    """This process's live children running `python -m module`."""
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
        pids = [int(p) for p in f.read().split()]
    return [p for p in pids if _alive(p) and module.encode() in _cmdline(p)]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""
