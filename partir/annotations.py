"""The shardings a JAX program states itself, read from its IR.

JAX writes them in Shardy's dialect (`dialects.sdy`): an
`sdy.sharding_constraint` for each `jax.lax.with_sharding_constraint` (a
`NamedSharding`, or a bare `PartitionSpec` under `jax.set_mesh`) and each
`jax.sharding.reshard`, and an `sdy.sharding` on an argument or result whose
type carries a sharding (explicit mode), and the `in_specs` and `out_specs`
of a nested `jax.shard_map` (`sdy.manual_computation`: its operands enter
split as they say, its results come out so). `read_annotations` lists them, each
with the value it is about, its mesh, its dims' axes and the user's line;
the `Annotations` tactic (`partir.tactics`) makes them tiling actions, and
`remove_annotations` then takes the constraints out of the IR (each is its
operand, except a reshard of a value already stated split otherwise,
`is_reshard`, which stays a value of its own) with JAX's meshes and argument
shardings, which partir's own mesh and distributions replace. What they keep
is checked after every tactic (`partir.annotation_conflicts`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    ModuleOp,
    UnitAttr,
)
from xdsl.ir import BlockArgument, Operation, SSAValue

from dialects.locations import source_location
from dialects.manual_regions import manual_regions, mesh_of, normalize_manual_regions
from dialects.sdy import (
    RESHARD,
    SHARDING,
    ManualComputationOp,
    MeshAttr,
    MeshOp,
    ShardingAttr,
    ShardingConstraintOp,
)
from partir.values import references
from rewrites.actions import describe_value

ARGUMENT, RESULT, CONSTRAINT = "argument", "result", "constraint"
REGION_OPERAND, REGION_RESULT = "shard_map operand", "shard_map result"
"""The kinds of a manual region's in_spec (of its operand) and out_spec (of its result)."""


@dataclass(frozen=True)
class Annotation:
    """One sharding the program states: of argument or result `index`, of
    the value the `index`-th `sdy.sharding_constraint` (program order)
    constrains, or of operand (result) `position` of the `index`-th manual
    region."""

    kind: str
    """`ARGUMENT`, `RESULT`, `CONSTRAINT`, `REGION_OPERAND` or `REGION_RESULT`."""
    index: int
    value: str
    """What the report calls the annotated value: an argument's path, or
    the `@`-reference of the op computing it (`partir.values`)."""
    source: str
    """What stated it: "with_sharding_constraint", "reshard", "argument
    sharding", "the sharding in dot_general's type" (`constraint_source`)."""
    where: str | None
    """The user's `file:line`, where JAX recorded it."""
    mesh_name: str
    mesh_axes: tuple[tuple[str, int], ...]
    dims: tuple[tuple[str, ...], ...]
    """Per dim, the mesh axes it is split over, major first."""
    unreduced: tuple[str, ...] = ()
    position: int = 0
    kept_whole: bool = False
    """A constraint splitting nothing that `Annotations` honours: the
    user's statement that the value stays whole (`states_replication`), or
    a reshard to whole (`is_reshard`), whose result is a value of its own."""

    @property
    def describe(self) -> str:
        """`with_sharding_constraint at model.py:12`."""
        return f"{self.source} at {self.where}" if self.where else self.source

    @property
    def spec(self) -> str:
        """The annotation as a PartitionSpec, `P('batch', None)`."""

        def dim(axes: tuple[str, ...]) -> str:
            if not axes:
                return "None"
            return repr(axes[0]) if len(axes) == 1 else repr(axes)

        return f"P({', '.join(dim(a) for a in self.dims)})"

    @property
    def splits(self) -> bool:
        return any(self.dims) or bool(self.unreduced)


JAX_MESHES = "sdy.meshes"
"""The module attribute holding JAX's meshes by name (a dictionary of
`#sdy.mesh`) once partir declares its own mesh (`set_aside_jax_meshes`)."""


def _meshes(module: ModuleOp) -> dict[str, tuple[tuple[str, int], ...]]:
    found = {
        op.sym_name.data: tuple(op.mesh.axes.items())
        for op in module.body.block.ops
        if isinstance(op, MeshOp)
    }
    kept = module.attributes.get(JAX_MESHES)
    if isinstance(kept, DictionaryAttr):
        for name, mesh in kept.data.items():
            if isinstance(mesh, MeshAttr):
                found.setdefault(name, tuple(mesh.axes.items()))
    return found


