"""Which IR stage a module is at, and its SPMD form (`spmd_form`).

The report and the cost model read a module at any stage the same way: from
its SPMD form, where every value has its distributed type and every
collective is an op.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from dialects.functions import entry_function
from dialects.partir import MeshOp, find_mesh
from dialects.spmd import SPMD, DTensorType
from lowering.to_spmd import lower_to_spmd

_SPMD_OPS = {op.name for op in SPMD.operations}


def is_spmd(entry: func.FuncOp) -> bool:
    return any(isinstance(a.type, DTensorType) for a in entry.body.block.args) or any(
        op.name in _SPMD_OPS for op in entry.body.block.ops
    )


def spmd_form(module: ModuleOp) -> ModuleOp:
    """`module` itself if it is SPMD; else a clone lowered with
    `lower_to_spmd` (core stage), over an empty mesh where it declares none
    (plain StableHLO: every value replicated). `module` is not modified."""
    if is_spmd(entry_function(module)):
        return module
    spmd = module.clone()
    if find_mesh(entry_function(spmd)) is None:
        first = spmd.body.block.first_op
        assert first is not None  # the module holds its entry function
        spmd.body.block.insert_op_before(MeshOp({}), first)
    lower_to_spmd(spmd)
    return spmd
