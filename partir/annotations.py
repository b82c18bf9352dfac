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
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntAttr, ModuleOp, StringAttr
from xdsl.ir import BlockArgument, Operation, OpResult, SSAValue

from dialects.escaping import quoted
from dialects.locations import source_location
from dialects.manual_regions import manual_regions, mesh_of, normalize_manual_regions
from dialects.partir import LoopOp
from dialects.sdy import (
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
from rewrites.projection import LoopRelations

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


def constrained_value(op: ShardingConstraintOp) -> SSAValue:
    """The value `op` constrains, through any constraints before it (explicit
    mode chains them: `reshard` of a value whose type already has one): what
    it is once `remove_annotations` has taken the constraints out."""
    value = op.input
    while isinstance(value.owner, ShardingConstraintOp):
        value = value.owner.input
    return value


def _source(op: Operation) -> str:
    """Which JAX call made a constraint, from its name stack's last part:
    `with_sharding_constraint`, `reshard`, or (explicit mode: JAX
    constrains each op's result to the sharding its type carries) the op's
    typed sharding, e.g. "the sharding in dot_general's type"."""
    stack = source_location(op.location).name_stack or ""
    last = stack.rsplit("/", 1)[-1]
    if last == "sharding_constraint" or not last:
        return "with_sharding_constraint"
    if last == "reshard":
        return "reshard"
    return f"the sharding in {last}'s type"


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

    def add(kind: str, index: int, value: str, source: str, where: str | None, s: ShardingAttr):
        found.append(
            Annotation(
                kind, index, value, source, where, s.mesh_name.data,
                meshes.get(s.mesh_name.data, ()), tuple(s.dims),
                tuple(a.data for a in s.unreduced.data),
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
        add(CONSTRAINT, i, name, _source(op), _where(op), op.sharding)
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
    if kind == CONSTRAINT:
        return constrained_value(constraint_ops(entry)[ordinal])
    region = manual_regions(entry)[ordinal]
    if kind == REGION_OPERAND:
        return region.tensors[position]
    return region.results[position]


def holds_annotations(module: ModuleOp) -> bool:
    """Whether the module states a sharding of JAX's that splits something
    (a constraint or an argument or result sharding): what `Annotations`
    makes actions of. (JAX's trivial ones, a scalar's `@empty_mesh, []` or
    the replicated constraint it adds at `random_wrap`, split nothing.)"""
    for op in module.walk():
        if isinstance(op, ShardingConstraintOp) and any(op.sharding.dims):
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
    constraint becomes its operand, and the `sdy.sharding` argument and
    result attributes and the `sdy.mesh` declarations go (partir's mesh and
    distributions state where values live from here on)."""
    for op in list(module.walk()):
        if isinstance(op, ShardingConstraintOp):
            op.result.replace_all_uses_with(op.input)
            op.detach()
            op.erase()
        elif isinstance(op, func.FuncOp):
            op.arg_attrs = _without_sharding(op.arg_attrs)
            op.res_attrs = _without_sharding(op.res_attrs)
    for op in list(module.body.block.ops):
        if isinstance(op, MeshOp):
            op.detach()
            op.erase()
    module.attributes.pop(JAX_MESHES, None)


WHOLE_DIMS = "partir.whole_dims"
"""The attribute marking an op whose result an annotation keeps whole on
some dims (closed, with no axes: `None` in `P("batch", None)`): a list of
`[result, [dims], annotation, spec, value]`. The constraints go when
`Annotations` applies, the mark stays on the op (and on its parts, which
rewrites copy it to), so `split_whole_dims` can check it after every later
tactic."""


def mark_whole_dims(entry: func.FuncOp) -> None:
    """Mark the value of each constraint that splits something and keeps
    some dims whole (`WHOLE_DIMS`), before `remove_annotations`. Open dims
    (`?`, JAX's `P.UNCONSTRAINED`) are left to partir. (A constraint that
    splits nothing is JAX's own trivial one as often as the user's: not
    marked.)"""
    refs: dict[Operation, str] | None = None
    for op in constraint_ops(entry):
        s = op.sharding
        opened = {d.data for d in s.open_dims.data}
        whole = [d for d, axes in enumerate(s.dims) if not axes and d not in opened]
        value = constrained_value(op)
        if not any(s.dims) or not whole or not isinstance(value, OpResult):
            continue
        refs = refs if refs is not None else references(entry)
        note = Annotation(CONSTRAINT, 0, "", _source(op), _where(op), s.mesh_name.data, (),
                          tuple(s.dims))
        mark = ArrayAttr([
            IntAttr(value.index), ArrayAttr([IntAttr(d) for d in whole]),
            StringAttr(note.describe), StringAttr(note.spec),
            StringAttr(_value_name(value, (), refs)),
        ])
        owner = value.owner
        old = owner.attributes.get(WHOLE_DIMS)
        owner.attributes[WHOLE_DIMS] = ArrayAttr(
            [*(old.data if isinstance(old, ArrayAttr) else ()), mark]
        )


def split_whole_dims(entry: func.FuncOp) -> list[Conflict]:
    """A conflict for each marked value (`mark_whole_dims`) that a loop
    splits on a dim its annotation keeps whole, naming the annotation and
    the action whose loop split it."""
    marked = [op for op in entry.walk() if WHOLE_DIMS in op.attributes]
    if not marked:
        return []
    relations = LoopRelations.of(entry.body.block)
    found: list[Conflict] = []
    for op in marked:
        marks = op.attributes[WHOLE_DIMS]
        assert isinstance(marks, ArrayAttr)
        for mark in marks.data:
            index, dims, describe, spec, name = mark.data
            dist = relations(op.results[index.data]).dist
            for dim in (d.data for d in dims.data):
                for axis in dist.dims[dim] if dim < len(dist.dims) else ():
                    loop = op.parent_op()
                    while loop is not None and not (
                        isinstance(loop, LoopOp) and loop.axis_name == axis
                    ):
                        loop = loop.parent_op()
                    found.append(Conflict(
                        op="annotation",
                        values=(name.data,),
                        axis=axis,
                        winner=describe_origin(loop.origin if loop is not None else None),
                        loser=describe.data,
                        detail=f"{spec.data} keeps dim {dim} whole, but it is split over "
                        f"{quoted(axis)}; drop the tactic's split of it, or say how the "
                        "annotation may split that dim",
                    ))
    return found