def set_aside_jax_meshes(module: ModuleOp) -> None:
    """Move JAX's `sdy.mesh` declarations into the module's `JAX_MESHES`
    attribute: partir's `partir.mesh @mesh` takes the symbol `@mesh` that
    JAX's mesh has, and a module defines a symbol once. The shardings still
    name JAX's mesh, which `read_annotations` finds there. Manual regions
    are read first, while JAX's meshes are declarations
    (`dialects.manual_regions`; `partir-opt` reads JAX's text this way).
    A module without them has had its regions read (or names no mesh they
    could read, which `mesh_of` says)."""
    meshes = [op for op in module.body.block.ops if isinstance(op, MeshOp)]
    if not meshes:
        return
    normalize_manual_regions(module)
    kept = module.attributes.get(JAX_MESHES)
    table = dict(kept.data) if isinstance(kept, DictionaryAttr) else {}
    for op in meshes:
        table[op.sym_name.data] = op.mesh
        op.detach()
        op.erase()
    module.attributes[JAX_MESHES] = DictionaryAttr(table)


def constraint_ops(entry: func.FuncOp) -> list[ShardingConstraintOp]:
    """The entry's sharding constraints, in program order (nested ones too)."""
    return [op for op in entry.walk() if isinstance(op, ShardingConstraintOp)]


def _earlier_sharding(op: ShardingConstraintOp) -> ShardingAttr | None:
    """The sharding the program already states for `op`'s operand: the
    constraint before it on the same value (explicit mode chains them: the
    type JAX gives an op's result, then the user's `reshard`), or the entry
    argument's `sdy.sharding`."""
    value = op.input
    if isinstance(value.owner, ShardingConstraintOp):
        return value.owner.sharding
    if isinstance(value, BlockArgument):
        entry = value.owner.parent_op()
        if isinstance(entry, func.FuncOp) and entry.arg_attrs is not None:
            found = entry.arg_attrs.data[value.index].data.get(SHARDING)
            return found if isinstance(found, ShardingAttr) else None
    return None


def is_reshard(op: ShardingConstraintOp) -> bool:
    """Whether `op` changes the sharding its operand already has
    (`_earlier_sharding`): `jax.sharding.reshard(x, P(None, None))` of an
    argument typed `P("batch", None)`, a reshard moving a split to another
    dim or axis, a second constraint on a value. The user said the value is
    split one way up to there and another way after it; once the
    constraints are gone both would be about one value, so `Annotations`
    keeps such a constraint (`dialects.sdy.RESHARD`): its result is a value
    of its own, split as it says, and the SPMD lowering redistributes
    between the two as jax.jit does (a gather, an all-to-all)."""
    if op.is_reshard:
        return True
    earlier = _earlier_sharding(op)
    return earlier is not None and tuple(earlier.dims) != tuple(op.sharding.dims)


def constrained_value(op: ShardingConstraintOp) -> SSAValue:
    """The value `op` constrains: its own result if it is a reshard
    (`is_reshard`), else its operand, through the constraints before it that
    state the same sharding: what it is once `remove_annotations` has taken
    the constraints out."""
    if is_reshard(op):
        return op.result
    value = op.input
    while isinstance(value.owner, ShardingConstraintOp) and not is_reshard(value.owner):
        value = value.owner.input
    return value


USER_CALLS = {"sharding_constraint": "with_sharding_constraint", "reshard": "reshard"}
"""The primitives whose lowering is the user's own call, by the name JAX
gives them in a name stack, and what the report calls each."""

UNLOCATED = "a sharding constraint with no location"
"""What the report calls a constraint whose IR has no location (`constraint_source`)."""

UNLOCATED_HINT = (
    " (the IR has no locations, so every constraint is taken as stated: JAX's own types "
    "cannot be told from the user's; partir.jit, which reads JAX's locations, tells them apart)"
)
"""Appended to the detail of a conflict with an `UNLOCATED` constraint."""


def constraint_source(op: Operation) -> str:
    """Which JAX call made a constraint, from its name stack's last part,
    which JAX makes `<name stack>/<primitive>` of the primitive whose
    lowering wrote it: `with_sharding_constraint`, `reshard`, or (explicit
    mode: `lower_with_sharding_in_types` constrains each op's result to the
    sharding its type carries) the op's typed sharding, e.g. "the sharding
    in dot_general's type". IR with no location says nothing of it
    (`UNLOCATED`)."""
    stack = source_location(op.location).name_stack
    if stack is None:
        return UNLOCATED
    last = stack.rsplit("/", 1)[-1]
    if last in USER_CALLS or not last:
        return USER_CALLS.get(last, "with_sharding_constraint")
    return f"the sharding in {last}'s type"


