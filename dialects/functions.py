"""Finding the program in a module: its one public `func.func`."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, SSAValue

NAME_ATTR = "partir.name"
"""Argument/result attribute holding the value's pytree path (set by the importer)."""


def entry_function(module: ModuleOp) -> func.FuncOp:
    """The module's public `func.func` (JAX names it `main`)."""
    public = [
        op
        for op in module.body.block.ops
        if isinstance(op, func.FuncOp)
        and (op.sym_visibility is None or op.sym_visibility.data == "public")
    ]
    if len(public) != 1:
        names = ", ".join(f"@{f.sym_name.data}" for f in public) or "none"
        raise ValueError(f"expected one public func.func in the module, found {names}")
    return public[0]


def enclosing_function(value: SSAValue) -> func.FuncOp:
    """The `func.func` whose body defines `value`."""
    owner = value.owner
    op = owner.parent_op() if isinstance(owner, Block) else owner
    while op is not None and not isinstance(op, func.FuncOp):
        op = op.parent_op()
    if op is None:
        raise ValueError(f"{value} is not defined inside a func.func")
    return op
