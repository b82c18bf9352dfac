"""Applying a schedule of tactics: plan all, then tile and propagate, in order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from dialects.partir import MeshOp, OriginAttr
from partir.importer import entry_function
from partir.mesh import Mesh
from partir.tactics import PlannedTile, ProgramView, Tactic
from rewrites.actions import TileAction, apply_tile_action
from rewrites.conflicts import Conflict, ConflictLog
from rewrites.propagation import propagate


@dataclass(frozen=True)
class Stage:
    """The IR after one step of the schedule, as text."""

    name: str
    text: str


@dataclass
class Partitioned:
    module: ModuleOp
    conflicts: list[Conflict] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    actions: list[TileAction] = field(default_factory=list)


def declare_mesh(module: ModuleOp, mesh: Mesh) -> MeshOp:
    """Add the mesh to the module, or check the one it declares matches."""
    existing = next((op for op in module.body.block.ops if isinstance(op, MeshOp)), None)
    if existing is not None:
        if existing.axes != mesh.axes:
            raise ValueError(f"the module declares mesh {existing.axes}, but {mesh.axes} was given")
        return existing
    op = mesh.to_op()
    first = module.body.block.first_op
    if first is None:
        module.body.block.add_op(op)
    else:
        module.body.block.insert_op_before(op, first)
    return op


def _value(entry: func.FuncOp, planned: PlannedTile) -> SSAValue:
    if planned.leaf.kind == "argument":
        return entry.body.block.args[planned.leaf.index]
    ret = entry.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    return ret.arguments[planned.leaf.index]


def partition(
    module: ModuleOp,
    mesh: Mesh,
    tactics: Sequence[Tactic],
    *,
    keep_stages: bool = False,
    verify: bool = False,
) -> Partitioned:
    """Apply `tactics` to `module` (in place), each followed by propagation.

    Every tactic is planned (and so checked) before the first rewrite. With
    `verify`, the dialect verifier runs after each tactic's propagation.
    """
    entry = entry_function(module)
    view = ProgramView.of(entry)
    plans = [(tactic, tactic.plan(view, mesh)) for tactic in tactics]
    mesh_op = declare_mesh(module, mesh)
    result = Partitioned(module)
    if keep_stages:
        result.stages.append(Stage("import", str(module)))
    log = ConflictLog()
    number = 0
    for tactic, planned in plans:
        for tile in planned:
            number += 1
            action = TileAction(
                _value(entry, tile),
                tile.dim,
                tile.axis,
                OriginAttr(number, tactic.name),
                tile.leaf.name,
            )
            result.actions.append(action)
            apply_tile_action(action, mesh_op, log)
        propagate(module, log)
        if verify:
            module.verify()
        if keep_stages:
            result.stages.append(Stage(tactic.name, str(module)))
    result.conflicts = list(log.conflicts)
    return result
