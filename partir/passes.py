"""Every partir pass, by name: the one registry `partir-opt` and `partir.jit` share.

A tactic is a pass: `tactic_pass` generates one from each dataclass of
`partir.tactics.TACTICS`, whose fields are the pass's options with the same
names and meaning (selectors as xDSL's `tuple[str, ...]` options). The pass
plans its tactic against the module and runs `ApplyPlanPass`, which is what
`partir.partition` runs with the plans it made up front: tile, then propagate,
numbering actions after any already in the module. Propagation records the
conflicts it finds on the module (`rewrites.conflicts`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from dialects.errors import PartirValueError
from dialects.escaping import quoted
from dialects.functions import entry_function, return_whole_over
from dialects.heap import paused_gc
from dialects.locations import in_scope
from dialects.partir import LoopOp, MeshOp, OriginAttr, find_mesh
from lowering.to_jax import emit_jax
from lowering.to_spmd import LowerToSpmdPass
from partir.annotation_conflicts import mark_whole_dims, split_whole_dims
from partir.annotations import annotated_value, remove_annotations, set_aside_jax_meshes
from partir.mesh import Mesh
from partir.plan import (
    AnnotatedValue,
    Leaf,
    Plan,
    PlannedTile,
    ProgramView,
    ReferencedValue,
    ScopedValue,
    TacticError,
    tactic_label,
)
from partir.selections import Selection, record_selections
from partir.tactics import TACTICS, Automatic, Tactic
from partir.values import ValueReferenceError, find_value
from rewrites.actions import ActionError, TileAction, apply_tactic_action, take_action_numbers
from rewrites.conflicts import Conflict, ConflictLog, describe_origin, record_conflicts
from rewrites.factor_propagation import Seed
from rewrites.inline_calls import InlineCallsPass
from rewrites.propagation import PropagatePass, propagate


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
        if plan.removes_annotations:  # each annotated value, then no constraints
            for tile in plan:
                if isinstance(tile.leaf, AnnotatedValue):
                    leaf = tile.leaf
                    referenced[leaf] = annotated_value(
                        entry, leaf.kind, leaf.ordinal, leaf.position
                    )
            mark_whole_dims(entry)
            remove_annotations(module)
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
                if isinstance(tile.leaf, AnnotatedValue):
                    raise TacticError(f"{plan.tactic}: {tile.reason}: {err}") from None
                raise TacticError(f"{plan.tactic}: {err}") from None
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


@dataclass(frozen=True)
class ApplyPlanPass(ModulePass):
    """Apply one tactic's plan and propagate (what `partir.partition` runs per
    tactic, with the plans it made and checked up front; not a CLI pass)."""

    name = "partir-apply-plan"
    plan: Plan | None = None
    tactic: Tactic | None = None
    """The tactic that made `plan`, planned again on the module as the
    tactics before left it where they split a leaf the plan names (the plan
    made up front saw whole shapes; ZeRO picks its dim per device)."""
    actions: list[TileAction] = field(default_factory=list, init=False, compare=False)
    """The actions taken, filled in by `apply`."""
    applied: list[Plan] = field(default_factory=list, init=False, compare=False)
    """The plan applied (`plan`, or the one made again), filled in by `apply`."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        assert self.plan is not None
        plan = self.plan
        if self.tactic is not None:
            view = ProgramView.of(entry_function(op))
            named = [t.leaf for t in plan] + [p.leaf for p in plan.passed]
            named += [w.leaf for w in plan.whole]
            if any(isinstance(leaf, Leaf) and leaf.name in view.splits for leaf in named):
                mesh = Mesh(module_mesh(op, plan.tactic).axes)
                plan = self.tactic.plan(view, mesh)
        self.applied[:] = [plan]
        self.actions[:] = apply_plan(op, plan)


