"""The live page of the cache on a real `radixrt launch` (tiny random model, byte-level
tokenizer: previews are the prompts' own text): GET /cache_tree's shape, bounds and errors, the
API key on it and on /dashboard (Bearer, and Basic for browsers), and the page itself rendered
by headless Chromium after a few shared-prefix requests."""

from __future__ import annotations

import base64
import html
import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from launch_helpers import LaunchedServer, server_stats

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import create_prefix_cache
from radixrt.cache.radix_cache import RadixCache
from radixrt.entrypoints.dashboard import add_previews
from radixrt.scheduler.cache_snapshot import cache_snapshot

KEY = "sk-dash-123"
SHARED = "Shared system prompt for the dashboard test. "  # its first 24 bytes: the preview
QUESTIONS = ["Question one?", "Question two!", "Another ask", "Something else entirely"]
UNRELATED = "Completely unrelated prompt"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return tiny_model_dir("llama", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def guarded(launch_server, model) -> LaunchedServer:
    server = launch_server(
        "--model-path", model, "--dtype", "float32", "--max-total-tokens", "8192", api_key=KEY
    )
    for text in [SHARED + q for q in QUESTIONS] + [UNRELATED]:
        generate(server, text, max_new_tokens=3)
    return server


def generate(server: LaunchedServer, text: str, **params: Any) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"temperature": 0, **params}}
    r = httpx.post(server.url + "/generate", json=body, headers=server.headers, timeout=120)
    r.raise_for_status()
    return r.json()


