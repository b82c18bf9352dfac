"""Unroll a counted loop into its iterations, each reading its rows statically.

A pipeline's stages are whole layers, so to say which stage runs an op the
op must belong to one layer: the layer loop (`dialects.counted_loops`) run
as one block of ops per iteration. `unroll` inlines a counted
`stablehlo.while`: iteration `j` is the body's ops cloned on the previous
iteration's carried values, with the counter the constant `start + j` (the
condition is the trip count, already known). Every row index is then a
constant: a `stablehlo.dynamic_slice` at constant starts becomes a
`stablehlo.slice`, a `stablehlo.dynamic_update_slice` the concatenation of
the operand's rows around the update, with the spec's clamping; the index
arithmetic left unused is erased. The result computes what the loop did.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IntegerAttr,
    ModuleOp,
    TensorType,
    i64,
)
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl_jax.dialects import stablehlo as shlo

from dialects.counted_loops import CountedLoop
from dialects.interpreter.positions import Positions
from dialects.mesh import Mesh
from dialects.stablehlo_ext import DynamicUpdateSliceOp, SliceOp


def unroll(module: ModuleOp, loop: CountedLoop) -> list[list[Operation]]:
    """Replace `loop` (in `module`) by its iterations; returns each one's ops,
    in program order, after folding its row accesses."""
    op = loop.op
    body = op.body.block
    returned = body.last_op
    assert returned is not None
    carried = list(op.operands)
    counter_type = carried[loop.counter].type
    assert isinstance(counter_type, TensorType)
    iterations: list[list[Operation]] = []
    for j in range(loop.trips):
        made: list[Operation] = []
        counter = shlo.ConstantOp(
            DenseIntOrFPElementsAttr.from_list(counter_type, [loop.start + j])
        )
        made.append(counter)
        carried[loop.counter] = counter.results[0]
        mapping: dict[SSAValue, SSAValue] = dict(zip(body.args, carried, strict=True))
        for inner in body.ops:
            if inner is returned:
                break
            clone = inner.clone(value_mapper=mapping)
            for old, new in zip(inner.results, clone.results, strict=True):
                mapping[old] = new
            made.append(clone)
        Rewriter.insert_op(made, InsertPoint.before(op))
        carried = [mapping.get(v, v) for v in returned.operands]
        iterations.append(made)
    for result, value in zip(op.results, carried, strict=True):
        result.replace_all_uses_with(value)
    Rewriter.erase_op(op)
    folder = Positions(module, Mesh.single_device())
    return [_static_rows(ops, folder) for ops in iterations]


def _static_rows(ops: Sequence[Operation], folder: Positions) -> list[Operation]:
    """`ops` with their dynamic slices at constant starts made static and the
    index arithmetic no longer used erased."""
    kept: list[Operation] = []
    for op in ops:
        made = [op]
        if op.name == "stablehlo.dynamic_slice":
            starts = _constants(op.operands[1:], folder)
            if starts is not None:
                made = _replace(op, [_slice(op.operands[0], starts, _shape(op.results[0]))])
        elif isinstance(op, DynamicUpdateSliceOp):
            starts = _constants(op.operands[2:], folder)
            if starts is not None:
                made = _replace(op, _updated(op.operand, op.update, starts))
        kept += made
    for op in reversed(list(kept)):
        if op.parent is not None and not op.regions and all(not r.uses for r in op.results):
            if op.name in _INDEX_ARITHMETIC:
                Rewriter.erase_op(op)
                kept.remove(op)
    return [op for op in kept if op.parent is not None]


_INDEX_ARITHMETIC = frozenset(
    {
        "stablehlo.constant",
        "stablehlo.add",
        "stablehlo.subtract",
        "stablehlo.compare",
        "stablehlo.select",
        "stablehlo.convert",
        "stablehlo.clamp",
        "stablehlo.reshape",
    }
)
"""Ops the row index is computed with (JAX's scan writes `i < 0 ? i + n : i`)."""


def _constants(values: Sequence[SSAValue], folder: Positions) -> list[int] | None:
    if any(folder.axes_of(v) != frozenset() for v in values):
        return None
    return [int(folder.value(v, {})) for v in values]


def _shape(value: SSAValue) -> list[int]:
    ty = value.type
    assert isinstance(ty, TensorType)
    return list(ty.get_shape())


def _replace(op: Operation, made: list[Operation]) -> list[Operation]:
    """Put `made` where `op` is (the last one's result replacing `op`'s)."""
    Rewriter.insert_op(made, InsertPoint.before(op))
    op.results[0].replace_all_uses_with(made[-1].results[0])
    Rewriter.erase_op(op)
    return made


def _slice(value: SSAValue, starts: Sequence[int], sizes: Sequence[int]) -> Operation:
    """`value[starts : starts + sizes]`, the starts clamped into the operand as
    `dynamic_slice` clamps them."""
    shape = _shape(value)
    clamped = [min(max(s, 0), n - k) for s, n, k in zip(starts, shape, sizes, strict=True)]
    ty = value.type
    assert isinstance(ty, TensorType)
    return SliceOp.create(
        operands=[value],
        result_types=[TensorType(ty.get_element_type(), list(sizes))],
        properties={
            "start_indices": DenseArrayBase.from_list(i64, clamped),
            "limit_indices": DenseArrayBase.from_list(
                i64, [s + k for s, k in zip(clamped, sizes, strict=True)]
            ),
            "strides": DenseArrayBase.from_list(i64, [1] * len(shape)),
        },
    )


def _updated(operand: SSAValue, update: SSAValue, starts: Sequence[int]) -> list[Operation]:
    """`operand` with `update` written at `starts` (clamped), as static slices
    of the operand around it, concatenated along the one dim where the update
    is smaller than the operand (at most one may be: a row write)."""
    shape, sizes = _shape(operand), _shape(update)
    partial = [d for d, (n, k) in enumerate(zip(shape, sizes, strict=True)) if n != k]
    if not partial:
        return [_identity(update)]
    if len(partial) > 1:
        raise ValueError(
            "stablehlo.dynamic_update_slice writes a block smaller than its operand in "
            f"dims {partial}; unrolling folds row writes only"
        )
    d = partial[0]
    start = min(max(starts[d], 0), shape[d] - sizes[d])
    made: list[Operation] = []
    pieces: list[SSAValue] = []
    for low, high in ((0, start), (start + sizes[d], shape[d])):
        if high > low:
            begin = [0] * len(shape)
            begin[d] = low
            extent = list(shape)
            extent[d] = high - low
            made.append(_slice(operand, begin, extent))
            pieces.append(made[-1].results[0])
    pieces.insert(1 if start > 0 else 0, update)
    ty = operand.type
    assert isinstance(ty, TensorType)
    made.append(
        shlo.ConcatenateOp.create(
            operands=pieces,
            result_types=[ty],
            properties={"dimension": IntegerAttr(d, i64)},
        )
    )
    return made


def _identity(value: SSAValue) -> Operation:
    """An op whose result is `value` (a reshape to its own type)."""
    return shlo.ReshapeOp.create(operands=[value], result_types=[value.type])
