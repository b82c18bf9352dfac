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
from partir.values import references
from rewrites.conflicts import Conflict
from rewrites.projection import Tiling, follow, tilings
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
    refs = references(entry)
    out = []
    for n, op in enumerate(entry.body.block.ops):
        if isinstance(op, LoopOp | MeshOp | func.ReturnOp):
            continue
        name = names.get(op.results[0], f"%{n}") if op.results else op.name
        ref = refs.get(op)
        rule = rule_for(op)
        if rule is None:
            out.append(ReplicatedOp(name, op_name(op), OPAQUE, opaque_reason(op), reference=ref))
            continue
        reaching = [(i, t) for i, v in enumerate(op.operands) for t in tilings(v)]
        conflict = _conflict_at(op, reaching, arg_names, conflicts)
        if conflict is not None:
            out.append(ReplicatedOp(name, op.name, CONFLICT, str(conflict), conflict, ref))
        elif reaching:
            why = _why_blocked(rule, reaching, mesh)
            out.append(ReplicatedOp(name, op.name, BLOCKED, why, reference=ref))
        else:
            why = "no tiled operand reached it"
            out.append(ReplicatedOp(name, op.name, UNTILED, why, reference=ref))
    return out


def _arg_names(entry: func.FuncOp) -> dict[SSAValue, str]:
    attrs = list(entry.arg_attrs.data) if entry.arg_attrs else []
    out: dict[SSAValue, str] = {}
    for arg, a in zip(entry.body.block.args, attrs, strict=False):
        name = _partir_name(a)
        if name is not None:
            out[arg] = name
    return out


def _conflict_at(
    op: Operation,
    reaching: list[tuple[int, Tiling]],
    arg_names: dict[SSAValue, str],
    conflicts: Sequence[Conflict],
) -> Conflict | None:
    """The conflict record naming `op`: same op kind, and one of the values it
    names reaches an operand (as an argument or through a tiling's action)."""
    names = {arg_names[v] for v in op.operands if isinstance(v, BlockArgument) and v in arg_names}
    names |= {t.origin.value.data for _, t in reaching if t.origin is not None}
    return next((c for c in conflicts if c.op == op.name and names & set(c.values)), None)


def _why_blocked(rule: OpRule, reaching: list[tuple[int, Tiling]], mesh: Mesh) -> str:
    """Why the op did not follow its operands' tilings: propagation's own answer
    (`projection.follow`) for each."""
    reasons = []
    for i, t in reaching:
        where = f'operand {i} is tiled on dim {t.dim} over "{t.axis}"'
        why = follow(rule, i, t.dim, mesh.get(t.axis, 1))
        if isinstance(why, int):
            why = "tileable, but propagation has not moved it"
        reasons.append(f"{where}: {why}")
    return "; ".join(dict.fromkeys(reasons))
