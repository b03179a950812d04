"""1,000 mixed requests against two servers whose KV pool is small enough to force preemption
(600 against one that decodes token by token, 400 against one that speculates, NGRAM):
streams read to the end or dropped, non-streamed requests dropped by their client, aborts, n > 1,
constraints, logprobs, bad parameters and shared prefixes, all at once. The server never
answers 5xx, every good request gets a well-formed answer, and afterwards no request holds a
token (the KV accounting check also ran after every step)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import uuid

import httpx
import pytest
from launch_helpers import assert_pool_conserved, server_stats, tiny_server_flags

REQUESTS = {"plain": 600, "speculative": 400}
CONCURRENCY = 24
PREFIXES = [
    f"Shared prefix {i}: " + "the quick brown fox jumps over the lazy dog. " * 3 for i in range(4)
]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
BAD_BODIES = [
    {"text": "x", "sampling_params": {"max_new_tokens": -1}},
    {"text": "x", "sampling_params": {"temperature": "hot"}},
    {"text": "x", "sampling_params": {"no_such_param": 1}},
    {"text": "x", "top_logprobs_num": 100000, "return_logprob": True},
    {"text": "x", "sampling_params": {"regex": "a", "json_schema": "{}"}},
    {"input_ids": [1, 2, 10**9]},
    {"text": "x", "no_such_field": True},
]


SPECULATIVE = ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5")


@pytest.fixture(scope="module", params=["plain", "speculative"])
def churn_server(request, launch_server, tiny_model_dir):
    # A tiny random-weight model: steps take milliseconds, so 1,000 requests fit in CI time.
    server = launch_server(
        *tiny_server_flags(tiny_model_dir("llama"), 640),
        "--page-size",
        "4",
        "--max-running-requests",
        "16",
        "--enable-kv-checks",
        "--log-level",
        "warning",
        *(SPECULATIVE if request.param == "speculative" else ()),
    )
    server.requests = REQUESTS[request.param]
    server.speculative = request.param == "speculative"
    return server


def _prompt(rng: random.Random) -> str:
    return rng.choice(PREFIXES) + "".join(
        rng.choice("abcdefgh ") for _ in range(rng.randint(1, 40))
    )


def _params(rng: random.Random, **extra) -> dict:
    return {
        "max_new_tokens": rng.randint(1, 48),
        "temperature": rng.choice([0, 1.0]),
        "seed": rng.randint(0, 1000),
        **extra,
    }


class Churn:
    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client, self.url = client, url
        self.outcomes: dict[str, int] = {}
        self.failures: list[str] = []

    def note(self, kind: str, ok: bool, detail: object = "") -> None:
        self.outcomes[kind] = self.outcomes.get(kind, 0) + 1
        if not ok:
            self.failures.append(f"{kind}: {detail}"[:500])

    async def generate(self, rng: random.Random) -> None:
        body = {"text": _prompt(rng), "sampling_params": _params(rng)}
        r = await self.client.post(self.url + "/generate", json=body)
        out = r.json()
        ok = (
            r.status_code == 200
            and out["meta_info"]["finish_reason"]["type"] in ("length", "stop")
            and len(out["output_ids"]) <= body["sampling_params"]["max_new_tokens"]
        )
        self.note("generate", ok, (r.status_code, out))

    async def stream(self, rng: random.Random, drop: bool) -> None:
        body = {"text": _prompt(rng), "stream": True, "sampling_params": _params(rng)}
        events = []
        async with self.client.stream("POST", self.url + "/generate", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if drop:
                        break  # leaving the block closes the connection mid-stream
        if drop:
            self.note("stream_dropped", r.status_code == 200, r.status_code)
            return
        last = json.loads(events[-2]) if len(events) >= 2 else {}
        ok = (
            r.status_code == 200
            and events[-1] == "[DONE]"
            and last.get("meta_info", {}).get("finish_reason", {}).get("type") in ("length", "stop")
        )
        self.note("stream", ok, (r.status_code, events[-2:]))

    async def dropped(self, rng: random.Random) -> None:
        body = {"text": _prompt(rng), "sampling_params": _params(rng, max_new_tokens=48)}
        try:
            r = await self.client.post(
                self.url + "/generate", json=body, timeout=rng.uniform(0.01, 0.2)
            )
            self.note("dropped", r.status_code == 200, r.status_code)
        except httpx.TimeoutException:
            self.note("dropped", True)

    async def aborted(self, rng: random.Random) -> None:
        rid = f"churn-{uuid.uuid4().hex}"
        body = {
            "text": _prompt(rng),
            "rid": rid,
            "sampling_params": _params(rng, max_new_tokens=48),
        }
        task = asyncio.ensure_future(self.client.post(self.url + "/generate", json=body))
        await asyncio.sleep(rng.uniform(0, 0.3))
        a = await self.client.post(self.url + "/abort_request", json={"rid": rid})
        r = await task
        reason = r.json()["meta_info"]["finish_reason"]["type"] if r.status_code == 200 else None
        self.note(
            "aborted",
            a.status_code == 200 and reason in ("abort", "length", "stop"),
            (a.status_code, r.status_code, r.text[:200]),
        )

    async def n_samples(self, rng: random.Random) -> None:
        n = rng.choice([2, 3])
        body = {"text": _prompt(rng), "sampling_params": _params(rng, n=n, temperature=1.0)}
        r = await self.client.post(self.url + "/generate", json=body)
        self.note("n", r.status_code == 200 and len(r.json()) == n, (r.status_code, r.text[:200]))

    async def constrained(self, rng: random.Random) -> None:
        if rng.random() < 0.5:
            extra, check = {"regex": "[a-z]{1,8}"}, lambda t: re.fullmatch("[a-z]{0,8}", t)
        else:
            extra, check = {"json_schema": json.dumps(SCHEMA)}, lambda t: True
        body = {"text": _prompt(rng), "sampling_params": _params(rng, **extra)}
        r = await self.client.post(self.url + "/generate", json=body)
        ok = r.status_code == 200 and check(r.json()["text"])
        self.note("constrained", bool(ok), (r.status_code, r.text[:200]))

    async def logprobs(self, rng: random.Random) -> None:
        body = {
            "text": _prompt(rng),
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 3,
            "sampling_params": _params(rng),
        }
        r = await self.client.post(self.url + "/generate", json=body)
        ok = r.status_code == 200 and len(r.json()["meta_info"]["output_token_logprobs"]) == len(
            r.json()["output_ids"]
        )
        self.note("logprobs", ok, (r.status_code, r.text[:200]))

    async def chat_stream(self, rng: random.Random) -> None:
        body = {
            "model": "default",
            "stream": True,
            "max_tokens": rng.randint(1, 16),
            "messages": [{"role": "user", "content": _prompt(rng)}],
        }
        async with self.client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        self.note(
            "chat_stream",
            r.status_code == 200 and lines[-1] == "data: [DONE]",
            (r.status_code, lines[-2:]),
        )

    async def bad(self, rng: random.Random) -> None:
        r = await self.client.post(self.url + "/generate", json=rng.choice(BAD_BODIES))
        self.note("bad", r.status_code == 400 and "error" in r.json(), (r.status_code, r.text))


KINDS = [
    ("generate", 25),
    ("stream", 12),
    ("stream_dropped", 8),
    ("dropped", 8),
    ("aborted", 8),
    ("n", 8),
    ("constrained", 8),
    ("logprobs", 6),
    ("chat_stream", 7),
    ("bad", 10),
]


async def _run_churn(url: str, requests: int, seed: int = 0) -> Churn:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=CONCURRENCY * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        churn = Churn(client, url)
        gate = asyncio.Semaphore(CONCURRENCY)
        names, weights = zip(*KINDS, strict=True)

        async def one(i: int) -> None:
            r = random.Random(rng.random())
            kind = r.choices(names, weights)[0]
            async with gate:
                try:
                    if kind in ("stream", "stream_dropped"):
                        await churn.stream(r, drop=kind == "stream_dropped")
                    else:
                        await getattr(
                            churn, {"n": "n_samples", "generate": "generate"}.get(kind, kind)
                        )(r)
                except Exception as exc:  # noqa: BLE001 - every surprise is a failure
                    churn.note(kind, False, repr(exc))

        await asyncio.gather(*(one(i) for i in range(requests)))
    return churn


def test_mixed_requests_leave_nothing_held(churn_server):
    churn = asyncio.run(_run_churn(churn_server.url, churn_server.requests))
    assert sum(churn.outcomes.values()) == churn_server.requests
    assert not churn.failures, f"{len(churn.failures)} failures, e.g. {churn.failures[:5]}"
    assert_pool_conserved(churn_server)
    stats = server_stats(churn_server)
    assert stats["num_preemptions"] > 0, "the pool was meant to be small enough to preempt"
    if churn_server.speculative:
        assert stats["spec_accepted_tokens"] > 0 < stats["spec_draft_tokens"]
    assert "Traceback" not in churn_server.log_text()
