"""The markdown report of scripts/bench_pd.py: the chat streams of both setups side by side
with ratios (b)/(a), then the transfer against recomputing, then what the logs said."""

from __future__ import annotations

import argparse
import math

Row = tuple[str, float, float]


def _num(x: float, digits: int = 1) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.{digits}f}"


def _ratio(a: float, b: float) -> str:
    return "-" if not a or math.isnan(a) or math.isnan(b) else f"{b / a:.2f}x"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def chat_rows(args: argparse.Namespace, a: dict, b: dict) -> list[Row]:
    """(label, value of a, value of b); latencies in ms."""

    def pick(key: str, i: int | None = None) -> tuple[float, float]:
        return (a[key], b[key]) if i is None else (a[key][i], b[key][i])

    slo = f"TTFT < {args.slo_ttft:g} s and own ITL p99 < {1000 * args.slo_itl:g} ms"
    return [
        ("TTFT p50 ms", *pick("ttft_ms", 0)),
        ("TTFT p99 ms", *pick("ttft_ms", 2)),
        ("TPOT p50 ms", *pick("tpot_ms", 0)),
        ("ITL p50 ms", *pick("itl_ms", 0)),
        ("ITL p99 ms", *pick("itl_ms", 2)),
        ("ITL p99 ms, gaps overlapping a document's prefill", *pick("itl_during_prefill_ms", 1)),
        ("ITL p99 ms, all other gaps", *pick("itl_outside_prefill_ms", 1)),
        ("gaps overlapping a document's prefill", *pick("itl_gaps_during_prefill")),
        ("output throughput, chat tok/s", *pick("output_throughput")),
        (f"goodput % ({slo})", 100 * a["goodput_fraction"], 100 * b["goodput_fraction"]),
        ("goodput, chats/s", *pick("goodput_rps")),
        ("documents: TTFT p50 ms", *pick("doc_ttft_ms_p50")),
        ("run duration s", *pick("duration_s")),
    ]


def chat_table(args: argparse.Namespace, a: dict, b: dict) -> str:
    rows = [
        [label, _num(x, 0 if isinstance(x, int) else 1), _num(y, 0 if isinstance(y, int) else 1)]
        + [_ratio(x, y)]
        for label, x, y in chat_rows(args, a, b)
    ]
    done = [
        f"{s['completed']}/{s['chats']} chats, {s['docs_completed']} docs"
        + (f", {s['failed'] + s['docs_failed']} failed" if s["failed"] + s["docs_failed"] else "")
        for s in (a, b)
    ]
    rows.insert(0, ["completed", *done, ""])
    head = ["chat streams", "(a) one server, 2 threads", "(b) P/D via SMG, 1 + 1", "(b)/(a)"]
    return _table(head, rows)


def _per_1k(seconds: float, tokens: float) -> float:
    return 1e6 * seconds / tokens if tokens else math.nan


