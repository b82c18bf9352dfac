"""A plan on the module: its tiles as tile actions, then propagation
(`apply_plan`), or as the seeds the decided path propagates
(`plan_seeds`); the mesh they run over (`declare_mesh`).

Both number the plan's tiles after the actions the module has taken, so
either path records the same origins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from dialects.errors import PartirValueError
from dialects.escaping import quoted
from dialects.functions import entry_function, return_whole_over
from dialects.heap import paused_gc
from dialects.locations import in_scope
from dialects.partir import ACTIONS, LoopOp, MeshOp, OriginAttr, find_mesh
from partir.annotation_conflicts import mark_whole_dims, split_whole_dims
from partir.annotations import annotated_value, remove_annotations, set_aside_jax_meshes
from partir.mesh import Mesh
from partir.plan import (
    AnnotatedValue,
    Plan,
    PlannedTile,
    ReferencedValue,
    ScopedValue,
    TacticError,
)
from partir.selections import record_selections
from partir.values import ValueReferenceError, find_value
from rewrites.actions import ActionError, TileAction, apply_tactic_action, take_action_numbers
from rewrites.conflicts import Conflict, ConflictLog, describe_origin, record_conflicts
from rewrites.factor_propagation import Seed
from rewrites.propagation import propagate


def module_mesh(module: ModuleOp, who: str) -> MeshOp:
    mesh = find_mesh(module)
    if mesh is None:
        raise PassFailedException(
            f'{who}: the module declares no mesh; add `partir.mesh @mesh ["batch" = 4]` '
            'or run partir-declare-mesh{axes="batch=4"} first'
        )
    return mesh


def declare_mesh(module: ModuleOp, mesh: Mesh) -> MeshOp:
    """Add the mesh to the module, or check the one it declares matches
    (JAX's own meshes set aside: `set_aside_jax_meshes`)."""
    set_aside_jax_meshes(module)
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


def _leaf_value(
    entry: func.FuncOp,
    tile: PlannedTile,
    referenced: dict[ReferencedValue | AnnotatedValue, SSAValue],
) -> SSAValue:
    leaf = tile.leaf
    if isinstance(leaf, ReferencedValue | AnnotatedValue):
        return referenced[leaf]  # read before the plan's first tile
    if isinstance(leaf, ScopedValue):
        return scoped_value(entry, leaf)
    if leaf.kind == "argument":
        return entry.body.block.args[leaf.index]
    ret = entry.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    return ret.arguments[leaf.index]


def _referenced_value(entry: func.FuncOp, value: ReferencedValue) -> SSAValue:
    try:
        return find_value(entry, value.name)
    except ValueReferenceError as err:
        raise TacticError(str(err)) from None


def _dim_of(value: SSAValue, dim: int) -> int:
    """`dim`, counted from the front (a value named inside the program is
    planned before its rank is known, so its dim may count from the end)."""
    ty = value.type
    rank = ty.get_num_dims() if isinstance(ty, TensorType) else 0
    return dim + rank if -rank <= dim < 0 else dim


def scoped_value(entry: func.FuncOp, value: ScopedValue) -> SSAValue:
    """The last result of `value.shape` an op made under `value.scope` computes."""
    for op in reversed(list(entry.body.block.ops)):
        if not in_scope(op, value.scope):
            continue
        for result in op.results:
            ty = result.type
            if isinstance(ty, TensorType) and tuple(ty.get_shape()) == value.shape:
                return result
    raise TacticError(
        f"{value.name}: no value of shape {list(value.shape)} is made under scope "
        f"{quoted(value.scope)} (the value may be a constant, or already tiled)"
    )


def _inside_loop(value: SSAValue, tile: PlannedTile, origin: OriginAttr, log: ConflictLog) -> bool:
    """Whether an annotated value is computed inside a loop over the tile's
    axis (`Annotations` placed after a tactic whose propagation reached it):
    that earlier split stands, and is reported as a conflict, since the
    annotation cannot be checked against a part of the value."""
    op = value.owner if isinstance(value.owner, Operation) else value.owner.parent_op()
    loop = op.parent_op() if op is not None else None
    while loop is not None and not (isinstance(loop, LoopOp) and loop.axis_name == tile.axis):
        loop = loop.parent_op()
    if loop is None:
        return False
    log.record(
        Conflict(
            op="annotation",
            values=(tile.label or tile.leaf.name,),
            axis=tile.axis,
            winner=describe_origin(loop.origin),
            loser=origin.describe(),
            detail=f"{tile.reason} asks for dim {tile.dim}, but the value is computed per part "
            f"inside that action's loop over {quoted(tile.axis)}, whose split stands; place "
            "Annotations first (the default) for the annotation to win",
        )
    )
    return True


def apply_plan(module: ModuleOp, plan: Plan) -> list[TileAction]:
    """Tile what `plan` names, in order, record what it chose and why on the
    module (`partir.selections`), then propagate; returns the actions."""
    with paused_gc():
        mesh_op = module_mesh(module, plan.tactic)
        entry = entry_function(module)
        first = take_action_numbers(module, len(plan))
        log = ConflictLog()
        # references name ops of the program as the tactics before this one left
        # it: read them all before this plan's tiles add ops of their own
        referenced: dict[ReferencedValue | AnnotatedValue, SSAValue] = {
            tile.leaf: _referenced_value(entry, tile.leaf)
            for tile in plan
            if isinstance(tile.leaf, ReferencedValue)
        }
        if plan.removes_annotations:
            for leaf, value in take_annotations(module, plan).items():
                referenced[leaf] = value
        actions = []
        dims: dict[tuple[str, int], int] = {}
        for number, tile in enumerate(plan, start=first):
            label = tile.label or tile.leaf.name
            origin = OriginAttr(number, plan.tactic, label)
            value = _leaf_value(entry, tile, referenced)
            dim = dims[tile.leaf.name, tile.dim] = _dim_of(value, tile.dim)
            if isinstance(tile.leaf, AnnotatedValue) and _inside_loop(value, tile, origin, log):
                continue
            action = TileAction(value, dim, tile.axis, origin, label)
            try:
                apply_tactic_action(action, mesh_op, log)
            except ActionError as err:  # e.g. a dim the tactics before split too finely
                raise tactic_error(plan, tile, err) from None
            actions.append(action)
        for kept in plan.whole:
            return_whole_over(entry, kept.leaf.index, kept.axis)
        record_selections(
            module,
            [
                replace(s, dim=dims.get((s.leaf, s.dim), s.dim)) if s.dim is not None else s
                for s in plan.selections()
            ],
        )
        propagate(module, log)
        # an annotation's whole dims, checked against what this plan split
        record_conflicts(module, split_whole_dims(entry))
    return actions


def tactic_error(plan: Plan, tile: PlannedTile, err: ActionError) -> TacticError:
    """An action's error as the tactic's (an annotation's with its reason)."""
    if isinstance(tile.leaf, AnnotatedValue):
        return TacticError(f"{plan.tactic}: {tile.reason}: {err}")
    return TacticError(f"{plan.tactic}: {err}")


def take_annotations(module: ModuleOp, plan: Plan) -> dict[AnnotatedValue, SSAValue]:
    """Take JAX's shardings out of `module` for a plan that makes actions of
    them (`Plan.removes_annotations`): each annotated value the plan names,
    read first; what each annotation keeps whole, marked
    (`mark_whole_dims`, checked by `split_whole_dims` once the plan's
    splits are made); then no constraints."""
    entry = entry_function(module)
    found: dict[AnnotatedValue, SSAValue] = {}
    for tile in plan:
        if isinstance(tile.leaf, AnnotatedValue):
            leaf = tile.leaf
            found[leaf] = annotated_value(entry, leaf.kind, leaf.ordinal, leaf.position)
    mark_whole_dims(entry)
    remove_annotations(module)
    return found


def plan_seeds(
    module: ModuleOp,
    plans: list[Plan],
    annotated: Mapping[AnnotatedValue, SSAValue] | None = None,
) -> list[list[Seed]]:
    """Each plan's tiles as `rewrites.factor_propagation` seeds, numbered as
    `apply_plan` numbers their actions (after any the module has taken),
    against the module as it is (nothing is rewritten); `annotated`: the
    values `take_annotations` read."""
    entry = entry_function(module)
    current = module.attributes.get(ACTIONS)
    number = current.value.data if isinstance(current, IntegerAttr) else 0
    schedule = []
    for plan in plans:
        referenced: dict[ReferencedValue | AnnotatedValue, SSAValue] = {
            tile.leaf: _referenced_value(entry, tile.leaf)
            for tile in plan
            if isinstance(tile.leaf, ReferencedValue)
        }
        for leaf, value in (annotated or {}).items():
            referenced[leaf] = value
        seeds = []
        for tile in plan:
            number += 1
            label = tile.label or tile.leaf.name
            value = _leaf_value(entry, tile, referenced)
            origin = OriginAttr(number, plan.tactic, label)
            seeds.append(Seed(value, _dim_of(value, tile.dim), tile.axis, origin, label))
        schedule.append(seeds)
    return schedule