def states_replication(op: ShardingConstraintOp) -> bool:
    """Whether a constraint that splits nothing is a statement that the
    value stays whole (`with_sharding_constraint(x, P(None, None))` or a
    `reshard` to it), which `Annotations` honours like any other; JAX's own
    trivial constraints say nothing the user wrote. Decided by what JAX
    emits, not by names the user picks (a nested `jax.jit` of the user's
    `_step` is the user's):

    - the name stack ends in the primitive whose lowering wrote the
      constraint (`USER_CALLS`); explicit mode's typed constraints end in
      the op they type ("add"), and are JAX's;
    - JAX gives an op a file location only from a frame of the user's code
      (`source_info_util.user_frame`); one JAX makes with none on the stack
      (`jax.grad`'s reshard of its seed) has a name stack and no file.

    IR with no location at all (`partir-opt` reading StableHLO printed
    without debug info, or written by hand) cannot tell JAX's trivial
    constraints from the user's. The text is all there is, and it states
    each of them (jax.jit honours them all), so each is taken at its word:
    a tactic splitting such a value is a reported conflict naming it
    `UNLOCATED`, whose detail says why (`UNLOCATED_HINT`), never a silent
    choice either way."""
    if not op.sharding.dims:
        return False
    found = source_location(op.location)
    if found.name_stack is None:
        return found.file is None  # no location at all: taken as stated
    return found.name_stack.rsplit("/", 1)[-1] in USER_CALLS and found.file is not None


def user_line(op: Operation) -> str | None:
    found = source_location(op.location)
    if found.file is None:
        return None
    return f"{os.path.basename(found.file)}:{found.line}"


def value_name(value: SSAValue, arguments: Sequence[str], refs: dict[Operation, str]) -> str:
    if isinstance(value, BlockArgument):
        return arguments[value.index] if value.index < len(arguments) else f"argument {value.index}"
    owner = value.owner
    assert isinstance(owner, Operation)
    return refs.get(owner) or describe_value(value)


def read_annotations(
    entry: func.FuncOp, arguments: Sequence[str], results: Sequence[str]
) -> tuple[Annotation, ...]:
    """Every sharding `entry` states: its arguments', its results', then its
    constraints' in program order (a trivial one, e.g. JAX's
    `@empty_mesh, []` on a scalar, included: it splits nothing).
    `arguments` and `results` name the leaves (`partir.plan.ProgramView`)."""
    module = entry.parent_op()
    meshes = _meshes(module) if isinstance(module, ModuleOp) else {}
    found: list[Annotation] = []

    def add(
        kind: str, index: int, value: str, source: str, where: str | None, s: ShardingAttr,
        kept_whole: bool = False,
    ):
        found.append(
            Annotation(
                kind, index, value, source, where, s.mesh_name.data,
                meshes.get(s.mesh_name.data, ()), tuple(s.dims),
                tuple(a.data for a in s.unreduced.data), kept_whole=kept_whole,
            )
        )

    for kind, attrs, names in (
        (ARGUMENT, entry.arg_attrs, arguments),
        (RESULT, entry.res_attrs, results),
    ):
        for i, d in enumerate(attrs.data if attrs is not None else ()):
            sharding = d.data.get(SHARDING)
            if isinstance(sharding, ShardingAttr):
                add(kind, i, names[i], f"{kind} sharding", None, sharding)
    stated = annotation_ops(entry)
    constraints = [op for op in stated if isinstance(op, ShardingConstraintOp)]
    regions = [op for op in stated if isinstance(op, ManualComputationOp)]  # one walk for both
    refs = references(entry) if constraints or regions else {}
    for i, op in enumerate(constraints):
        name = value_name(constrained_value(op), arguments, refs)
        whole = not any(op.sharding.dims) and (is_reshard(op) or states_replication(op))
        add(CONSTRAINT, i, name, constraint_source(op), user_line(op), op.sharding, whole)
    for i, region in enumerate(regions):
        mesh = tuple(mesh_of(region).axes.items())
        for kind, values, shardings, specs in (
            (REGION_OPERAND, region.tensors, region.in_shardings, "in_specs"),
            (REGION_RESULT, region.results, region.out_shardings, "out_specs"),
        ):
            for k, (value, s) in enumerate(zip(values, shardings.shardings.data, strict=True)):
                found.append(
                    Annotation(
                        kind, i, value_name(value, arguments, refs), f"shard_map {specs}[{k}]",
                        user_line(region), s.mesh_name.data, mesh, tuple(s.dims), position=k,
                    )
                )
    return tuple(found)


