"""An op's name as the user wrote it, also for ops no dialect defines."""

from __future__ import annotations

from xdsl.dialects.builtin import UnregisteredOp
from xdsl.ir import Operation


def op_name(op: Operation) -> str:
    """`stablehlo.sort`, not xDSL's `builtin.unregistered`, for unknown ops."""
    return op.op_name.data if isinstance(op, UnregisteredOp) else op.name
