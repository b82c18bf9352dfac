"""What the JAX emitter reads from the IR, and how it fails.

`UnsupportedOpError` is the one error of the emitter (`lowering.to_jax`
re-exports it): an op or type without a faithful translation. The accessors
here read integer attributes and static tensor types of an op and raise it,
naming the op and where it is, for anything the generated code cannot express.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType
from xdsl.ir import Attribute, Operation, SSAValue

from dialects.dtypes import ElementTypeError, numpy_dtype
from dialects.errors import UnsupportedError
from dialects.names import op_name


class UnsupportedOpError(UnsupportedError):
    """An op (or type) the JAX emitter has no faithful translation for."""


def op_position(op: Operation) -> str:
    """Where `op` is: `op #3 of @main`, or `op #1 in op #7 of @main` for region ops."""
    parts: list[str] = []
    current: Operation | None = op
    while current is not None and not isinstance(current, func.FuncOp | ModuleOp):
        block = current.parent_block()
        index = list(block.ops).index(current) if block is not None else -1
        parts.append(f"op #{index}")
        current = current.parent_op()
    where = " in ".join(parts)
    if isinstance(current, func.FuncOp):
        where += f" of @{current.sym_name.data}"
    return where


def unsupported(op: Operation, reason: str) -> UnsupportedOpError:
    printed = str(op).splitlines()
    text = printed[0].strip() if printed else op_name(op)
    if len(text) > 160:
        text = text[:157] + "..."
    return UnsupportedOpError(
        f"cannot emit {op_name(op)} ({op_position(op)}) as JAX: {reason}: {text}"
    )


OpEmitter = Callable[..., "str | None"]
"""An entry of a class-keyed emitter table: it is called as `(BodyEmitter, op)`
with an op of its key's class, which its signature names (so the type checker
checks the fields it reads); see `lowering.jax_body.Emitter`."""


def by_name(table: dict[type[Operation], Any]) -> dict[str, Any]:
    """Key a table by op name: dialect extensions may replace an op's class
    (e.g. `dialects.stablehlo_ext.ReduceOp`) but keep its name and fields."""
    return {cls.name: value for cls, value in table.items()}


def int_value(attr: IntegerAttr) -> int:
    return int(attr.value.data)


def tensor_type(op: Operation, ty: Attribute) -> TensorType:
    if not isinstance(ty, TensorType):
        raise unsupported(op, f"{ty} is not a tensor type")
    if any(d < 0 for d in ty.get_shape()):
        raise unsupported(op, f"{ty} has dynamic dimensions")
    return ty


def static_shape(op: Operation, value: SSAValue) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor_type(op, value.type).get_shape())


def element_dtype(op: Operation, ty: Attribute) -> np.dtype:
    element = ty.element_type if isinstance(ty, TensorType) else ty
    try:
        return numpy_dtype(element)
    except ElementTypeError as error:
        raise unsupported(op, f"no NumPy/JAX dtype for {element}") from error
