"""Data parallelism behind SGLang's model gateway (SMG, `pip install smg`): two radixrt workers
on loopback (tiny random-weight models), SMG started in front of them as a subprocess.

- cache_aware keeps each of eight prefix groups on one worker (>= 95% of its requests), and
  the cached prompt tokens it earns beat round_robin's on the same workload;
- SMG reads /v1/loads (radixrt's answer, in SGLang's shape) for both workers;
- killing a worker drains its traffic to the other, with no 5xx once SMG has marked it down;
- `radixrt launch --dp-size 2` starts two replica servers, stops both on SIGTERM, and exits 1
  naming a replica that died.
Which worker served a request is read from the workers' own request counters (/server_info).
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from launch_helpers import LaunchedServer, free_port, free_port_run

from radixrt.entrypoints import dp_launch
from radixrt.server_args import ServerArgs

SMG = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
pytestmark = pytest.mark.skipif(
    not Path(SMG).exists(), reason="SMG (SGLang's model gateway, `pip install smg`) is absent"
)
GROUPS, PER_GROUP = 8, 10
MODEL = "tiny"
WORKER_FLAGS = ("--dtype", "float32", "--max-total-tokens", "16384", "--served-model-name", MODEL)
WORKER_FLAGS += ("--log-level", "warning")
# Health and breaker settings small enough for a test; SMG's warm-up diversions (which send a
# share of cache hits to a cold worker on purpose) off, so that affinity is all that is tested.
SMG_FLAGS = (
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "1",
    "--health-check-timeout-secs",
    "1",
    "--cb-failure-threshold",
    "1",
    "--load-monitor-interval",
    "1",
    "--worker-warmup-secs",
    "0",
    "--worker-warmup-divert-every",
    "0",
    "--log-level",
    "warn",
)


class Gateway:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def workers(self) -> list[dict]:
        return httpx.get(self.url + "/workers", timeout=5).json()["workers"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_gateway(tmp: Path, policy: str, urls: list[str]) -> Gateway:
    port = free_port()
    log = tmp / f"smg-{policy}.log"
    cmd = [SMG, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    cmd += ["--prometheus-port", str(free_port()), *SMG_FLAGS, "--worker-urls", *urls]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    gateway = Gateway(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"smg exited: {log.read_text(errors='replace')[-3000:]}"
        try:
            workers = gateway.workers()
            if len(workers) == len(urls) and all(w["is_healthy"] for w in workers):
                return gateway
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.3)
    gateway.stop()
    pytest.fail(f"smg did not register both workers: {log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def workers(launch_server, tiny_model_dir) -> Iterator[list[LaunchedServer]]:
    model = tiny_model_dir("llama")
    # Started side by side; the pool's threads live until the module ends, because a worker
    # gets SIGTERM when the thread that started it exits (PR_SET_PDEATHSIG, launch_helpers).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        started = [pool.submit(launch_server, "--model-path", model, *WORKER_FLAGS) for _ in "ab"]
        yield [s.result() for s in started]


@pytest.fixture(scope="module")
def gateways(workers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smg")
    urls = [w.url for w in workers]
    started = {p: start_gateway(tmp, p, urls) for p in ("cache_aware", "round_robin")}
    yield started
    for gateway in started.values():
        gateway.stop()


def group_messages() -> list[tuple[int, list[dict]]]:
    """Eight groups, each a system prompt of ~40 random words (no two share a first word)
    and ten distinct short questions, in a seeded random order (round_robin's alternation
    then splits each group between the workers)."""
    rng = random.Random(7)
    words = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro", "si", "tu") for b in "aeiou"]
    out = []
    systems = [" ".join([f"w{g}"] + rng.choices(words, k=40)) for g in range(GROUPS)]
    for q in range(PER_GROUP):
        for g, system in enumerate(systems):
            question = f"question {q} of group {g}: {rng.choice(words)}?"
            system_turn = {"role": "system", "content": system}
            out.append((g, [system_turn, {"role": "user", "content": question}]))
    rng.shuffle(out)
    return out


def request_counts(workers: list[LaunchedServer]) -> list[int]:
    return [httpx.get(w.url + "/server_info", timeout=30).json()["requests"] for w in workers]


def chat(base_url: str, messages: list[dict]) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0}
    return httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)


def run_groups(gateway: Gateway, workers: list[LaunchedServer]) -> tuple[list[list[int]], int]:
    """([group][worker] request counts, summed cached prompt tokens), on flushed caches."""
    for w in workers:
        assert httpx.post(w.url + "/flush_cache", timeout=30).status_code == 200
    served = [[0] * len(workers) for _ in range(GROUPS)]
    cached = 0
    for group, messages in group_messages():
        before = request_counts(workers)
        r = chat(gateway.url, messages)
        assert r.status_code == 200, r.text
        cached += r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        deltas = [a - b for a, b in zip(request_counts(workers), before, strict=True)]
        assert sorted(deltas) == [0, 1], f"one request, one worker: {deltas}"
        served[group][deltas.index(1)] += 1
    return served, cached


def test_cache_aware_keeps_groups_on_their_worker_and_beats_round_robin(gateways, workers):
    affinity, cached_affinity = run_groups(gateways["cache_aware"], workers)
    spread, cached_spread = run_groups(gateways["round_robin"], workers)
    on_their_worker = sum(max(counts) for counts in affinity)
    assert on_their_worker >= 0.95 * GROUPS * PER_GROUP, affinity
    assert sum(min(counts) > 0 for counts in spread) >= GROUPS // 2, f"round_robin: {spread}"
    assert cached_affinity > cached_spread > 0, (cached_affinity, cached_spread)


def test_smg_reads_each_workers_load(gateways, workers):
    body = httpx.get(gateways["cache_aware"].url + "/get_loads", timeout=10).json()
    by_url = {entry["worker"]: entry for entry in body["loads"]}
    assert set(by_url) == {w.url for w in workers}, body
    for w in workers:
        own = httpx.get(w.url + "/v1/loads", timeout=10).json()["loads"][0]
        assert by_url[w.url]["max_total_num_tokens"] == own["max_total_num_tokens"] == 16384


def test_load_endpoints_shape(workers):
    url = workers[0].url
    body = httpx.get(url + "/v1/loads?include=core,disagg,queues,memory", timeout=10).json()
    assert body["dp_rank_count"] == 1 and body["timestamp"]
    (load,) = body["loads"]
    for key in ("num_running_reqs", "num_waiting_reqs", "num_total_reqs", "num_used_tokens"):
        assert load[key] == 0, (key, load)  # idle: the cache's pages are evictable, not used
    assert load["dp_rank"] == 0 and load["token_usage"] == 0.0
    assert load["max_total_num_tokens"] == 16384 and load["max_running_requests"] == 128
    assert load["num_free_tokens"] + load["num_evictable_tokens"] == 16384
    assert httpx.get(url + "/v1/loads?dp_rank=1", timeout=10).json()["loads"] == []
    bad = httpx.get(url + "/v1/loads?include=core,gpu", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include"
    legacy = httpx.get(url + "/get_load", timeout=10).json()
    assert legacy == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


def test_killed_worker_drains_to_the_other(gateways, workers):
    """Last in the module: it kills a worker. The busier one under cache_aware goes."""
    gateway = gateways["cache_aware"]
    counts = request_counts(workers)
    victim = counts.index(max(counts))
    survivor = workers[1 - victim]
    workers[victim].proc.kill()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # SMG's failure threshold: one failed probe, or request
        chat(gateway.url, group_messages()[0][1])
        states = {w["url"]: w["is_healthy"] for w in gateway.workers()}
        if states.get(workers[victim].url) is False:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"SMG never marked the killed worker down: {gateway.workers()}")
    before = request_counts([survivor])[0]
    statuses = [chat(gateway.url, messages).status_code for _, messages in group_messages()[:24]]
    assert statuses == [200] * 24, statuses
    assert request_counts([survivor])[0] - before == 24


def test_dp_size_starts_replicas_and_stops_them(tiny_model_dir, tmp_path):
    port = free_port_run(2)
    log = tmp_path / "dp.log"
    cmd = [sys.executable, "-m", "radixrt.cli", "launch", "--dp-size", "2", "--device", "cpu"]
    cmd += ["--model-path", tiny_model_dir("llama"), *WORKER_FLAGS, "--port", str(port)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "replicas ready" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.5)
        urls = [f"http://127.0.0.1:{p}" for p in (port, port + 1)]
        assert f"--worker-urls {' '.join(urls)}" in log.read_text()
        for url in urls:
            assert httpx.get(url + "/get_load", timeout=10).json()[0]["dp_rank"] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert not any(_port_busy(p) for p in (port, port + 1)), "a replica outlived the stop"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_dead_replica_stops_the_rest(caplog):
    """supervise() with stand-in replicas: one exits, the other is stopped, the status is 1."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    replicas = [
        dp_launch.Replica(0, 1, subprocess.Popen(sleeper)),
        dp_launch.Replica(1, 2, subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])),
    ]
    args = ServerArgs(dp_size=2, port=1)
    with caplog.at_level(logging.ERROR, logger="radixrt.server"):
        assert dp_launch.supervise(args, replicas, []) == 1
        dp_launch.stop_all(replicas)
    assert "replica 1 (port 2" in caplog.text and "exited with status 3" in caplog.text
    assert replicas[0].proc.returncode == -signal.SIGTERM


def test_replica_flags_pass_everything_but_the_rank_count():
    args = ServerArgs(
        dp_size=3,
        port=31000,
        api_key="secret",
        disable_radix_cache=True,
        device="cpu",
        kv_events_config='{"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}',
    )
    flags = dp_launch.replica_flags(args, 2)
    assert "--dp-size" not in flags and "secret" not in flags and "--api-key" not in flags
    assert flags[flags.index("--port") + 1] == "31002"
    assert "--disable-radix-cache" in flags and flags[flags.index("--device") + 1] == "cpu"
    events = flags[flags.index("--kv-events-config") + 1]
    assert '"tcp://*:5559"' in events and '"tcp://*:5560"' in events
    assert int(flags[flags.index("--num-threads") + 1]) >= 1
    assert dp_launch.replica_env(args, 2)["RADIXRT_API_KEY"] == "secret"


def _port_busy(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    except httpx.ConnectError:
        return False
    except httpx.HTTPError:
        return True
    return True
