"""Applying a schedule of tactics: plan all, then tile and propagate, in order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp

from dialects.errors import PartirValueError
from dialects.functions import entry_function
from dialects.partir import MeshOp
from partir.mesh import Mesh
from partir.tactics import ProgramView, Tactic
from rewrites.actions import TileAction
from rewrites.conflicts import Conflict


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
            raise PartirValueError(
                f"the module declares mesh {existing.axes}, but {mesh.axes} was given; "
                "give the module's mesh, or start from a module without one"
            )
        return existing
    op = mesh.to_op()
    first = module.body.block.first_op
    if first is None:
        module.body.block.add_op(op)
    else:
        module.body.block.insert_op_before(op, first)
    return op


def partition(
    module: ModuleOp,
    mesh: Mesh,
    tactics: Sequence[Tactic],
    *,
    keep_stages: bool = False,
    verify: bool = False,
) -> Partitioned:
    """Apply `tactics` to `module` (in place), each followed by propagation.

    Every tactic is planned (and so checked) before the first rewrite; then
    each runs as `passes.apply_tactic`, the pass `partir-opt` runs too. With
    `verify`, the dialect verifier runs after each tactic.
    """
    from partir.passes import apply_tactic, recorded_conflicts

    view = ProgramView.of(entry_function(module))
    for tactic in tactics:
        tactic.plan(view, mesh)
    declare_mesh(module, mesh)
    result = Partitioned(module)
    if keep_stages:
        result.stages.append(Stage("import", str(module)))
    for tactic in tactics:
        result.actions += apply_tactic(module, tactic)
        if verify:
            module.verify()
        if keep_stages:
            result.stages.append(Stage(tactic.name, str(module)))
    result.conflicts = recorded_conflicts(module)
    return result