def annotated_value(entry: func.FuncOp, kind: str, ordinal: int, position: int) -> SSAValue:
    """The value an annotation of `kind` is about (`Annotation`): the
    `ordinal`-th constraint's value, or operand (result) `position` of the
    `ordinal`-th manual region, as the program is before the annotations'
    tiles are taken."""
    if kind == CONSTRAINT:  # a reshard's: its result (`is_reshard`)
        return constrained_value(constraint_ops(entry)[ordinal])
    region = manual_regions(entry)[ordinal]
    if kind == REGION_OPERAND:
        return region.tensors[position]
    return region.results[position]


def annotation_ops(module: Operation) -> list[Operation]:
    """The sharding constraints and manual regions in `module` (or a
    function), in program order, nested ones too: one walk, which
    `holds_annotations` and `remove_annotations` share."""
    found: list[Operation] = []
    _annotations_in(module, found)
    return found


_ANNOTATION_OPS = (ShardingConstraintOp, ManualComputationOp)


def _annotations_in(op: Operation, found: list[Operation]) -> None:
    """`annotation_ops` of the ops nested in `op`, appended to `found` in
    `walk`'s order. By class, not `isinstance` (an ABC's check, a Python
    call per op), and without `walk`'s generator per block: this reads every
    op of the program, twice per partition."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.ops:
                if type(inner) in _ANNOTATION_OPS:
                    found.append(inner)
                if inner.regions:
                    _annotations_in(inner, found)


def holds_annotations(module: ModuleOp, found: Sequence[Operation] | None = None) -> bool:
    """Whether the module states a sharding that splits something (a
    constraint, an argument or result sharding, a manual region) or a user's
    constraint keeping a value whole (`states_replication`): what
    `Annotations` makes actions of. (JAX's trivial ones, a scalar's
    `@empty_mesh, []` or explicit mode's replicated types, state nothing.)
    `found`: the module's `annotation_ops`, if known."""
    for op in annotation_ops(module) if found is None else found:
        if isinstance(op, ShardingConstraintOp) and (
            any(op.sharding.dims) or states_replication(op)
        ):
            return True
        if isinstance(op, ManualComputationOp):
            return True
    for op in module.body.block.ops:  # functions are the module's own ops
        if isinstance(op, func.FuncOp):
            for attrs in (op.arg_attrs, op.res_attrs):
                for d in attrs.data if attrs is not None else ():
                    sharding = d.data.get(SHARDING)
                    if isinstance(sharding, ShardingAttr) and any(sharding.dims):
                        return True
    return False


def _without_sharding(attrs: ArrayAttr[DictionaryAttr] | None) -> ArrayAttr[DictionaryAttr] | None:
    if attrs is None:
        return None
    return ArrayAttr(
        [DictionaryAttr({k: v for k, v in d.data.items() if k != SHARDING}) for d in attrs.data]
    )


def remove_annotations(module: ModuleOp, found: Sequence[Operation] | None = None) -> None:
    """Take JAX's shardings out of the module once they are actions: each
    constraint becomes its operand, except a reshard (`is_reshard`), kept
    and marked `RESHARD` (its result is a value of its own); the
    `sdy.sharding` argument and result attributes and the `sdy.mesh`
    declarations go (partir's mesh and distributions state where values
    live from here on). `found`: the module's `annotation_ops`, if known."""
    ops = annotation_ops(module) if found is None else found
    constraints = [op for op in ops if isinstance(op, ShardingConstraintOp)]
    reshards = {op for op in constraints if is_reshard(op)}  # while the chains are whole
    for constraint in constraints:
        if constraint in reshards:
            constraint.attributes[RESHARD] = UnitAttr()
        else:
            constraint.result.replace_all_uses_with(constraint.input)
            constraint.detach()
            constraint.erase()
    for function in module.body.block.ops:
        if isinstance(function, func.FuncOp):
            function.arg_attrs = _without_sharding(function.arg_attrs)
            function.res_attrs = _without_sharding(function.res_attrs)
    for op in list(module.body.block.ops):
        if isinstance(op, MeshOp):
            op.detach()
            op.erase()
    module.attributes.pop(JAX_MESHES, None)
