"""The pure parts of scripts/bench_serving.py: statistics, workloads, request bodies, the table.
No server and no benchmark runs here."""

from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import bench_serving as bs  # noqa: E402


def test_percentile_interpolates_between_ranks():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert bs.percentile(xs, 50) == 3.0
    assert bs.percentile(xs, 0) == 1.0 and bs.percentile(xs, 100) == 5.0
    assert bs.percentile(xs, 95) == pytest.approx(4.8)  # numpy.percentile's "linear"
    assert bs.percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert bs.percentile([7.0], 99) == 7.0
    assert math.isnan(bs.percentile([], 50))


def test_summary_math():
    results = [
        bs.Result(
            ok=True,
            prompt_tokens=100,
            cached_tokens=80,
            output_tokens=11,
            ttft=0.5,
            latency=1.5,
            itl=[0.1] * 10,
        ),
        bs.Result(
            ok=True, prompt_tokens=100, cached_tokens=0, output_tokens=1, ttft=0.2, latency=0.2
        ),
        bs.Result(ok=False, error="HTTP 503", prompt_tokens=50, cached_tokens=50),
    ]
    s = bs.summarize(results, duration=2.0)
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 6.0
    assert s["cache_hit_rate"] == pytest.approx(0.4)  # failed requests do not count
    assert s["tpot_ms"] == pytest.approx([100.0] * 3)  # (1.5 - 0.5) / 10; one-token: none
    assert s["itl_ms"] == pytest.approx([100.0] * 3)
    assert s["ttft_ms"][0] == pytest.approx(350.0)
    empty = bs.summarize([bs.Result(ok=False)], duration=1.0)
    assert empty["completed"] == 0 and math.isnan(empty["cache_hit_rate"])
    assert "-" in bs.table_row("w", "s", empty)[6]


def test_shared_prefix_workload():
    reqs = bs.build_workload("shared-prefix", 20, seed=0)
    prompts = [r.prompt for r in reqs]
    assert len(prompts) == len(set(prompts)) == 20
    prefix = os.path.commonprefix(prompts)
    assert prefix.count("The answer is") == 5 and len(prefix) > 2000
    assert all(len(p) - len(prefix) < 300 for p in prompts)
    assert all(r.max_tokens == 32 and r.messages is None for r in reqs)
    assert bs.build_workload("shared-prefix", 20, seed=0) == reqs  # seeded
    assert bs.build_workload("shared-prefix", 20, seed=1) != reqs


def test_multi_turn_workload_and_its_groups():
    reqs = bs.build_workload("multi-turn", 12, seed=0, turns=3)
    assert len(reqs) == 12 and {r.conversation for r in reqs} == {0, 1, 2, 3}
    groups = bs._arrival_groups(reqs)
    assert len(groups) == 4 and all([r.turn for r in g] == [0, 1, 2] for g in groups)
    first, later = groups[0][0], groups[0][1]
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert [m["role"] for m in later.messages] == ["user"]
    assert bs._arrival_groups(bs.build_workload("skewed", 5, 0)) == [
        [r] for r in bs.build_workload("skewed", 5, 0)
    ]


def test_skewed_workload():
    reqs = bs.build_workload("skewed", 64, seed=3)
    lengths = sorted(r.max_tokens for r in reqs)
    assert lengths[-4:] == [256] * 4 and all(8 <= n <= 16 for n in lengths[:-4])
    words = [len(r.prompt.split()) for r in reqs]
    assert min(words) >= 20 and max(words) <= 100 and len({r.prompt for r in reqs}) == 64


def test_request_bodies_ask_exact_lengths_and_usage():
    chat = bs.Request(7, messages=[{"role": "user", "content": "hi"}])
    path, body = bs.request_body(chat, "m")
    assert path == "/v1/chat/completions" and body["messages"] == chat.messages
    assert body["ignore_eos"] and body["stream"] and body["max_tokens"] == 7
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "m"
    path, body = bs.request_body(bs.Request(3, prompt="x"), "m")
    assert path == "/v1/completions" and body["prompt"] == "x"
    assert bs._chunk_text({"choices": [{"delta": {"content": "a"}}]}) == "a"
    assert bs._chunk_text({"choices": [{"text": "b"}]}) == "b"
    assert bs._chunk_text({"choices": [], "usage": {}}) == ""
    usage = {
        "prompt_tokens": 9,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    res = bs._with_usage(bs.Result(ok=False), usage, chunks=2)
    assert res.ok and (res.prompt_tokens, res.output_tokens, res.cached_tokens) == (9, 3, 4)


def test_table_and_ratios():
    on = {
        "completed": 4,
        "failed": 0,
        "duration_s": 2.0,
        "request_throughput": 2.0,
        "output_throughput": 100.0,
        "ttft_ms": [10.0, 20.0, 30.0],
        "tpot_ms": [5.0, 5.0, 5.0],
        "itl_ms": [5.0, 6.0, 7.0],
        "cache_hit_rate": 0.9,
    }
    off = {
        **on,
        "duration_s": 4.0,
        "request_throughput": 1.0,
        "output_throughput": 50.0,
        "ttft_ms": [40.0, 40.0, 60.0],
        "cache_hit_rate": 0.0,
    }
    ratio = bs.ratio_row("w", on, off)
    assert ratio[4] == "2.00x" and ratio[5] == "2.00x"
    assert ratio[6] == "0.25x / 0.50x / 0.50x"
    text = bs.markdown([bs.table_row("w", "on", on), ratio])
    lines = text.splitlines()
    assert len(lines) == 4 and all(line.count("|") == len(bs.COLUMNS) + 1 for line in lines)
    assert "| w | on | 4 | 2.0 | 2.00 | 100.0 | 10 / 20 / 30 |" in text and "90.0%" in text


def test_arguments():
    args = bs.parse_args(["--workload", "skewed,multi-turn", "--request-rate", "4"])
    assert args.workloads == ("skewed", "multi-turn") and args.request_rate == 4.0
    assert bs.parse_args([]).workloads == bs.WORKLOADS
    assert bs.parse_args([]).request_rate == math.inf
    several = bs.parse_args(["--workload", "skewed", "--request-rate", "4,inf"])
    assert several.request_rates == [4.0, math.inf]
    assert [key for key, _, _ in bs.runs_of(several)] == ["skewed @ 4/s", "skewed @ inf/s"]
    assert [key for key, _, _ in bs.runs_of(args)] == ["skewed", "multi-turn"]
    for bad in ("fast", "0", "4,-1"):
        with pytest.raises(SystemExit):
            bs.parse_args(["--request-rate", bad])
    with pytest.raises(SystemExit):
        bs.parse_args(["--workload", "nope"])
