"""The HTTP layer's errors (issue 17, items 8 and 10): 4xx (never 500) for whatever a route
cannot serve, a described OpenAPI document, OpenAI-shaped validation errors, and quiet and
honest errors (a dead child's 503 naming it, a 500 naming no internal exception).

The route cases use the shared server; the failed-engine and internal-error cases run the app
in-process on a stand-in engine."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
from launch_helpers import assert_pool_conserved
from starlette.testclient import TestClient
from test_http_hostile import openai_error

from radixrt.entrypoints.http_server import ServerState, build_app
from radixrt.entrypoints.metrics import ServerMetrics
from radixrt.errors import SchedulerDied
from radixrt.server_args import ServerArgs


# -- item 8: 4xx for whatever a route cannot serve, and the bodies described ----------------
def _operations(url: str) -> dict[str, dict]:
    return httpx.get(url + "/openapi.json", timeout=30).json()["paths"]


def test_openapi_describes_every_request_body(shared_server):
    doc = httpx.get(shared_server.url + "/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]
    posts = {path: ops["post"] for path, ops in doc["paths"].items() if "post" in ops}
    assert {
        "/generate",
        "/v1/chat/completions",
        "/v1/completions",
        "/abort_request",
        "/tokenize",
        "/detokenize",
    } <= set(posts)
    for path, op in posts.items():
        if path == "/flush_cache":
            continue
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        name = schema["$ref"].rsplit("/", 1)[-1]
        assert schemas[name]["properties"], path
    assert "messages" in schemas["ChatCompletionRequest"]["required"]
    assert "sampling_params" in schemas["GenerateReqInput"]["properties"]


BAD_BODIES = [
    b"",
    b"not json",
    b"[1, 2]",
    b'"text"',
    b'{"a": NaN}',
    b'{"text": "\\ud800"}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}",
    b'{"text": ' + b'{"a": ' * 1500 + b"1" + b"}" * 1500 + b"}",
    b"\xff\xfe\x00",
]


def test_every_route_answers_4xx_to_what_it_cannot_serve(shared_server):
    url = shared_server.url
    ops = _operations(url)
    for path, methods in ops.items():
        path = path.replace("{model}", "x")
        wrong = next(m for m in ("put", "delete", "patch", "post") if m not in methods)
        openai_error(httpx.request(wrong, url + path, timeout=30), 405)
        if "post" in methods and path != "/flush_cache":
            for body in BAD_BODIES:
                r = httpx.post(url + path, content=body, timeout=30)
                openai_error(r, 400)
        if "get" in methods and path != "/health_generate":
            r = httpx.request("GET", url + path, content=b"[" * 5000, timeout=30)
            assert r.status_code < 500, (path, r.text[:200])
    openai_error(httpx.get(url + "/no/such/route", timeout=30), 404)
    deep = (
        '{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": '
        '"json_schema", "json_schema": {"name": "x", "schema": '
        + '{"items": ' * 3000
        + "{}"
        + "}" * 3000
        + "}}}"
    )
    r = httpx.post(url + "/v1/chat/completions", content=deep, timeout=30)
    assert "nested too deeply" in openai_error(r, 400)["message"]


def test_validation_errors_are_openai_400s(shared_server):
    url = shared_server.url
    cases = [
        ("/v1/chat/completions", {"messages": "hi"}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}], "n": "2"}, "n"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ("/generate", {"text": 5}, "text"),
        ("/generate", {"text": "hi", "nope": 1}, "nope"),
        ("/detokenize", {"tokens": "x"}, "tokens"),
    ]
    for path, body, param in cases:
        openai_error(httpx.post(url + path, json=body, timeout=30), 400, param)


# -- item 10: quiet and honest errors -------------------------------------------------------
class _StandInEngine:
    """Enough of Engine for build_app: its requests fail as `failure` says."""

    def __init__(self, error: BaseException | None, failure: BaseException) -> None:
        self.error, self.failure = error, failure
        self.tokenizer = None
        self.server_args = ServerArgs()
        self.info = SimpleNamespace(
            context_length=64, vocab_size=100, pool_tokens=64, model_path="m", eos_token_ids=[0]
        )

    def _fail(self, *args, **kwargs):
        raise self.failure

    flush_cache = get_server_info = get_stats = abort_request = _fail

    async def async_generate_request(self, req):
        raise self.failure


def _app(error: BaseException | None, failure: BaseException) -> TestClient:
    engine = _StandInEngine(error, failure)
    state = ServerState(
        engine, ServerArgs(), "m", ServerMetrics(engine.get_stats, "m"), healthy=True
    )
    return TestClient(build_app(state), raise_server_exceptions=False)


def test_after_a_child_died_every_endpoint_answers_503_naming_it():
    died = SchedulerDied("the detokenizer process died (exit code -9)")
    client = _app(died, died)
    for method, path in [
        ("GET", "/flush_cache"),
        ("POST", "/flush_cache"),
        ("GET", "/get_server_info"),
        ("GET", "/server_info"),
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("GET", "/version"),
        ("POST", "/generate"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/abort_request"),
        ("GET", "/model_info"),
    ]:
        r = client.request(method, path, json={"text": "hi"})
        assert r.status_code == 503 and "detokenizer" in r.json()["error"]["message"], path
    health = client.get("/health")
    assert health.status_code == 503 and "detokenizer" in health.json()["message"]


def test_a_500_names_no_internal_exception():
    client = _app(None, RuntimeError("kv table 0x7f3a corrupt"))
    for method, path, body in [
        ("POST", "/generate", {"text": "hi"}),
        ("GET", "/flush_cache", None),
        ("GET", "/server_info", None),
    ]:
        r = client.request(method, path, json=body)
        assert r.status_code == 500, (path, r.text)
        assert "RuntimeError" not in r.text and "0x7f3a" not in r.text, r.text
        assert r.json()["error"]["type"] == "server_error"


def test_the_shared_server_is_whole_after_the_bad_requests(shared_server):
    assert_pool_conserved(shared_server)
