"""The body emitter: the state of writing one generated function.

`BodyEmitter` hands out the generated names (`v3` for values, `_reducer_0`
for nested functions), collects the indented output lines, and dispatches
each op to its emitter in `lowering.jax_ops.EMITTERS`. What the whole module
shares (the `_CONSTANTS` table, the dtypes used) lives in `ModuleTables`.

An emitter for a part of the program (`lowering.jax_parts`) is given the
names of the values defined before it (`outer`): a value it uses from there
becomes a parameter (`p0`, `p1`, ... in order of first use), and its own
values are named `x0`, `x1`, ... So two parts whose ops are the same up to
renaming come out as the same text.

Each op's statement ends in a comment saying where the user's code made the
op (`ModuleTables.note`: its `file:line` and JAX name stack, escaped). The
comments are kept beside the lines (`BodyEmitter.notes`), not in them, so
parts that differ only in where their ops came from still share a function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from xdsl.ir import Attribute, Operation, SSAValue

from dialects import spmd
from dialects.locations import source_location
from lowering.jax_ir import (
    UnsupportedOpError,
    element_dtype,
    op_position,
    tensor_type,
    unsupported,
)
from lowering.jax_literals import comment_text, dtype_literal
from lowering.jax_ops import EMITTERS

Emitter = Callable[["BodyEmitter", Operation], "str | None"]
"""Returns the expression assigned to the op's results, or None if it wrote
everything itself (aliases)."""


class ModuleTables:
    """What every function of one generated module shares."""

    def __init__(self) -> None:
        self.constants: dict[str, str] = {}
        """`_CONSTANTS` key -> the expression rebuilding the array."""
        self.dtypes: set[np.dtype] = set()
        self.helpers: dict[str, str] = {}
        """Name -> source of the module-level helper functions the body calls."""
        self._keys: dict[str, str] = {}
        self._notes: dict[int, str | None] = {}

    def helper(self, name: str, source: str) -> str:
        """`name`, whose definition `source` the module then includes once."""
        self.helpers.setdefault(name, source)
        return name

    def constant(self, entry: str) -> str:
        """The `_CONSTANTS` key of `entry`: named by content, so equal
        constants are stored once and equal parts read the same key."""
        key = self._keys.get(entry)
        if key is None:
            key = self._keys[entry] = f"c{len(self._keys)}"
            self.constants[key] = entry
        return key

    def note(self, op: Operation) -> str | None:
        """The comment for `op`'s statement: `file:line name/stack` of its
        location, escaped for a comment, or None if it has neither. Read once
        per location (ops share them; the module keeps them alive)."""
        location = op.location
        key = id(location)
        if key not in self._notes:
            text = source_location(location).describe()
            self._notes[key] = comment_text(text) if text else None
        return self._notes[key]


class BodyEmitter:
    """Emission state of one function: generated names, output lines."""

    def __init__(
        self,
        tables: ModuleTables | None = None,
        *,
        outer: dict[SSAValue, str] | None = None,
        prefix: str = "v",
    ) -> None:
        self.tables = tables or ModuleTables()
        self.names: dict[SSAValue, str] = {}
        self.lines: list[str] = []
        self.notes: dict[int, str] = {}
        """Index in `lines` -> the trailing comment of that line (`source`)."""
        self.outer = outer
        """Names of the values defined before this function (they become parameters)."""
        self.params: list[SSAValue] = []
        """The outer values used, in order of first use (parameter `p{i}`)."""
        self._prefix = prefix
        self._indent = 1
        self._values = 0
        self._functions = 0

    @property
    def constants(self) -> dict[str, str]:
        return self.tables.constants

    @property
    def dtypes(self) -> set[np.dtype]:
        return self.tables.dtypes

    # names and output

    def name(self, value: SSAValue) -> str:
        name = self.names.get(value)
        if name is not None:
            return name
        if self.outer is not None and value in self.outer:
            name = self.names[value] = f"p{len(self.params)}"
            self.params.append(value)
            return name
        owner = value.owner if isinstance(value.owner, Operation) else None
        where = f" ({op_position(owner)})" if owner is not None else ""
        raise UnsupportedOpError(f"value {value} is used before it is defined{where}")

    def args(self, op: Operation) -> str:
        return ", ".join(self.name(v) for v in op.operands)

    def define(self, value: SSAValue) -> str:
        name = f"{self._prefix}{self._values}"
        self._values += 1
        self.names[value] = name
        return name

    def alias(self, value: SSAValue, existing: SSAValue) -> None:
        self.names[value] = self.name(existing)

    def fresh_function(self, prefix: str) -> str:
        name = f"_{prefix}_{self._functions}"
        self._functions += 1
        return name

    def write(self, line: str) -> None:
        self.lines.append("    " * self._indent + line)

    def source(self) -> list[str]:
        """The lines, each op's statement with its note as a trailing comment."""
        return noted(self.lines, self.notes)

    @contextlib.contextmanager
    def indented(self) -> Iterator[None]:
        self._indent += 1
        try:
            yield
        finally:
            self._indent -= 1

    def dtype(self, op: Operation, ty: Attribute) -> str:
        dtype = element_dtype(op, ty)
        self.dtypes.add(dtype)
        try:
            return dtype_literal(dtype)
        except UnsupportedOpError as error:
            raise unsupported(op, str(error)) from None

    # ops

    def emit_ops(self, ops: Sequence[Operation]) -> None:
        for op in ops:
            self.emit_op(op)

    def emit_op(self, op: Operation) -> None:
        emitter = EMITTERS.get(op.name)
        if emitter is None:
            raise unsupported(op, "no JAX translation for this op")
        if not isinstance(op, spmd.FromLocalOp):
            for result in op.results:
                tensor_type(op, result.type)
        start = len(self.lines)
        expression = emitter(self, op)
        if expression is not None:
            targets = ", ".join(self.define(r) for r in op.results)
            self.write(f"{targets} = {expression}")
        if len(self.lines) > start:  # its statement is the last line it wrote
            note = self.tables.note(op)
            if note is not None:
                self.notes.setdefault(len(self.lines) - 1, note)


def noted(lines: Sequence[str], notes: dict[int, str]) -> list[str]:
    """`lines`, each one `notes` has a comment for ending in it."""
    return [f"{line}  # {notes[i]}" if i in notes else line for i, line in enumerate(lines)]