def transfer_table(args: argparse.Namespace, a: dict, b: dict) -> str:
    """Milliseconds per 1,000 tokens and per page, moving against recomputing."""
    page = args.page_size
    pre, dec = b["counters"]["prefill"], b["counters"]["decode"]
    tokens = pre.get("disagg_transfer_tokens", 0)
    send = _per_1k(pre.get("disagg_transfer_seconds", 0.0), tokens)
    store = _per_1k(dec.get("disagg_transfer_seconds", 0.0), dec.get("disagg_transfer_tokens", 0))
    one, two = b["prefill_idle"], a["prefill_idle"]
    idle = b["via_smg_idle"]
    rows: list[tuple[str, float, str]] = [
        ("prefill side: gather + send (run)", send, ""),
        ("decode side: store (run)", store, ""),
        (
            "both sides (run)",
            send + store,
            _ratio(one["ms_per_1k"], send + store) + " of recomputing, 1 thread",
        ),
        (f"recompute: (a), 2 threads, idle, {two['tokens']} tokens", two["ms_per_1k"], ""),
        (
            f"recompute: prefill server, 1 thread, idle, {one['tokens']} tokens",
            one["ms_per_1k"],
            "",
        ),
    ]
    out = [[label, _num(v, 2), _num(v * page / 1000, 3), note] for label, v, note in rows]
    table = _table(
        ["per token moved or computed", "ms / 1k tokens", f"ms / page ({page})", ""], out
    )
    fails = [s.get("disagg_transfer_failures", 0) for s in (pre, dec)]
    nbytes = pre.get("disagg_transfer_bytes", 0)
    lines = [
        table,
        "",
        f"- Transfers in the run: {pre.get('disagg_transfers', 0):.0f} sent, "
        f"{dec.get('disagg_transfers', 0):.0f} received, failures {fails[0]:.0f} (prefill) / "
        f"{fails[1]:.0f} (decode); {tokens:,.0f} tokens, {nbytes / 2**20:,.1f} MiB, "
        f"{_num(nbytes / tokens if tokens else math.nan, 0)} bytes per token; the decode side "
        f"reused {dec.get('disagg_reused_tokens', 0):,.0f} tokens from its own cache.",
        f"- One {idle['tokens']}-token document alone through SMG: TTFT "
        f"{_num(idle['ttft_s'] * 1e3)} ms, against {_num(one['ttft_s'] * 1e3)} ms for a "
        "same-length one sent to the prefill "
        f"server directly (its transfer: {_idle_sides(idle)}).",
    ]
    return "\n".join(lines)


def _idle_sides(idle: dict) -> str:
    parts = []
    for side, verb in (("prefill", "gather + send"), ("decode", "store")):
        c = idle["counters"][side]
        parts.append(f"{verb} {_num(1e3 * c.get('disagg_transfer_seconds', 0.0))} ms")
    return ", ".join(parts)


def log_lines(run: dict) -> list[str]:
    out = []
    for name, (count, first) in run["logs"].items():
        if count:
            out.append(f"- {name}: {count} log lines with errors, aborts or warnings, e.g.:")
            out += [f"    {line[:200]}" for line in first[:4]]
        else:
            out.append(f"- {name}: no errors, aborts or warnings in its log")
    out += [f"- client error: {e[:200]}" for e in run["errors"]]
    return out


def contention(a: dict, b: dict) -> str:
    """Whether someone else used the cores while the runs ran (the figures assume not)."""
    parts = [
        f"{name}: {run['cpu']['others_s']:.1f} core-s ({run['cpu']['others_pct']:.0f}% of the "
        "cores)"
        for name, run in (("(a)", a), ("(b)", b))
    ]
    worst = max(a["cpu"]["others_pct"], b["cpu"]["others_pct"])
    warn = " -- the machine was not quiet: rerun before trusting these figures" if worst > 5 else ""
    return f"CPU used by other processes during the runs: {', '.join(parts)}{warn}"


def report(args: argparse.Namespace, a: dict, b: dict, cpu: str, command: str) -> str:
    workload = (
        f"{args.chats} chat streams at {args.chat_rate:g}/s (outputs "
        f"{args.chat_output[0]}-{args.chat_output[1]} tokens, prompts "
        f"{'-'.join(map(str, a['chat_prompt_tokens']))} tokens) and {args.docs} documents of "
        f"{'-'.join(map(str, args.doc_tokens))} tokens (outputs "
        f"{args.doc_output[0]}-{args.doc_output[1]}), seed {args.seed}, page size "
        f"{args.page_size}"
    )
    parts = [
        f"CPU: {cpu}",
        f"Command: `{command}`",
        f"Workload: {workload}",
        contention(a, b),
        "",
        chat_table(args, a, b),
        "",
        transfer_table(args, a, b),
        "",
        "Servers:",
        *[f"- (a) `{c}`" for c in a["commands"].values()],
        *[f"- (b) `{c}`" for c in b["commands"].values()],
        "",
        "Logs:",
        *log_lines(a),
        *log_lines(b),
    ]
    return "\n".join(parts)
