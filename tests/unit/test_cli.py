"""The command line as a user meets it: `radixrt --version`, `launch --help` grouped by subsystem
with every default, and bad flags as one line with exit status 2, before any model loads. Each
test runs `python -m radixrt.cli` as a subprocess (no torch is imported on these paths)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from radixrt.server_args import ServerArgs


def run_cli(*args: str) -> subprocess.CompletedProcess:
    # A wide terminal: argparse then puts each option and its help on one line.
    env = {**os.environ, "COLUMNS": "1000"}
    return subprocess.run(
        [sys.executable, "-m", "radixrt.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def flag(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def test_version_prints_the_installed_version():
    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"radixrt {importlib.metadata.version('radixrt')}"


def help_sections(text: str) -> dict[str, list[str]]:
    """Section title -> its options, each '--flag METAVAR  help' on one line (argparse puts a
    long flag's help on the next line), from argparse's help text."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif line.startswith("  -"):
            current.append(line.strip())
        elif line.startswith("    ") and current:
            current[-1] += " " + line.strip()
    return sections


@pytest.fixture(scope="module")
def launch_help() -> dict[str, list[str]]:
    out = run_cli("launch", "--help")
    assert out.returncode == 0, out.stderr
    return help_sections(out.stdout)


def test_launch_help_groups_every_flag_under_its_subsystem(launch_help):
    groups = ServerArgs.field_groups()
    assert len(groups) >= 6, "ServerArgs lost its subsystem groups"
    assert sum(len(fields) for _, fields in groups) == len(dataclasses.fields(ServerArgs))
    for title, fields in groups:
        assert title in launch_help, f"no section {title!r} in --help: {list(launch_help)}"
        flags = [line.split()[0] for line in launch_help[title]]
        assert flags == [flag(f) for f in fields], title


def test_launch_help_shows_every_default(launch_help):
    lines = {line.split()[0]: line for section in launch_help.values() for line in section}
    for f in dataclasses.fields(ServerArgs):
        line = lines[flag(f)]
        assert "default" in line, f"no default shown for {flag(f)}: {line}"
        if "default:" in f.metadata["help"]:
            continue  # the help says what a derived default is
        shown = "off" if f.default is False else str(f.default)
        assert line.endswith(f"(default: {shown})"), line


def test_generate_help_has_its_own_group_and_the_server_groups():
    out = run_cli("generate", "--help")
    assert out.returncode == 0, out.stderr
    sections = help_sections(out.stdout)
    assert [line.split()[0] for line in sections["Generate"]] == [
        "--prompt",
        "--sampling-params",
        "--stream",
    ]
    assert "Memory and KV cache" in sections


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--page-size", "0"], ["page_size", ">= 1"]),
        (["--schedule-policy", "nope"], ["--schedule-policy", "'lpm'"]),
        (["--max-running-requests", "many"], ["--max-running-requests", "int"]),
        (["--sampling-params", "{"], ["--sampling-params", "JSON"]),
        (["--sampling-params", "[1]"], ["--sampling-params", "object"]),
        (["--kv-events-config", '{"bogus": 1}'], ["kv_events_config", "bogus", "endpoint"]),
        (["--tp-size", "0"], ["tp_size", ">= 1"]),
        (["--nnodes", "2", "--node-rank", "2"], ["node_rank", "0..1"]),
        (["--speculative-algorithm", "EAGLE"], ["--speculative-algorithm", "'NGRAM'"]),
        (["--speculative-num-draft-tokens", "1"], ["speculative_num_draft_tokens", ">= 2"]),
        (
            ["--speculative-ngram-min-match-window-size", "13"],
            ["speculative_ngram_min_match_window_size", "<= speculative_ngram_max"],
        ),
        (["--disaggregation-mode", "both"], ["--disaggregation-mode", "'prefill'"]),
        (["--disaggregation-mode", "decode", "--tp-size", "2"], ["tp_size must be 1"]),
        (
            ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "30000"],
            ["disaggregation_bootstrap_port must differ from port"],
        ),
        (
            ["--disaggregation-mode", "decode", "--disaggregation-transfer-timeout", "0"],
            ["disaggregation_transfer_timeout must be > 0"],
        ),
        (["--disaggregation-failure-policy", "retry"], ["'recompute', 'fail'"]),
    ],
)
def test_generate_reports_a_bad_flag_in_one_line_before_loading(args, names):
    # The model path does not exist: an error about it would mean the engine started first.
    out = run_cli("generate", "--prompt", "hi", "--model-path", "/no/such/model", *args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("radixrt generate"), lines[0]
    for name in names:
        assert name in lines[0], lines[0]
    assert "/no/such/model" not in out.stderr and out.stdout == ""


def test_launch_and_an_unknown_flag_also_fail_in_one_line():
    for args, pattern in (
        (["launch", "--page-size", "0"], r"^radixrt launch: page_size must be >= 1, got 0$"),
        (["launch", "--bogus"], r"^radixrt: error: unrecognized arguments: --bogus"),
    ):
        out = run_cli(*args)
        assert out.returncode == 2, out.stderr
        assert re.match(pattern, out.stderr.strip()) and out.stderr.count("\n") == 1, out.stderr
