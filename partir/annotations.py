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
operand) with JAX's meshes and argument shardings, which partir's own mesh
and distributions replace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    IntAttr,
    ModuleOp,
    StringAttr,
    UnitAttr,
)
from xdsl.ir import BlockArgument, Operation, OpResult, SSAValue

from dialects.escaping import quoted
from dialects.functions import NAME_ATTR
from dialects.locations import source_location
from dialects.manual_regions import manual_regions, mesh_of, normalize_manual_regions
from dialects.partir import LoopOp, OriginAttr, SliceOp
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
from rewrites.conflicts import Conflict, describe_origin
from rewrites.projection import LoopRelations, range_axis, tilings

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
    sharding", "the sharding in dot_general's type" (`_source`)."""
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
    (`dialects.manual_regions`; `partir-opt` reads JAX's text this way)."""
    normalize_manual_regions(module)
    meshes = [op for op in module.body.block.ops if isinstance(op, MeshOp)]
    if not meshes:
        return
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
"""What the report calls a constraint whose IR has no location (`_source`)."""

UNLOCATED_HINT = (
    " (the IR has no locations, so every constraint is taken as stated: JAX's own types "
    "cannot be told from the user's; partir.jit, which reads JAX's locations, tells them apart)"
)
"""Appended to the detail of a conflict with an `UNLOCATED` constraint."""


def _source(op: Operation) -> str:
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


def _where(op: Operation) -> str | None:
    found = source_location(op.location)
    if found.file is None:
        return None
    return f"{os.path.basename(found.file)}:{found.line}"


def _value_name(value: SSAValue, arguments: Sequence[str], refs: dict[Operation, str]) -> str:
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
    constraints = constraint_ops(entry)
    regions = manual_regions(entry)
    refs = references(entry) if constraints or regions else {}
    for i, op in enumerate(constraints):
        name = _value_name(constrained_value(op), arguments, refs)
        whole = not any(op.sharding.dims) and (is_reshard(op) or states_replication(op))
        add(CONSTRAINT, i, name, _source(op), _where(op), op.sharding, whole)
    for i, region in enumerate(regions):
        mesh = tuple(mesh_of(region).axes.items())
        for kind, values, shardings, specs in (
            (REGION_OPERAND, region.tensors, region.in_shardings, "in_specs"),
            (REGION_RESULT, region.results, region.out_shardings, "out_specs"),
        ):
            for k, (value, s) in enumerate(zip(values, shardings.shardings.data, strict=True)):
                found.append(
                    Annotation(
                        kind, i, _value_name(value, arguments, refs), f"shard_map {specs}[{k}]",
                        _where(region), s.mesh_name.data, mesh, tuple(s.dims), position=k,
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


def holds_annotations(module: ModuleOp) -> bool:
    """Whether the module states a sharding that splits something (a
    constraint, an argument or result sharding, a manual region) or a user's
    constraint keeping a value whole (`states_replication`): what
    `Annotations` makes actions of. (JAX's trivial ones, a scalar's
    `@empty_mesh, []` or explicit mode's replicated types, state nothing.)"""
    for op in module.walk():
        if isinstance(op, ShardingConstraintOp) and (
            any(op.sharding.dims) or states_replication(op)
        ):
            return True
        if isinstance(op, ManualComputationOp):
            return True
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


def remove_annotations(module: ModuleOp) -> None:
    """Take JAX's shardings out of the module once they are actions: each
    constraint becomes its operand, except a reshard (`is_reshard`), kept
    and marked `RESHARD` (its result is a value of its own); the
    `sdy.sharding` argument and result attributes and the `sdy.mesh`
    declarations go (partir's mesh and distributions state where values
    live from here on)."""
    constraints = [op for op in module.walk() if isinstance(op, ShardingConstraintOp)]
    reshards = {op for op in constraints if is_reshard(op)}  # while the chains are whole
    for constraint in constraints:
        if constraint in reshards:
            constraint.attributes[RESHARD] = UnitAttr()
        else:
            constraint.result.replace_all_uses_with(constraint.input)
            constraint.detach()
            constraint.erase()
    for function in module.walk():
        if isinstance(function, func.FuncOp):
            function.arg_attrs = _without_sharding(function.arg_attrs)
            function.res_attrs = _without_sharding(function.res_attrs)
    for op in list(module.body.block.ops):
        if isinstance(op, MeshOp):
            op.detach()
            op.erase()
    module.attributes.pop(JAX_MESHES, None)


WHOLE_DIMS = "partir.whole_dims"
"""The attribute marking what an annotation keeps whole on some dims
(closed, with no axes: `None` in `P("batch", None)`): on an op, a list of
`[result, [dims], annotation, spec, value]` for its results; on an entry
argument or result, `[[dims], annotation, spec]`. The constraints go when
`Annotations` applies, the marks stay (rewrites copy an op's to its parts),
so `split_whole_dims` can check them after every later tactic."""


def _whole(s: ShardingAttr, replication_stated: bool = False) -> list[int]:
    """The dims `s` keeps whole: closed, with no axes (an open one, `?` or
    JAX's `P.UNCONSTRAINED`, is partir's to split). None when `s` splits
    nothing, unless the user stated that (`states_replication`): JAX's own
    trivial shardings are as common as the user's."""
    opened = {d.data for d in s.open_dims.data}
    if not any(s.dims) and not replication_stated:
        return []
    return [d for d, axes in enumerate(s.dims) if not axes and d not in opened]


def _dims(dims: Sequence[int]) -> ArrayAttr[IntAttr]:
    return ArrayAttr([IntAttr(d) for d in dims])


def _note(source: str, where: str | None, s: ShardingAttr) -> Annotation:
    return Annotation(CONSTRAINT, 0, "", source, where, s.mesh_name.data, (), tuple(s.dims))


def mark_whole_dims(entry: func.FuncOp) -> None:
    """Mark what each annotation keeps whole (`WHOLE_DIMS`), before
    `remove_annotations`: a constraint's value, an argument, a result."""
    for kind, attrs in ((ARGUMENT, entry.arg_attrs), (RESULT, entry.res_attrs)):
        if attrs is None:
            continue
        marked = []
        for d in attrs.data:
            entries = dict(d.data)
            s = entries.get(SHARDING)
            if isinstance(s, ShardingAttr) and (whole := _whole(s)):
                note = _note(f"{kind} sharding", None, s)
                entries[WHOLE_DIMS] = ArrayAttr(
                    [_dims(whole), StringAttr(note.describe), StringAttr(note.spec)]
                )
            marked.append(DictionaryAttr(entries))
        if kind == ARGUMENT:
            entry.arg_attrs = ArrayAttr(marked)
        else:
            entry.res_attrs = ArrayAttr(marked)
    refs: dict[Operation, str] | None = None
    for op in constraint_ops(entry):
        if is_reshard(op):  # its own value, whole where it says (`reshard_conflicts`)
            continue
        whole = _whole(op.sharding, states_replication(op))
        value = constrained_value(op)
        if not whole or not isinstance(value, OpResult):
            continue
        refs = refs if refs is not None else references(entry)
        note = _note(_source(op), _where(op), op.sharding)
        mark = ArrayAttr([
            IntAttr(value.index), _dims(whole), StringAttr(note.describe),
            StringAttr(note.spec), StringAttr(_value_name(value, (), refs)),
        ])
        owner = value.owner
        old = owner.attributes.get(WHOLE_DIMS)
        owner.attributes[WHOLE_DIMS] = ArrayAttr(
            [*(old.data if isinstance(old, ArrayAttr) else ()), mark]
        )


def _enclosing_loop(op: Operation | None, axis: str) -> LoopOp | None:
    while op is not None and not (isinstance(op, LoopOp) and op.axis_name == axis):
        op = op.parent_op()
    return op


def _conflict(
    name: str, axis: str, loop: LoopOp | None, describe: str, spec: str, dim: int
) -> Conflict:
    return Conflict(
        op="annotation",
        values=(name,),
        axis=axis,
        winner=describe_origin(loop.origin if loop is not None else None),
        loser=describe,
        detail=f"{spec} keeps dim {dim} whole, but it is split over {quoted(axis)}; drop "
        "the tactic's split of it, or say how the annotation may split that dim"
        + (UNLOCATED_HINT if describe == UNLOCATED else ""),
    )


def _leaf_marks(
    attrs: ArrayAttr[DictionaryAttr] | None,
) -> Iterator[tuple[int, str, list[int], str, str]]:
    """(index, leaf name, [dims], annotation, spec) per marked argument or result."""
    for i, d in enumerate(attrs.data if attrs is not None else ()):
        mark = d.data.get(WHOLE_DIMS)
        if isinstance(mark, ArrayAttr):
            dims, describe, spec = mark.data
            name = d.data.get(NAME_ATTR)
            label = name.data if isinstance(name, StringAttr) else f"leaf {i}"
            yield i, label, [x.data for x in dims.data], describe.data, spec.data


ANNOTATIONS = "Annotations"
"""The tactic (`partir.tactics.Annotations`) whose actions are the program's
own statements, as loop origins name it."""


def reshard_conflicts(op: ShardingConstraintOp, refs: dict[Operation, str]) -> list[Conflict]:
    """A conflict for each split another tactic gives a reshard's operand
    that the reshard does not keep (it wins: the lowering gathers or moves
    the split there), and each part of its result another tactic's loop
    takes along an axis the reshard does not split that dim over (the
    value stays whole, its users are split). The user's own statements
    (`Annotations`' actions: an argument's type, the reshard's splits) are
    no conflict: the reshard says how one becomes the other."""
    found: list[Conflict] = []
    target = op.sharding.dims
    opened = {d.data for d in op.sharding.open_dims.data}
    name = refs.get(op) or describe_value(op.result)
    note = _note(_source(op), _where(op), op.sharding)

    def stated(dim: int, axis: str) -> bool:
        return dim in opened or (dim < len(target) and axis in target[dim])

    def users(origin: OriginAttr | None) -> bool:
        return origin is not None and origin.tactic.data == ANNOTATIONS

    for t in tilings(op.input):
        if stated(t.dim, t.axis) or users(t.origin):
            continue
        found.append(
            Conflict(
                op="annotation",
                values=(name,),
                axis=t.axis,
                winner=note.describe,
                loser=describe_origin(t.origin),
                detail=f"{note.spec} does not split dim {t.dim} over {quoted(t.axis)}; the "
                "tactic's split stops at the reshard, which redistributes the value",
            )
        )
    for use in op.result.uses:
        part = use.operation
        if not isinstance(part, SliceOp) or stated(part.dim_index, range_axis(part.index) or ""):
            continue
        axis = range_axis(part.index)
        loop = _enclosing_loop(part, axis) if axis is not None else None
        if axis is None or users(loop.origin if loop is not None else None):
            continue
        found.append(_conflict(name, axis, loop, note.describe, note.spec, part.dim_index))
    return found


def split_whole_dims(entry: func.FuncOp) -> list[Conflict]:
    """A conflict for each dim an annotation keeps whole (`mark_whole_dims`)
    that a loop splits: a marked op's result that is a part along it, an
    argument sliced along it, a result concatenated along it; and for each
    split another tactic gives a reshard's operand or result that it does not
    state (`reshard_conflicts`); naming the annotation and the action whose
    loop split it."""
    found: list[Conflict] = []
    reshards = [c for c in constraint_ops(entry) if c.is_reshard]
    if reshards:
        refs = references(entry)
        for reshard in reshards:
            found += reshard_conflicts(reshard, refs)
    for i, name, dims, describe, spec in _leaf_marks(entry.arg_attrs):
        for use in entry.body.block.args[i].uses:
            part = use.operation
            if isinstance(part, SliceOp) and part.dim_index in dims:
                axis = range_axis(part.index)
                if axis is not None:
                    loop = _enclosing_loop(part, axis)
                    found.append(_conflict(name, axis, loop, describe, spec, part.dim_index))
    ret = entry.body.block.last_op
    if isinstance(ret, func.ReturnOp):
        for i, name, dims, describe, spec in _leaf_marks(entry.res_attrs):
            for t in tilings(ret.arguments[i]):
                if t.dim in dims:
                    found.append(_conflict(name, t.axis, t.loop, describe, spec, t.dim))
    marked = [op for op in entry.walk() if WHOLE_DIMS in op.attributes]
    if not marked:
        return found
    relations = LoopRelations.of(entry.body.block)
    for op in marked:
        marks = op.attributes[WHOLE_DIMS]
        assert isinstance(marks, ArrayAttr)
        for mark in marks.data:
            index, dims_, describe_, spec_, value = mark.data
            dist = relations(op.results[index.data]).dist
            for dim in (d.data for d in dims_.data):
                for axis in dist.dims[dim] if dim < len(dist.dims) else ():
                    loop = _enclosing_loop(op.parent_op(), axis)
                    found.append(
                        _conflict(value.data, axis, loop, describe_.data, spec_.data, dim)
                    )
    return found
