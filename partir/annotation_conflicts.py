"""What the program's annotations keep, checked after every tactic.

`Annotations` makes each annotation's splits tiling actions
(`partir.annotations`); what an annotation keeps is checked here against what
every later tactic splits, so that a tactic that disagrees is a reported
conflict, never silently resolved: a dim it keeps whole (closed, with no
axes: `None` in `P("batch", None)`), marked before the constraints go
(`mark_whole_dims`), and what a reshard (`partir.annotations.is_reshard`)
redistributes (`reshard_conflicts`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntAttr, StringAttr
from xdsl.ir import Operation, OpResult, SSAValue

from dialects.escaping import quoted
from dialects.functions import NAME_ATTR
from dialects.partir import LoopOp, OriginAttr, SliceOp
from dialects.sdy import SHARDING, ShardingAttr, ShardingConstraintOp
from partir.annotations import (
    ARGUMENT,
    CONSTRAINT,
    RESULT,
    UNLOCATED,
    UNLOCATED_HINT,
    Annotation,
    constrained_value,
    constraint_ops,
    constraint_source,
    is_reshard,
    states_replication,
    user_line,
    value_name,
)
from partir.values import references
from rewrites.actions import describe_value
from rewrites.conflicts import Conflict, describe_origin
from rewrites.projection import LoopRelations, range_axis, tilings

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
        note = _note(constraint_source(op), user_line(op), op.sharding)
        mark = ArrayAttr([
            IntAttr(value.index), _dims(whole), StringAttr(note.describe),
            StringAttr(note.spec), StringAttr(value_name(value, (), refs)),
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
    note = _note(constraint_source(op), user_line(op), op.sharding)

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


def _slices_of(value: SSAValue) -> list[SliceOp]:
    """The slices taking parts of `value`, and of those parts (a value split
    on two dims is sliced on one inside the other's loop)."""
    found: list[SliceOp] = []
    todo = [value]
    while todo:
        for use in todo.pop().uses:
            if isinstance(use.operation, SliceOp):
                found.append(use.operation)
                todo.append(use.operation.result)
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
        for part in _slices_of(entry.body.block.args[i]):
            if part.dim_index in dims:
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
