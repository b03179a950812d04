"""Schema fuzzing (issue 17, item 8): schemathesis draws requests from the server's own
/openapi.json, valid bodies and invalid ones, for every operation; none may get a 5xx, and
afterwards the server is healthy and no request holds a token of the KV pool.

Generation is kept short in the test's copy of the document (the token counts and n get a
maximum), so that most drawn requests finish at once; one that still runs past the client's
timeout is dropped by the client, which is a failure only if the server stops answering."""

from __future__ import annotations

import time

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from launch_helpers import assert_pool_conserved

schemathesis = pytest.importorskip("schemathesis")
requests = pytest.importorskip("requests")  # schemathesis' transport

EXAMPLES = 20  # drawn requests per operation and mode (valid, invalid bodies)
BUDGET_S = 35.0  # past this, draws are no longer sent
CLIENT_TIMEOUT_S = 4.0
# Upper bounds put on integer fields of the same name in the test's copy of the document.
CAPS = {
    "max_tokens": 8,
    "max_completion_tokens": 8,
    "max_new_tokens": 8,
    "min_tokens": 8,
    "min_new_tokens": 8,
    "n": 3,
    "best_of": 3,
}
BATCH_CAPS = {"prompt": 3, "text": 3, "input_ids": 3}  # most items in a list of prompts
# Fields made required in the copy, so that no drawn request generates the default length
# (chat: the rest of the context; /generate: 128 tokens).
REQUIRED = {
    "ChatCompletionRequest": "max_tokens",
    "CompletionRequest": "max_tokens",
    "GenerateReqInput": "sampling_params",
    "SamplingParams": "max_new_tokens",
}


def _bounded(doc: dict) -> dict:
    """The document with CAPS and REQUIRED applied (in place)."""
    schemas = doc["components"]["schemas"]
    for name, field in REQUIRED.items():
        schemas[name].setdefault("required", []).append(field)
        prop = schemas[name]["properties"][field]  # and not null
        prop["anyOf"] = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    return _capped(doc)


def _capped(node):
    """`node` with CAPS and BATCH_CAPS applied to the properties of those names (in place)."""
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            for branch in [prop, *prop.get("anyOf", [])]:
                if name in CAPS and branch.get("type") == "integer":
                    branch["maximum"] = CAPS[name]
                if name in BATCH_CAPS and branch.get("type") == "array":
                    branch["maxItems"] = BATCH_CAPS[name]
        for value in node.values():
            _capped(value)
    elif isinstance(node, list):
        for value in node:
            _capped(value)
    return node


def _operations(url: str) -> list:
    doc = _bounded(httpx.get(url + "/openapi.json", timeout=30).json())
    ops = [result.ok() for result in schemathesis.openapi.from_dict(doc).get_all_operations()]
    assert len(ops) > 15, [op.label for op in ops]
    return ops


class _Fuzzer:
    """Sends drawn requests until the time budget is spent; collects 5xx answers."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.deadline = time.monotonic() + BUDGET_S
        self.failures: list[str] = []
        self.sent = 0

    def run(self, op, mode) -> None:
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy(generation_mode=mode))
        def send(case) -> None:
            if time.monotonic() < self.deadline and len(self.failures) < 5:
                self.send(case)

        send()

    def send(self, case) -> None:
        self.sent += 1
        try:
            r = case.call(base_url=self.url, session=self.session, timeout=CLIENT_TIMEOUT_S)
        except requests.Timeout:  # a long generation: the client leaves, the server aborts
            if httpx.get(self.url + "/health", timeout=10).status_code != 200:
                self.failures.append(f"{case.operation.label}: the server stopped answering")
            return
        if r.status_code >= 500:
            self.failures.append(
                f"{case.operation.label} {r.status_code}: body "
                f"{str(case.body)[:300]} -> {r.text[:300]}"
            )


def test_fuzzed_requests_get_no_server_error(shared_server):
    fuzzer = _Fuzzer(shared_server.url)
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    for op in _operations(shared_server.url):
        for mode in modes if len(op.body) else modes[:1]:  # no body: nothing to break
            fuzzer.run(op, mode)
    assert not fuzzer.failures, "\n".join(fuzzer.failures)
    assert fuzzer.sent >= 100, f"only {fuzzer.sent} requests in {BUDGET_S} s"
    assert_pool_conserved(shared_server)