@dataclass(frozen=True)
class AutomaticPass(ModulePass):
    """Run `Automatic`'s search on the module as the tactics before it left
    it, then apply the schedule it chose (or, for a decided `Automatic`, the
    schedule it chose before: no search). Not a CLI pass: `partir-auto` is."""

    name = "partir-apply-automatic"
    tactic: Automatic | None = None
    actions: list[TileAction] = field(default_factory=list, init=False, compare=False)
    results: list[Any] = field(default_factory=list, init=False, compare=False)
    """The `partir.search.SearchResult`, once `apply` has searched."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from partir.search import search

        assert self.tactic is not None
        mesh = Mesh(module_mesh(op, self.tactic.name).axes)
        chosen = self.tactic.chosen
        self.actions.clear()
        if chosen is None:
            searched = search(op, mesh, self.tactic)
            self.results[:] = [searched.result]
            if searched.module is not None:  # the pick's IR, as applying it would make it
                _adopt(op, searched.module)
                self.actions.extend(searched.actions)
                return
            chosen = searched.result.chosen.schedule
        view = ProgramView.of(entry_function(op))
        for tactic in chosen:
            self.actions.extend(apply_plan(op, tactic.plan(view, mesh)))


def _adopt(module: ModuleOp, other: ModuleOp) -> None:
    """Make `module` hold `other`'s body and attributes (`other` is a copy of
    `module` some passes have since rewritten; it is left empty)."""
    module.body.detach_block(0).erase()
    module.body.add_block(other.body.detach_block(0))
    module.attributes.clear()
    module.attributes.update(other.attributes)


@dataclass(frozen=True)
class TacticPass(ModulePass):
    """Base of the generated tactic passes: plan the tactic, apply the plan."""

    TACTIC: typing.ClassVar[type[Tactic]]

    def tactic(self) -> Tactic:
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        return self.TACTIC.from_options(**options)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        mesh = Mesh(module_mesh(op, self.TACTIC.__name__).axes)
        tactic = self.tactic()
        try:
            plan = tactic.plan(ProgramView.of(entry_function(op)), mesh)
            if isinstance(tactic, Automatic):  # searches the module as it is
                AutomaticPass(tactic).apply(ctx, op)
                return
        except TacticError as err:
            raise PassFailedException(str(err)) from err
        ApplyPlanPass(plan).apply(ctx, op)


_SCALARS = (str, int, bool, float)


def _option(tactic_field: dataclasses.Field[Any], hint: Any) -> tuple[str, Any, Any]:
    """A tactic field as a pass option: scalars keep their type and default
    (an optional scalar, such as a memory limit, stays optional; a float
    option takes ints too); selectors and specs become `tuple[str, ...]`
    (unset: the tactic's default)."""
    has_default = tactic_field.default is not dataclasses.MISSING
    if hint in _SCALARS:
        default = tactic_field.default if has_default else dataclasses.MISSING
        return tactic_field.name, hint, field(default=default)
    members = typing.get_args(hint)
    scalars = [m for m in members if m in _SCALARS]
    listed = any(typing.get_origin(m) is not None for m in members)  # Sequence[str]
    if tactic_field.default is None and len(scalars) == 1 and not listed:
        return tactic_field.name, scalars[0] | None, field(default=None)
    if has_default:
        return tactic_field.name, tuple[str, ...] | None, field(default=None)
    return tactic_field.name, tuple[str, ...], field()


def tactic_pass(tactic: type[Tactic]) -> type[TacticPass]:
    """The `partir-opt` pass of `tactic`: one option per dataclass field."""
    assert dataclasses.is_dataclass(tactic)  # every tactic is a dataclass; Tactic is not
    from partir.cost.profile import Profile  # named in Automatic's hints

    hints = typing.get_type_hints(tactic, localns={"Profile": Profile})
    options = [
        _option(f, hints[f.name])
        for f in dataclasses.fields(tactic)
        if f.metadata.get("pass_option", True)
    ]
    doc = (tactic.__doc__ or tactic.__name__).strip().splitlines()[0]
    return dataclasses.make_dataclass(
        f"{tactic.__name__}Pass",
        options,
        bases=(TacticPass,),
        frozen=True,
        namespace={
            "name": tactic.CLI_NAME,
            "TACTIC": tactic,
            "__doc__": doc,
            "__module__": __name__,
        },
    )


TACTIC_PASSES: dict[type[Tactic], type[TacticPass]] = {t: tactic_pass(t) for t in TACTICS}
"""Each tactic's generated pass."""


@dataclass(frozen=True)
class TilePass(ModulePass):
    """One tiling action on an argument (by index or name); run partir-propagate after."""

    name = "partir-tile"
    value: str | int = 0  # an argument index (value=0) or name (value=x)
    dim: int = 0
    axis: str = ""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        mesh_op = module_mesh(op, self.name)
        entry = entry_function(op)
        view = ProgramView.of(entry)
        value = str(self.value)
        if value.isdigit():
            index = int(value)
            if index >= len(view.arguments):
                raise PassFailedException(
                    f"{self.name}: the function has {len(view.arguments)} arguments, "
                    f"no argument {index}"
                )
            leaf = view.arguments[index]
        else:
            try:
                (leaf,) = view.find(value, who=self.name)
            except (TacticError, ValueError) as err:
                raise PassFailedException(str(err)) from err
        number = take_action_numbers(op, 1)
        action = TileAction(
            entry.body.block.args[leaf.index],
            self.dim,
            self.axis,
            OriginAttr(number, "partir-tile", leaf.name),
            leaf.name,
        )
        log = ConflictLog()
        try:
            apply_tactic_action(action, mesh_op, log)
        except ValueError as err:
            raise PassFailedException(f"{self.name}: {err}") from err
        record_conflicts(op, log.conflicts)
        rank = max(len(leaf.shape), 1)
        label = tactic_label(self.name, self.axis)
        chosen = Selection(label, leaf.name, self.dim % rank, self.axis, "named", f"value={value}")
        record_selections(op, [chosen])


@dataclass(frozen=True)
class DeclareMeshPass(ModulePass):
    """Declare the mesh: axes="batch=4","model=2" (no-op if the same mesh is there).

    One list item per axis, `name=size` (quoted, with escapes, as every pass
    option); an item with more than one `=` is refused rather than guessed at,
    since the old form `axes="batch=4,model=2"` would otherwise read as one axis
    named "batch=4,model".
    """

    name = "partir-declare-mesh"
    axes: tuple[str, ...]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        sizes: dict[str, int] = {}
        for item in self.axes:
            name, _, size = item.partition("=")
            if item.count("=") != 1 or not name or not (size.isascii() and size.isdigit()):
                raise PassFailedException(
                    f"{self.name}: cannot read {quoted(item)} in option axes; "
                    'write axes="batch=4","model=2" (one name=size per axis, sizes in digits)'
                )
            if name in sizes:
                raise PassFailedException(
                    f"{self.name}: option axes names axis {quoted(name)} twice "
                    f"(={sizes[name]} and ={size}); give each axis once"
                )
            sizes[name] = int(size)
        if not sizes:
            raise PassFailedException(
                f'{self.name}: option axes is empty; write axes="batch=4","model=2"'
            )
        try:
            declare_mesh(op, Mesh(sizes))
        except (TypeError, ValueError) as err:
            raise PassFailedException(f"{self.name}: {err}") from err


@dataclass(frozen=True)
class EmitJaxPass(ModulePass):
    """Emit the SPMD module as a jax.shard_map Python module (its `source`).

    As the last pass of `partir-opt`, the output is that Python module.
    """

    name = "partir-emit-jax"
    program: str = "partir_program"
    """The emitted function's name."""
    emitted: list[str] = field(default_factory=list, init=False, compare=False, repr=False)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        self.emitted[:] = [emit_jax(op, name=self.program)]  # raises UnsupportedOpError

    @property
    def source(self) -> str:
        """The source the last `apply` emitted."""
        if not self.emitted:
            raise ValueError(f"{self.name} has not run yet")
        return self.emitted[0]


_PASS_CLASSES: tuple[type[ModulePass], ...] = (
    DeclareMeshPass,
    InlineCallsPass,
    TilePass,
    *TACTIC_PASSES.values(),
    PropagatePass,
    LowerToSpmdPass,
    EmitJaxPass,
)


def _factory(pass_class: type[ModulePass]) -> Callable[[], type[ModulePass]]:
    """xDSL's pass registry maps a name to a function returning the class."""
    return lambda: pass_class


PASSES: dict[str, Callable[[], type[ModulePass]]] = {p.name: _factory(p) for p in _PASS_CLASSES}
"""Name -> pass class, for `partir-opt -p` and its --help."""


def plan_seeds(module: ModuleOp, plans: list[Plan]) -> list[list[Seed]]:
    """Each plan's tiles as `rewrites.factor_propagation` seeds, numbered as
    `apply_plan` numbers their actions (after any the module has taken),
    against the module as it is (nothing is rewritten)."""
    from xdsl.dialects.builtin import IntegerAttr

    from dialects.partir import ACTIONS

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
        seeds = []
        for tile in plan:
            number += 1
            label = tile.label or tile.leaf.name
            value = _leaf_value(entry, tile, referenced)
            origin = OriginAttr(number, plan.tactic, label)
            seeds.append(Seed(value, _dim_of(value, tile.dim), tile.axis, origin, label))
        schedule.append(seeds)
    return schedule
