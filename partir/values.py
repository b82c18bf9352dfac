"""Naming a value inside the program, so a tactic can tile it.

Tactics select arguments and results by pytree path (`partir.selectors`).
A value the program computes has no path, so partir names it by where JAX
made it: the `@`-reference of the op computing it,

    @jit(step)/jvp(mlp)/tanh at layers.py:42#2

its JAX name stack, the file (base name) and line of the user's frame, and
`#k`: it is the k-th op so made among the ops of the entry function that
are still whole (outside every loop), in program order. A reference is
read where the tactic naming it applies, on the program the tactics before
it left, so a schedule replayed from the start finds the same op again:
that is what makes a search's pick (`partir.search`) pasteable.
`ManualPartition({"@...": {dim: axis}})` tiles it (an argument's path never
starts with `@`); the report lists each replicated op's reference
(`partir.report.replicated`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue

from dialects.errors import PartirValueError
from dialects.escaping import quoted
from dialects.locations import source_location
from dialects.partir import LoopOp, MeshOp

MARK = "@"
"""What starts a value reference (never a pytree path: an argument's root
is a Python identifier, `args` or `result`)."""

_AT = " at "


class ValueReferenceError(PartirValueError):
    """A reference that names no value of the program, or several."""


@dataclass(frozen=True)
class ValueKey:
    """Where JAX made an op: its name stack and the user's `file:line` (base name)."""

    name_stack: str
    position: str | None

    def text(self, occurrence: int) -> str:
        where = f"{_AT}{self.position}" if self.position else ""
        return f"{MARK}{self.name_stack}{where}#{occurrence}"


def is_reference(text: str) -> bool:
    return text.startswith(MARK)


@dataclass(frozen=True)
class ValueReference:
    """A parsed `@name stack at file:line#k`."""

    key: ValueKey
    occurrence: int
    text: str

    @staticmethod
    def parse(text: str) -> ValueReference:
        if not is_reference(text):
            raise ValueReferenceError(
                f"{quoted(text)} is not a value reference; write "
                '"@<name stack> at <file>:<line>#<k>", as the report lists them'
            )
        body, hash_, count = text[len(MARK) :].rpartition("#")
        if not hash_ or not count.isdigit() or int(count) < 1:
            body, count = text[len(MARK) :], "1"
        stack, at, position = body.rpartition(_AT)
        if not at:
            stack, position = body, ""
        if not stack:
            raise ValueReferenceError(
                f"{quoted(text)} names no op: write the op's JAX name stack after `@` "
                "(e.g. @jit(step)/tanh at model.py:12#1)"
            )
        return ValueReference(ValueKey(stack, position or None), int(count), text)


def value_key(op: Operation) -> ValueKey | None:
    """The key of the op's location, or None when JAX recorded no name stack."""
    where = source_location(op.location)
    if where.name_stack is None:
        return None
    position = f"{os.path.basename(where.file)}:{where.line}" if where.file else None
    return ValueKey(where.name_stack, position)


def _whole_ops(entry: func.FuncOp) -> Iterator[Operation]:
    """The entry's ops outside every loop that compute a value."""
    for op in entry.body.block.ops:
        if not isinstance(op, LoopOp | MeshOp | func.ReturnOp) and op.results:
            yield op


def references(entry: func.FuncOp) -> dict[Operation, str]:
    """Every whole op of `entry` with a name stack, and its reference."""
    seen: dict[ValueKey, int] = {}
    found: dict[Operation, str] = {}
    for op in _whole_ops(entry):
        key = value_key(op)
        if key is None:
            continue
        seen[key] = seen.get(key, 0) + 1
        found[op] = key.text(seen[key])
    return found


def find_value(entry: func.FuncOp, text: str) -> SSAValue:
    """The value `text` (a reference) names in `entry` as it is now: the
    result of the op it names, which must have one tensor result."""
    ref = ValueReference.parse(text)
    matches = [
        op
        for op in _whole_ops(entry)
        if (key := value_key(op)) is not None
        and key == ref.key
    ]
    if len(matches) < ref.occurrence:
        near = [r for op, r in references(entry).items() if ref.key.name_stack in r][:5]
        hint = (
            "; references with that name stack: " + ", ".join(quoted(r) for r in near)
            if near
            else "; partir-inspect's report lists each replicated op's reference"
        )
        raise ValueReferenceError(
            f"{quoted(text)}: {len(matches)} op(s) outside every loop match it, so there is "
            f"no #{ref.occurrence} (an earlier tactic may have tiled it already){hint}"
        )
    op = matches[ref.occurrence - 1]
    tensors = [r for r in op.results if isinstance(r.type, TensorType)]
    if len(op.results) != 1 or not tensors:
        raise ValueReferenceError(
            f"{quoted(text)} names `{op.name}`, which has {len(op.results)} results; "
            "only an op with one tensor result can be tiled by reference"
        )
    return tensors[0]
