"""Ops left replicated: the core-stage ops outside every loop, and why each is."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue

from dialects.functions import entry_function
from dialects.mesh import Mesh
from dialects.names import op_name
from dialects.partir import LoopOp, MeshOp, find_mesh
from partir.report.names import _partir_name, ssa_names
from partir.report.rows import ReplicatedOp
from rewrites.conflicts import Conflict
from rewrites.distribution import Tiling, visible_tilings
from rewrites.registry import OpRule, opaque_reason, rule_for

OPAQUE = "opaque"
CONFLICT = "conflict"
BLOCKED = "blocked"
UNTILED = "untiled"


def replicated_ops(core: ModuleOp, conflicts: Sequence[Conflict]) -> list[ReplicatedOp]:
    """The ops of a core-stage module outside every loop, each with its reason."""
    entry = entry_function(core)
    names = ssa_names(core)
    arg_names = _arg_names(entry)
    mesh_op = find_mesh(entry)
    mesh = mesh_op.mesh if mesh_op is not None else Mesh.single_device()
    out = []
    for n, op in enumerate(entry.body.block.ops):
        if isinstance(op, LoopOp | MeshOp | func.ReturnOp):
            continue
        name = names.get(op.results[0], f"%{n}") if op.results else op.name
        rule = rule_for(op)
        if rule is None:
            out.append(ReplicatedOp(name, op_name(op), OPAQUE, opaque_reason(op)))
            continue
        tilings = [(i, t) for i, v in enumerate(op.operands) for t in visible_tilings(v)]
        conflict = _conflict_at(op, tilings, arg_names, conflicts)
        if conflict is not None:
            out.append(ReplicatedOp(name, op.name, CONFLICT, str(conflict), conflict))
        elif tilings:
            out.append(ReplicatedOp(name, op.name, BLOCKED, _why_blocked(rule, tilings, mesh)))
        else:
            out.append(ReplicatedOp(name, op.name, UNTILED, "no tiled operand reached it"))
    return out


def _arg_names(entry: func.FuncOp) -> dict[SSAValue, str]:
    attrs = list(entry.arg_attrs.data) if entry.arg_attrs else []
    out = {}
    for arg, a in zip(entry.body.block.args, attrs, strict=False):
        name = _partir_name(a)
        if name is not None:
            out[arg] = name
    return out


def _conflict_at(
    op: Operation,
    tilings: list[tuple[int, Tiling]],
    arg_names: dict[SSAValue, str],
    conflicts: Sequence[Conflict],
) -> Conflict | None:
    """The conflict record naming `op`: same op kind, and one of the values it
    names reaches an operand (as an argument or through a tiling's action)."""
    reaching = {
        arg_names[v] for v in op.operands if isinstance(v, BlockArgument) and v in arg_names
    }
    reaching |= {t.origin.value.data for _, t in tilings if t.origin is not None}
    return next((c for c in conflicts if c.op == op.name and reaching & set(c.values)), None)


def _why_blocked(rule: OpRule, tilings: list[tuple[int, Tiling]], mesh: Mesh) -> str:
    reasons = []
    for i, t in tilings:
        where = f'operand {i} is tiled on dim {t.dim} over "{t.axis}"'
        factor = rule.operand_factor(i, t.dim) if t.dim < len(rule.operands[i]) else None
        why = (
            "the dimension runs over no factor of the op"
            if factor is None
            else rule.why_not_tileable(factor, mesh.get(t.axis, 1))
        )
        reasons.append(f"{where}: {why or 'tileable, but propagation has not moved it'}")
    return "; ".join(dict.fromkeys(reasons))
