"""RuntimeEndpoint against a stand-in for a real SGLang server (no ZeroMQ frontend, no chat
template, only the older /get_* info names, SGLang's error shape, SSE streams whose logprobs
are incremental): it falls back to HTTP and to SGLang's template choice by model path."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import radixrt as rt


class FakeSGLang(BaseHTTPRequestHandler):
    bodies: list[dict] = []
    incremental = False  # as SGLang's --incremental-streaming-output

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/get_server_info":
            self._json(
                200,
                {
                    "version": "0.5.23",
                    "port": 30000,
                    "incremental_streaming_output": FakeSGLang.incremental,
                },
            )
        elif self.path == "/get_model_info":
            self._json(200, {"model_path": "Qwen/Qwen2-7B-Instruct", "is_generation": True})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
        if self.path == "/flush_cache":
            return self._json(200, {"success": True})
        FakeSGLang.bodies.append(body)
        if body["sampling_params"].get("max_new_tokens", 1) < 0:
            return self._json(400, {"object": "error", "message": "max_new_tokens must be >= 0"})
        if body.get("stream"):
            return self._stream()
        meta = {"prompt_tokens": 5, "completion_tokens": 2, "cached_tokens": 0}
        self._json(200, {"text": " Paris", "meta_info": meta})

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        text, ids = "", []
        for i, piece in enumerate(["Hel", "lo", " there"]):
            # SGLang streams the text and ids so far (only the new ones when incremental),
            # and here only the new logprobs.
            text, ids = (piece, [i]) if FakeSGLang.incremental else (text + piece, ids + [i])
            meta = {"completion_tokens": i + 1, "output_token_logprobs": [[-0.5, i, None]]}
            event = {"text": text, "output_ids": ids, "meta_info": meta}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def sglang_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_server_without_zeromq_is_driven_over_http(sglang_url):
    backend = rt.RuntimeEndpoint(sglang_url)
    try:
        assert backend.transport == "http" and backend.chat_template_name == "qwen"
        assert backend.get_model_name() == "Qwen/Qwen2-7B-Instruct"
        assert backend.get_server_info()["version"] == "0.5.23"

        @rt.function
        def prog(s):
            s += rt.user("Capital of France?") + rt.assistant(rt.gen("a", max_tokens=4))

        state = prog.run(backend=backend, temperature=0)
        assert state["a"] == " Paris"
        sent = FakeSGLang.bodies[-1]
        assert sent["text"].startswith("<|im_start|>system\nYou are a helpful assistant.")
        assert "<|im_end|>" in sent["sampling_params"]["stop"]  # the qwen template's stop
        assert backend.flush_cache() is True
        with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
            rt.function(lambda s: s.__iadd__("x" + rt.gen("b"))).run(
                backend=backend, max_new_tokens=-1
            )
    finally:
        backend.shutdown()


@pytest.mark.parametrize("incremental", [False, True])
def test_sse_streams_give_new_text_and_per_chunk_logprobs(sglang_url, incremental, monkeypatch):
    monkeypatch.setattr(FakeSGLang, "incremental", incremental)
    backend = rt.RuntimeEndpoint(sglang_url, transport="http")

    @rt.function
    def prog(s):
        s += "Say hello:" + rt.gen("a", return_logprob=True)

    async def collect():
        state = prog(backend=backend, stream=True)
        return state, [p async for p in state.text_async_iter("a", return_meta_data=True)]

    try:
        state, pairs = asyncio.run(collect())
        assert [t for t, _ in pairs] == ["Hel", "lo", " there"]
        assert [len(m["output_token_logprobs"]) for _, m in pairs] == [1, 1, 1]
        assert [m["output_token_logprobs_length"] for _, m in pairs] == [1, 2, 3]
        assert state["a"] == "Hello there"
        assert len(state.get_meta_info("a")["output_token_logprobs"]) == 3
        assert FakeSGLang.bodies[-1]["stream"] is True
        chunks = list(backend.http.generate_stream(text="x", sampling_params={}))
        assert [c["output_ids"] for c in chunks] == [[0], [1], [2]]
    finally:
        backend.shutdown()


def test_zmq_is_refused_clearly_where_the_server_has_none(sglang_url):
    with pytest.raises(ConnectionError, match="offers no zmq_frontend_address"):
        rt.RuntimeEndpoint(sglang_url, transport="zmq")
