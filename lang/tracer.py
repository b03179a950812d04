"""Tracing: run a program's Python body against a recorder instead of a model.

`Function.trace()` gives the program's IR (its expressions in order; arguments not given and
variables read are placeholders such as "{docs}"). `run_batch` traces each program only up to
its first generation to find the text every program of the batch starts with, and caches it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixrt.lang import ir
from radixrt.lang.chat_template import ChatTemplate
from radixrt.lang.state import Appending


class StopTracing(Exception):
    """Raised in prefix-only tracing at the first thing that needs the model."""


class Placeholder(str):
    """A value tracing does not know (an argument not given, a generated variable)."""


@dataclass
class Fork(ir.Expr):
    size: int
    branches: list[list[ir.Expr]] = field(default_factory=list)


@dataclass
class ProgramIR:
    name: str
    nodes: list[ir.Expr]

    def __str__(self) -> str:
        return f"program {self.name}\n" + "\n".join(_lines(self.nodes, "  "))

    def leading_text(self, template: ChatTemplate) -> str:
        """The text before the first generation (roles rendered with `template`)."""
        from radixrt.lang.executor import render_constant

        return render_constant(self.nodes, template)


class TracerState(Appending):
    """Looks like a ProgramState to the program; records what it is given."""

    def __init__(self, nodes: list[ir.Expr], prefix_only: bool) -> None:
        self.nodes = nodes
        self.prefix_only = prefix_only

    def __iadd__(self, other: Any) -> TracerState:
        expr = ir.to_expr(other)
        for item in expr.items if isinstance(expr, ir.ExprList) else [expr]:
            if self.prefix_only and not isinstance(item, (ir.Text, ir.RoleBegin, ir.RoleEnd)):
                raise StopTracing
            self.nodes.append(item)
        return self

    def get_var(self, name: str) -> Placeholder:
        if self.prefix_only:
            raise StopTracing
        return Placeholder("{" + name + "}")

    __getitem__ = get_var

    def set_var(self, name: str, value: Any) -> None:
        pass  # a recorder keeps no values

    __setitem__ = set_var

    def fork(self, size: int = 1) -> list[TracerState]:
        if self.prefix_only:
            raise StopTracing
        node = Fork(size, [[] for _ in range(size)])
        self.nodes.append(node)
        return _TracerGroup([TracerState(b, False) for b in node.branches])

    def copy(self) -> TracerState:
        return self.fork(1)[0]

    def text(self) -> str:
        return self.get_var("text")


class _TracerGroup(list):
    def __iadd__(self, other: Any) -> _TracerGroup:
        for i, state in enumerate(self):
            if callable(other) and not isinstance(other, ir.Expr):
                state += other(i)
            else:
                state += other[i] if isinstance(other, (list, tuple)) else other
        return self

    def __setitem__(self, i: int, value: Any) -> None:
        if value is not self[i]:
            raise TypeError(f"forks[{i}] = ...: a fork's branches cannot be replaced")

    def join(self, mode: str = "gather_variable") -> None:
        pass


def trace(
    func: Callable, name: str, arguments: dict[str, Any], prefix_only: bool = False
) -> ProgramIR:
    """Record func(state, **arguments); with prefix_only, stop at the first generation."""
    nodes: list[ir.Expr] = []
    with contextlib.suppress(StopTracing):
        func(TracerState(nodes, prefix_only), **arguments)
    return ProgramIR(name, nodes)


def _lines(nodes: list[ir.Expr], indent: str) -> list[str]:
    lines = []
    for node in nodes:
        if isinstance(node, Fork):
            lines.append(f"{indent}Fork(size={node.size})")
            for i, branch in enumerate(node.branches):
                lines.append(f"{indent}  branch {i}:")
                lines.extend(_lines(branch, indent + "    "))
        else:
            lines.append(indent + repr(node))
    return lines
