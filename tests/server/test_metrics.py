"""/metrics against a real server (a tiny random model, a small KV pool, an API key): every
series exists at start-up, and each metric moves when it should. Also: the Grafana dashboard
and the Prometheus alert rules in deploy/ name only metrics this server exports."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI
from launch_helpers import tiny_server_flags
from prometheus_client.parser import text_string_to_metric_families

from radixrt.entrypoints.http_metrics import add_http_metrics
from radixrt.entrypoints.metrics import ServerMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "radixrt-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "radixrt-alerts.yml"
RULES_TEST = REPO / "deploy" / "prometheus" / "radixrt-alerts_test.yml"
KEY = "metrics-test-key"
ALERTS = {
    "HighKVCacheUsage",
    "WaitingRequestsGrowing",
    "TTFTRegression",
    "TPOTRegression",
    "PrefixCacheHitDrop",
}
Samples = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module")
def server(launch_server, tiny_model_dir):
    # A pool of 256 tokens: a few prompts of ~100 tokens push older cache pages out.
    return launch_server(
        *tiny_server_flags(tiny_model_dir("llama"), 256),
        "--enable-kv-checks",
        "--log-level",
        "warning",
        api_key=KEY,
    )


@pytest.fixture(scope="module")
def startup_text(server) -> str:
    """The first scrape, before any test sent a request (module fixtures run first)."""
    return scrape_text(server)


def scrape_text(server) -> str:
    r = httpx.get(server.url + "/metrics", headers=server.headers, timeout=30)
    r.raise_for_status()
    return r.text


def scrape(server) -> Samples:
    text = scrape_text(server)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample `name` whose labels include `labels` (model_name is implied)."""
    want = set(labels.items())
    found = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    assert len(found) == 1, f"{name}{labels}: {len(found)} series"
    return found[0]


def complete(server, prompt: str, max_tokens: int, **extra) -> httpx.Response:
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    body.update(extra)
    return httpx.post(server.url + "/v1/completions", json=body, headers=server.headers, timeout=60)