def cache_tree(server: LaunchedServer, **params: Any) -> dict[str, Any]:
    r = httpx.get(server.url + "/cache_tree", params=params, headers=server.headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def nodes_of(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node] + [n for child in node["children"] for n in nodes_of(child)]


def depth_of(node: dict[str, Any]) -> int:
    return 1 + max((depth_of(c) for c in node["children"]), default=-1)


def shown_tokens(node: dict[str, Any]) -> int:
    """A node's tokens, its described descendants' and its summaries': its subtree."""
    more = node["more"]["tokens"] if node["more"] else 0
    return node["tokens"] + more + sum(shown_tokens(c) for c in node["children"])


def test_cache_tree_holds_the_shared_prefix_and_adds_up(guarded):
    data = cache_tree(guarded, depth=64, max_nodes=1000)
    stats = server_stats(guarded)
    tree, pool = data["tree"], data["kv_pool"]
    assert data["radix_cache"] is True and tree["complete"]
    cached = stats["evictable_tokens"] + stats["protected_tokens"]
    assert tree["total_tokens"] == tree["root"]["subtree_tokens"] == cached > len(SHARED)
    assert sum(n["tokens"] for n in nodes_of(tree["root"])) == cached
    (shared,) = [n for n in nodes_of(tree["root"]) if n["preview"] == SHARED[:24]]
    assert shared["tokens"] >= len(SHARED) and len(shared["children"]) >= 2
    assert shared["evictable"] and shared["lock_ref"] == 0 and shared["last_access_s"] >= 0
    for node in nodes_of(tree["root"]):
        sizes = [c["subtree_tokens"] for c in node["children"]]
        assert sizes == sorted(sizes, reverse=True)
        assert node["subtree_tokens"] == shown_tokens(node)
    assert pool["in_use_pages"] + pool["cached_pages"] + pool["free_pages"] == pool["pages"]
    assert pool["cached_tokens"] == cached and pool["tokens"] == stats["max_total_num_tokens"]
    assert data["stats"]["prompt_tokens"] >= len(SHARED) * len(QUESTIONS)


def test_depth_and_max_nodes_bound_the_tree_and_summarise_the_rest(guarded):
    full = cache_tree(guarded, depth=64, max_nodes=1000)["tree"]
    assert full["total_nodes"] >= 6 and depth_of(full["root"]) >= 3
    for params in [{"depth": 1}, {"max_nodes": 2}, {"depth": 2, "max_nodes": 3}]:
        tree = cache_tree(guarded, **params)["tree"]
        nodes = nodes_of(tree["root"])
        assert depth_of(tree["root"]) <= params.get("depth", 64)
        assert len(nodes) - 1 == tree["nodes_shown"] <= params.get("max_nodes", 1000)
        assert any(n["more"] for n in nodes), params
        assert shown_tokens(tree["root"]) == full["total_tokens"]
    assert cache_tree(guarded)["tree"]["depth"] == 6  # the defaults
    assert cache_tree(guarded, depth=0)["tree"]["root"]["more"]["tokens"] == full["total_tokens"]


@pytest.mark.parametrize(
    ("param", "value"),
    [("depth", "-1"), ("depth", "65"), ("depth", "two"), ("max_nodes", "0"), ("max_nodes", "1e3")],
)
def test_bad_bounds_are_400s_naming_the_parameter(guarded, param, value):
    r = httpx.get(guarded.url + "/cache_tree", params={param: value}, headers=guarded.headers)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert f"{param} must be an integer from" in error["message"]
    assert repr(value) in error["message"]


def test_running_requests_lock_their_prefix(guarded):
    rid = "dash-long-1"
    body = {
        "rid": rid,
        "text": SHARED + "A long answer, please",
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
    }
    worker = threading.Thread(
        target=httpx.post,
        args=(guarded.url + "/generate",),
        kwargs={"json": body, "headers": guarded.headers, "timeout": 120},
    )
    worker.start()
    try:
        data = wait_for(lambda: running_snapshot(guarded))
        (req,) = data["requests"]["running"]
        assert req["rid"] == rid and req["prompt_tokens"] == len(SHARED) + 21
        assert req["cached_tokens"] >= len(SHARED) and data["requests"]["num_running"] == 1
        locked = [n for n in nodes_of(data["tree"]["root"])[1:] if n["lock_ref"] > 0]
        assert locked and all(not n["evictable"] and n["last_access_s"] == 0 for n in locked)
        assert data["kv_pool"]["in_use_pages"] >= data["kv_pool"]["locked_cache_pages"] > 0
    finally:
        httpx.post(guarded.url + "/abort_request", json={"rid": rid}, headers=guarded.headers)
        worker.join(timeout=60)


def running_snapshot(server: LaunchedServer) -> dict[str, Any] | None:
    data = cache_tree(server)
    return data if data["requests"]["running"] else None


def wait_for(probe, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while not (result := probe()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_api_key_guards_the_page_and_its_data(guarded):
    url = guarded.url
    for path in ["/cache_tree", "/dashboard", "/dashboard/dashboard.js"]:
        refused = httpx.get(url + path)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == 'Basic realm="radixrt"'
        for wrong in [basic("admin", "nope"), basic("admin", ""), {"Authorization": "Basic !!"}]:
            assert httpx.get(url + path, headers=wrong).status_code == 401, (path, wrong)
        assert httpx.get(url + path, headers=guarded.headers).status_code == 200, path
        assert httpx.get(url + path, headers=basic("anyone", KEY)).status_code == 200, path
    # API routes refuse alike, without asking a browser for a password.
    api = httpx.get(url + "/v1/models")
    assert api.status_code == 401 and "www-authenticate" not in api.headers
    assert httpx.get(url + "/v1/models", headers=basic("u", KEY)).status_code == 200
    page = httpx.get(url + "/dashboard", headers=guarded.headers)
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    missing = httpx.get(url + "/dashboard/secrets.txt", headers=guarded.headers)
    assert missing.status_code == 404


def render(url: str, profile: Path) -> str:
    """The page's DOM after its script has run a few refreshes in headless Chromium."""
    if not Path(CHROMIUM).exists():
        pytest.skip("headless Chromium (Debian's chromium, /usr/bin/chromium) is not installed")
    cmd = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=4000",
        "--dump-dom",
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_chromium_renders_the_tree_and_the_pool_with_the_api_key(guarded, tmp_path):
    host = guarded.url.removeprefix("http://")
    # URL credentials reach the server as a Basic header (never in the request line or log),
    # the way a browser sends what its password prompt was given.
    dom = render(f"http://viewer:{KEY}@{host}/dashboard", tmp_path / "with-key")
    tree = cache_tree(guarded, depth=6, max_nodes=200)["tree"]
    (shared,) = [n for n in nodes_of(tree["root"]) if n["preview"] == SHARED[:24]]
    assert 'class="preview">' + SHARED[:24] in dom
    assert f"{shared['tokens']} tok</span>" in dom
    assert f"{tree['total_tokens']:,} tokens cached" in dom
    for node in nodes_of(tree["root"])[1:]:  # every described node, with its preview
        assert f'class="preview">{html.escape(node["preview"], quote=False)}' in dom
    assert "evictable</span>" in dom and "lock 0" in dom
    for part in ("in-use", "cached", "free"):
        assert f'class="seg seg-{part}"' in dom
    assert 'id="pool-bar"' in dom and "Cached (evictable): " in dom
    assert "Updated " in dom and "Error" not in dom
    assert KEY not in guarded.log_text()
    refused = render(f"http://{host}/dashboard", tmp_path / "without-key")
    assert SHARED[:24] not in refused and 'id="pool-bar"' not in refused


def test_without_the_radix_cache_the_page_says_so(tmp_path):
    """The page against a stand-in server whose /cache_tree is the scheduler's snapshot of the
    no-sharing cache (--disable-radix-cache; a second real server would double this module's
    time)."""
    cache = create_prefix_cache("none", PageAllocator(512, 1))
    stats = {
        "steps": 4,
        "spec_draft_tokens": 40,
        "spec_accepted_tokens": 30,
        "beam_groups": 3,
        "beam_shared_tokens": 90,
        "beam_copied_tokens": 10,
    }
    snapshot = cache_snapshot(cache, [], [], stats, depth=6, max_nodes=200)
    assert snapshot["radix_cache"] is False and snapshot["tree"] is None
    with StaticServer(json.dumps(snapshot).encode()) as url:
        dom = render(url + "/dashboard", tmp_path / "no-cache")
    assert "The radix cache is disabled" in dom and 'class="seg seg-free"' in dom
    assert "Free: 512 pages, 512 tokens (100.0%)" in dom
    # Speculative decoding's acceptance, from the stats the snapshot carries.
    assert "Speculative drafts accepted (since start)" in dom and ">75.0 %<" in dom
    # Beam search's groups and the share of forked KV shared rather than copied.
    assert "Beam groups running" in dom and "Beam KV shared, not copied" in dom
    assert ">90.0 %<" in dom


class StaticServer:
    """The dashboard's files and a fixed /cache_tree body, on a loopback port."""

    def __init__(self, cache_tree_body: bytes) -> None:
        files = {"/cache_tree": (cache_tree_body, "application/json")}
        for name in ("dashboard.html", "dashboard.js", "dashboard.css"):
            kind = {"html": "text/html", "js": "text/javascript", "css": "text/css"}
            body = (resources.files("radixrt.entrypoints") / "static" / name).read_bytes()
            path = "/dashboard" if name.endswith(".html") else f"/dashboard/{name}"
            files[path] = (body, kind[name.rsplit(".", 1)[1]])

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body, kind = files.get(self.path.split("?")[0], (b"", "text/plain"))
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", kind)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_previews_are_decoded_in_the_http_process_and_absent_without_a_tokenizer():
    cache = RadixCache(PageAllocator(64, 1))
    slots = cache.allocator.alloc_slots(5, None)
    assert slots is not None and cache.insert([72, 105, 33, 10, 7], slots) == 0
    snapshot = cache_snapshot(cache, [], [], {}, depth=6, max_nodes=200)

    class ByteTokenizer:
        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            assert skip_special_tokens is False  # a template's markers are shown
            return bytes(ids).decode()

    add_previews(snapshot, ByteTokenizer())
    (node,) = snapshot["tree"]["root"]["children"]
    assert node["preview"] == "Hi!\n\x07" and snapshot["tree"]["root"]["preview"] is None
    add_previews(snapshot, None)
    assert node["preview"] is None and node["preview_ids"] == [72, 105, 33, 10, 7]
