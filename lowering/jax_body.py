"""The body emitter: the state of writing one `_body` function.

`BodyEmitter` hands out the generated names (`v3` for values, `_reducer_0`
for nested functions), collects the indented output lines, the `_CONSTANTS`
table and the dtypes used, and dispatches each op to its emitter in
`lowering.jax_ops.EMITTERS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from xdsl.ir import Attribute, Operation, SSAValue

from dialects import spmd
from lowering.jax_ir import (
    UnsupportedOpError,
    element_dtype,
    op_position,
    tensor_type,
    unsupported,
)
from lowering.jax_literals import dtype_literal
from lowering.jax_ops import EMITTERS

Emitter = Callable[["BodyEmitter", Operation], "str | None"]
"""Returns the expression assigned to the op's results, or None if it wrote
everything itself (aliases)."""


class BodyEmitter:
    """Emission state: generated names, output lines, the constants table."""

    def __init__(self) -> None:
        self.names: dict[SSAValue, str] = {}
        self.lines: list[str] = []
        self.constants: dict[str, str] = {}
        self.dtypes: set[np.dtype] = set()
        self._indent = 1
        self._values = 0
        self._functions = 0

    # names and output

    def name(self, value: SSAValue) -> str:
        try:
            return self.names[value]
        except KeyError:
            owner = value.owner if isinstance(value.owner, Operation) else None
            where = f" ({op_position(owner)})" if owner is not None else ""
            raise UnsupportedOpError(f"value {value} is used before it is defined{where}") from None

    def args(self, op: Operation) -> str:
        return ", ".join(self.name(v) for v in op.operands)

    def define(self, value: SSAValue) -> str:
        name = f"v{self._values}"
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
        expression = emitter(self, op)
        if expression is None:
            return
        targets = ", ".join(self.define(r) for r in op.results)
        self.write(f"{targets} = {expression}")