def wait_idle(server, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        s = scrape(server)
        if value(s, "radixrt:num_running_reqs") == value(s, "radixrt:num_queue_reqs") == 0:
            return
        assert time.monotonic() < deadline, "requests still running"
        time.sleep(0.1)


def exported_names(text: str) -> set[str]:
    """Metric names as queries write them: family names and their _bucket/_sum/_count/_total
    series."""
    names = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
    return names


def radixrt_names(expr: str) -> set[str]:
    """`radixrt:` metric names in a PromQL expression, without histogram suffixes."""
    found = re.findall(r"radixrt:[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in found}


# -- start-up --------------------------------------------------------------------------------


def test_every_labelled_series_exists_at_start_up(startup_text):
    samples = {
        (s.name, tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(startup_text)
        for s in fam.samples
    }
    names = {n for n, _ in samples}
    for reason in ("stop", "length", "abort", "error"):
        assert any(
            n == "radixrt:request_success_total" and ("finished_reason", reason) in lab
            for n, lab in samples
        ), reason
    for route in ("/v1/completions", "/v1/chat/completions", "/generate", "none"):
        for status in ("2xx", "4xx", "5xx"):
            assert any(
                n == "radixrt:http_requests_total"
                and ("route", route) in lab
                and ("status", status) in lab
                for n, lab in samples
            ), (route, status)
    for histogram in (
        "time_to_first_token_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "queue_time_seconds",
        "iteration_tokens_total",
        "kv_block_lifetime_seconds",
        "kv_block_idle_before_evict_seconds",
        "kv_block_reuse_gap_seconds",
        "grammar_compile_time_seconds",
        "spec_accept_length",
    ):
        assert f"radixrt:{histogram}_count" in names, histogram
    for other in (
        "radixrt:prefix_cache_queries_total",
        "radixrt:prefix_cache_hits_total",
        "radixrt:jump_forward_tokens_total",
        "radixrt:spec_decode_num_draft_tokens_total",
        "radixrt:spec_decode_num_accepted_tokens_total",
        "radixrt:evicted_tokens_total",
        "radixrt:num_used_tokens",
        "radixrt:num_evictable_tokens",
        "radixrt:num_grammar_queue_reqs",
        "radixrt:num_beam_groups",
        "radixrt:beam_forks_total",
        "radixrt:beam_shared_tokens_total",
        "radixrt:beam_copied_tokens_total",
        # Disaggregation's, at 0 on a server that is not disaggregated.
        "radixrt:disagg_queue_reqs",
        "radixrt:disagg_transfers_total",
        "radixrt:disagg_transfer_failures_total",
        "radixrt:disagg_transfer_bytes_total",
        "radixrt:disagg_transfer_seconds_total",
        "radixrt:disagg_transfer_tokens_total",
        "radixrt:disagg_reused_tokens_total",
    ):
        assert other in names, other


def test_a_beam_search_forks_beams_that_share_kv(server):
    before = scrape(server)
    r = complete(server, "one two three", 6, n=3, use_beam_search=True, ignore_eos=True)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 3
    after = scrape(server)
    forks = value(after, "radixrt:beam_forks_total") - value(before, "radixrt:beam_forks_total")
    assert forks >= 2  # the first step forks the prompt into 3 beams
    shared = value(after, "radixrt:beam_shared_tokens_total")
    assert shared - value(before, "radixrt:beam_shared_tokens_total") > 0
    assert value(after, "radixrt:num_beam_groups") == 0


# -- each metric moves -----------------------------------------------------------------------


def test_a_finished_request_moves_tokens_times_reasons_and_http(server):
    before = scrape(server)
    r = complete(server, "one two three four", 5, ignore_eos=True)
    assert r.status_code == 200, r.text
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("radixrt:request_success_total", finished_reason="length") == 1
    assert delta("radixrt:request_success_total", finished_reason="stop") == 0
    for name in ("request_prefill_time_seconds", "request_decode_time_seconds"):
        assert delta(f"radixrt:{name}_count") == 1, name
    assert delta("radixrt:queue_time_seconds_count") == 1
    # One prefill step and four decode steps, alone on the server: 5 steps, and the tokens
    # they computed are the uncached prompt plus the four decoded ones.
    cached = r.json()["usage"].get("prompt_tokens_details", {}) or {}
    assert delta("radixrt:iteration_tokens_total_count") == 5
    assert delta("radixrt:iteration_tokens_total_sum") == (
        prompt_tokens - cached.get("cached_tokens", 0) + 4
    )
    assert delta("radixrt:prefix_cache_queries_total") == prompt_tokens
    assert delta("radixrt:http_requests_total", route="/v1/completions", status="2xx") == 1


def test_shared_prefix_requests_raise_prefix_cache_hits(server):
    prompt = "a shared system prompt that is long enough to be worth caching " * 2
    assert complete(server, prompt + "first", 1).status_code == 200
    before = scrape(server)
    r = complete(server, prompt + "second", 1)
    after = scrape(server)
    hits = value(after, "radixrt:prefix_cache_hits_total") - value(
        before, "radixrt:prefix_cache_hits_total"
    )
    assert hits > 0
    assert hits == r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The reused pages were released by the first request and taken by the second.
    reuse = "radixrt:kv_block_reuse_gap_seconds_count"
    assert value(after, reuse) > value(before, reuse)


def test_http_errors_count_by_route_template_and_class(server):
    before = scrape(server)
    assert complete(server, "x", -3).status_code == 400
    missing = httpx.get(server.url + "/no/such/path", headers=server.headers, timeout=30)
    assert missing.status_code == 404
    unauthorized = httpx.get(server.url + "/v1/models", timeout=30)
    assert unauthorized.status_code == 401
    after = scrape(server)
    for route, status in (("/v1/completions", "4xx"), ("none", "4xx"), ("/v1/models", "4xx")):
        key = {"route": route, "status": status}
        assert (
            value(after, "radixrt:http_requests_total", **key)
            == value(before, "radixrt:http_requests_total", **key) + 1
        ), key
    # Raw paths never become labels.
    assert not any(
        ("route", "/no/such/path") in lab for (n, lab) in after if n.startswith("radixrt:http")
    )


def test_an_aborted_request_counts_as_abort(server):
    before = scrape(server)
    body = {
        "text": "Count forever:",
        "stream": True,
        "sampling_params": {"max_new_tokens": 200, "ignore_eos": True},
    }
    with httpx.stream(
        "POST", server.url + "/generate", json=body, headers=server.headers, timeout=60
    ) as r:
        lines = r.iter_lines()
        next(lines)  # it runs
        httpx.post(
            server.url + "/abort_request",
            json={"abort_all": True},
            headers=server.headers,
            timeout=30,
        ).raise_for_status()
        for _ in lines:  # to its end
            pass
    wait_idle(server)
    after = scrape(server)
    key = {"finished_reason": "abort"}
    assert (
        value(after, "radixrt:request_success_total", **key)
        == value(before, "radixrt:request_success_total", **key) + 1
    )


def test_a_constrained_request_moves_grammar_and_jump_forward_metrics(server):
    before = scrape(server)
    regex = r'\{"id": [0-9]{1,4}, "tags": \["[a-z]{1,6}"\]\}'
    body = {"text": "Record:", "sampling_params": {"regex": regex, "max_new_tokens": 60}}
    r = httpx.post(server.url + "/generate", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 200, r.text
    assert re.fullmatch(regex, r.json()["text"]), r.json()["text"]
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("radixrt:grammar_compile_time_seconds_count") == 1
    assert delta("radixrt:jump_forward_tokens_total") > 0  # '{"id": ' and the like are forced
    assert delta("radixrt:request_success_total", finished_reason="stop") == 1
    assert value(after, "radixrt:num_grammar_queue_reqs") == 0


def test_eviction_under_pool_pressure_observes_block_times(server):
    before = scrape(server)
    for i in range(4):  # ~100-token prompts, each unlike the others, into a 256-token pool
        prompt = " ".join(f"w{i}x{j}" for j in range(40))
        assert complete(server, prompt, 2).status_code == 200
    wait_idle(server)
    after = scrape(server)
    for name in (
        "radixrt:kv_block_lifetime_seconds_count",
        "radixrt:kv_block_idle_before_evict_seconds_count",
        "radixrt:evicted_tokens_total",
    ):
        assert value(after, name) > value(before, name), name
    lifetime = value(after, "radixrt:kv_block_lifetime_seconds_sum")
    idle = value(after, "radixrt:kv_block_idle_before_evict_seconds_sum")
    assert 0 < idle <= lifetime  # a page idles only part of its life in the cache
    assert 0 < value(after, "radixrt:num_evictable_tokens") <= 256


def test_flush_cache_evicts_everything_into_the_histograms(server):
    wait_idle(server)
    before = scrape(server)
    held = value(before, "radixrt:num_evictable_tokens")
    assert held > 0, "the earlier tests left pages in the cache"
    httpx.post(server.url + "/flush_cache", headers=server.headers, timeout=30).raise_for_status()
    after = scrape(server)
    assert value(after, "radixrt:num_evictable_tokens") == 0
    evicted = value(after, "radixrt:evicted_tokens_total") - value(
        before, "radixrt:evicted_tokens_total"
    )
    assert evicted == held


# -- the dashboard and the alert rules -------------------------------------------------------


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v.get("query", "") for v in board["templating"]["list"] if v["type"] == "query"]
    return [e if isinstance(e, str) else e.get("query", "") for e in exprs]


def test_the_dashboard_names_only_exported_metrics(server):
    exported = exported_names(scrape_text(server))
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    named = set().union(*(radixrt_names(e) for e in exprs))
    assert named, "the dashboard queries no radixrt metric"
    missing = {n for n in named if n not in exported}
    assert not missing, f"the dashboard queries metrics the server does not export: {missing}"


def test_the_dashboard_is_an_importable_grafana_dashboard():
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 36  # Grafana 9.x/10+
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["model_name"]["type"] == "query"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'model_name=~"$model_name"' in target["expr"] or "radixrt:" not in target["expr"]
    titles = " ".join(p["title"] for p in board["panels"]).lower()
    for topic in (
        "throughput",
        "ttft",
        "itl",
        "tpot",
        "queue",
        "kv",
        "hit rate",
        "preempt",
        "evict",
    ):
        assert topic in titles, topic


def test_the_alert_rules_have_the_expected_shape_and_name_exported_metrics(server):
    doc = yaml.safe_load(RULES.read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    exported = exported_names(scrape_text(server))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical", "info")
        assert {"summary", "description"} <= set(rule["annotations"])
        named = radixrt_names(rule["expr"])
        assert named and named <= exported, (rule["alert"], named - exported)


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: prometheus)")
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        [PROMTOOL, "test", "rules", str(RULES_TEST)], capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr
    # The unit tests cover each alert: firing on a bad series and silent on a healthy one.
    spec = yaml.safe_load(RULES_TEST.read_text())
    cases = [case for t in spec["tests"] for case in t["alert_rule_test"]]
    for alert in ALERTS:
        outcomes = {bool(c["exp_alerts"]) for c in cases if c["alertname"] == alert}
        assert outcomes == {True, False}, alert


# -- the HTTP middleware on its own (no server) ----------------------------------------------


def test_http_metrics_label_templates_classes_and_unhandled_errors():
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict:
        return {"id": item_id}

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("unhandled")

    metrics = ServerMetrics(lambda: {}, "m")
    add_http_metrics(app, metrics)

    async def run() -> None:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/items/1")).status_code == 200
            assert (await client.get("/items/2")).status_code == 200
            assert (await client.get("/items/x")).status_code == 422
            assert (await client.get("/nowhere")).status_code == 404
            assert (await client.get("/boom")).status_code == 500

    asyncio.run(run())
    counts = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in metrics.http_requests.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert counts[("/items/{item_id}", "2xx")] == 2
    assert counts[("/items/{item_id}", "4xx")] == 1
    assert counts[("none", "4xx")] == 1
    assert counts[("/boom", "5xx")] == 1
    assert counts[("/boom", "2xx")] == 0  # created with the app's routes
    assert not any(route.startswith("/items/1") for route, _ in counts)
