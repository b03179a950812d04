"""xgrammar in a child process (grammar/xgrammar_process.py), as a process that cannot import
torch runs it: the same verdicts and messages as on threads, the same timeout, and a child
that dies is replaced. Here torch can be imported, so the tests choose the child by hand."""

from __future__ import annotations

import time

import pytest

from radixrt.errors import ParamError
from radixrt.grammar import xgrammar_process
from radixrt.grammar.checker import ConstraintChecker
from radixrt.grammar.constraint import check_constraint

pytestmark = pytest.mark.slow  # each test starts the xgrammar child, which imports torch

VOCAB = 49152
CONSTRAINTS = [
    ("regex", "[0-9]+"),
    ("regex", ""),
    ("json_schema", '{"type": "object"}'),
    ("regex", "\u0016"),  # no token can start it
    ("ebnf", 'root ::= "\\x16"'),
    ("regex", "(ab"),
    ("json_schema", '{"type": "no-such-type"}'),
    ("ebnf", "root ::= "),
    ("structural_tag", '{"type": "structural_tag", "format": {"type": "nope"}}'),
]


@pytest.fixture
def in_child(monkeypatch):
    monkeypatch.setattr(xgrammar_process, "needed", lambda: True)


def outcome(check, kind: str, text: str) -> tuple[str | None, str] | None:
    try:
        check(kind, text)
    except ParamError as e:
        return e.param, str(e)
    return None


def test_the_child_gives_the_verdicts_and_messages_of_the_threads(default_tokenizer, monkeypatch):
    threads = ConstraintChecker(default_tokenizer, VOCAB, timeout_s=30)
    monkeypatch.setattr(xgrammar_process, "needed", lambda: True)
    child = ConstraintChecker(default_tokenizer, VOCAB, timeout_s=30)
    try:
        for kind, text in CONSTRAINTS:
            expected = outcome(threads.check, kind, text)
            assert outcome(child.check, kind, text) == expected, (kind, text)
        assert outcome(child.check, "regex", "\u0016") is not None  # the list can fail
    finally:
        threads.close()
        child.close()


def test_check_constraint_parses_in_the_child_with_the_same_messages(monkeypatch):
    parse = check_constraint.__wrapped__  # not the cache
    expected = [outcome(parse, kind, text) for kind, text in CONSTRAINTS]
    monkeypatch.setattr(xgrammar_process, "needed", lambda: True)
    assert [outcome(parse, kind, text) for kind, text in CONSTRAINTS] == expected
    assert any(expected)


def test_a_slow_compile_times_out_in_the_child_too(default_tokenizer, in_child):
    checker = ConstraintChecker(default_tokenizer, VOCAB, timeout_s=0.2)
    # ~0.65 s to compile for the default tokenizer (its span of 0-9 a-z and space must meet
    # most of the vocabulary; "[a-z]{1,50000}" now takes 0.2 s); "started" comes within 0.1 s
    slow = "[a-z0-9 ]{1,5000}x"
    try:
        checker.check("regex", "[0-9]")  # the child's start is not the request's time
        with pytest.raises(ParamError, match="did not compile within 0.2 s"):
            checker.check("regex", slow)
        start = time.monotonic()
        with pytest.raises(ParamError, match="did not compile within"):
            checker.check("regex", slow)
        assert time.monotonic() - start < 0.04  # the verdict, not a second compile
    finally:
        checker.close()


def test_a_dead_child_fails_what_it_held_and_the_next_check_starts_another(
    default_tokenizer, in_child
):
    checker = ConstraintChecker(default_tokenizer, VOCAB, timeout_s=30)
    try:
        checker.check("regex", "[0-9]+")
        first = xgrammar_process.shared()
        first._proc.kill()
        first._proc.wait()
        # Failed at once, or when the reader sees the end of the pipe: never left waiting.
        with pytest.raises(RuntimeError, match="exited"):
            first.call("parse", kind="regex", text="[0-9]").result(timeout=30)
        with pytest.raises(ParamError, match="can never be satisfied"):
            checker.check("regex", "\u0016")
        assert xgrammar_process.shared() is not first
    finally:
        checker.close()
