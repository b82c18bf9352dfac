"""Finding the program in a module: its one public `func.func`."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import Block, SSAValue

NAME_ATTR = "partir.name"
"""Argument/result attribute holding the value's pytree path (set by the importer)."""

WHOLE_OVER = "partir.whole_over"
"""Result attribute: the mesh axes (strings) the entry function returns that
result whole over, however the step computes it (ZeRO-1's updated
parameters, returned as they came: the SPMD lowering gathers them before
the return)."""


def whole_over(entry: func.FuncOp, index: int) -> tuple[str, ...]:
    """The axes result `index` of `entry` is returned whole over."""
    if entry.res_attrs is None or index >= len(entry.res_attrs.data):
        return ()
    kept = entry.res_attrs.data[index].data.get(WHOLE_OVER)
    if not isinstance(kept, ArrayAttr):
        return ()
    return tuple(a.data for a in kept.data if isinstance(a, StringAttr))


def return_whole_over(entry: func.FuncOp, index: int, axis: str) -> None:
    """Mark result `index` of `entry` returned whole over `axis` too."""
    count = len(entry.function_type.outputs)
    attrs = [dict(d.data) for d in entry.res_attrs.data] if entry.res_attrs else [
        {} for _ in range(count)
    ]
    axes = whole_over(entry, index)
    if axis not in axes:
        attrs[index][WHOLE_OVER] = ArrayAttr([StringAttr(a) for a in (*axes, axis)])
    entry.res_attrs = ArrayAttr([DictionaryAttr(d) for d in attrs])


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
