"""The ops a pipeline schedule is made of, appended to one block.

Constants, per-microbatch buffers (a stack of M values, read and written at a
run-time index), a value's part along a dim, and conditionals built from
Python functions that add their branches' ops (`region`, `case`, `if_`). The
schedule (`partir.pipeline.program`) says what to build; this says how, in
StableHLO and the SPMD dialect.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.dialects.stablehlo.attributes import ComparisonDirection

from dialects.spmd import VARYING
from dialects.stablehlo_ext import CompareOp, DynamicUpdateSliceOp, SliceOp
from rewrites.padding import splat


class Builder:
    """Appends ops to the pipelined function's block."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.memo: dict[object, SSAValue] = {}

    def add(self, op: Operation) -> Operation:
        self.block.add_op(op)
        return op

    def const(self, n: int) -> SSAValue:
        key = ("i32", n, id(self.block))
        if key not in self.memo:
            self.memo[key] = self.add(splat(TensorType(i32, []), n)).results[0]
        return self.memo[key]

    def zeros(self, ty: Attribute) -> SSAValue:
        assert isinstance(ty, TensorType)
        scalar = self.add(splat(TensorType(ty.get_element_type(), []), 0)).results[0]
        return self.add(
            shlo.BroadcastInDimOp.create(
                operands=[scalar],
                result_types=[ty],
                properties={"broadcast_dimensions": DenseArrayBase.from_list(i64, [])},
            )
        ).results[0]

    def sub(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.add(shlo.SubtractOp(x, y, x.type)).results[0]

    def sum(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.add(shlo.AddOp(x, y, x.type)).results[0]

    def cmp(self, x: SSAValue, y: SSAValue, direction: str) -> SSAValue:
        return self.add(CompareOp(x, y, ComparisonDirection[direction])).results[0]

    def and_(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.add(shlo.AndOp(x, y, x.type)).results[0]

    def select(self, pred: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(shlo.SelectOp.create(operands=[pred, a, b], result_types=[a.type])).results[
            0
        ]

    def rows(self, value: SSAValue, dim: int, start: int, stop: int) -> SSAValue:
        ty = value.type
        assert isinstance(ty, TensorType)
        shape = list(ty.get_shape())
        starts, limits = [0] * len(shape), list(shape)
        starts[dim], limits[dim] = start, stop
        shape[dim] = stop - start
        return self.add(
            SliceOp.create(
                operands=[value],
                result_types=[TensorType(ty.get_element_type(), shape)],
                properties={
                    "start_indices": DenseArrayBase.from_list(i64, starts),
                    "limit_indices": DenseArrayBase.from_list(i64, limits),
                    "strides": DenseArrayBase.from_list(i64, [1] * len(shape)),
                },
            )
        ).results[0]

    def _lead(self, value: SSAValue) -> SSAValue:
        """`value` with a leading dim of 1."""
        ty = value.type
        assert isinstance(ty, TensorType)
        shape = list(ty.get_shape())
        return self.add(
            shlo.BroadcastInDimOp.create(
                operands=[value],
                result_types=[TensorType(ty.get_element_type(), [1, *shape])],
                properties={
                    "broadcast_dimensions": DenseArrayBase.from_list(
                        i64, list(range(1, len(shape) + 1))
                    )
                },
            )
        ).results[0]

    def stack(self, values: Sequence[SSAValue]) -> SSAValue:
        return self.concat([self._lead(v) for v in values])

    def concat(self, values: Sequence[SSAValue]) -> SSAValue:
        """`values` one after another along dim 0."""
        ty = values[0].type
        assert isinstance(ty, TensorType)
        rows = sum(v.type.get_shape()[0] for v in values)  # type: ignore[attr-defined]
        return self.add(
            shlo.ConcatenateOp.create(
                operands=list(values),
                result_types=[TensorType(ty.get_element_type(), [rows, *ty.get_shape()[1:]])],
                properties={"dimension": IntegerAttr(0, i64)},
            )
        ).results[0]

    def reshape(self, value: SSAValue, shape: Sequence[int]) -> SSAValue:
        ty = value.type
        assert isinstance(ty, TensorType)
        return self.add(
            shlo.ReshapeOp.create(
                operands=[value], result_types=[TensorType(ty.get_element_type(), list(shape))]
            )
        ).results[0]

    def flat(self, value: SSAValue) -> SSAValue:
        """`value` as one dim."""
        return self.reshape(value, [math.prod(value.type.get_shape())])  # type: ignore[attr-defined]

    def _rows(self, value: SSAValue, start: SSAValue, n: int) -> SSAValue:
        """Rows `start` to `start + n` of `value` (`start` known at run time)."""
        ty = value.type
        assert isinstance(ty, TensorType)
        _, *shape = ty.get_shape()
        return self.add(
            shlo.DynamicSliceOp.create(
                operands=[value, start, *[self.const(0)] * len(shape)],
                result_types=[TensorType(ty.get_element_type(), [n, *shape])],
                properties={"slice_sizes": DenseArrayBase.from_list(i64, [n, *shape])},
            )
        ).results[0]

    def _updated(self, value: SSAValue, rows: SSAValue, start: SSAValue) -> SSAValue:
        """`value` with `rows` written from row `start` on."""
        ty = value.type
        assert isinstance(ty, TensorType)
        return self.add(
            DynamicUpdateSliceOp.create(
                operands=[value, rows, start, *[self.const(0)] * (ty.get_num_dims() - 1)],
                result_types=[ty],
            )
        ).results[0]

    def _times(self, index: SSAValue, n: int) -> SSAValue:
        return self.add(shlo.MultiplyOp(index, self.const(n), index.type)).results[0]

    def rows_at(self, value: SSAValue, index: SSAValue, n: int) -> SSAValue:
        """Rows `index * n` to `(index + 1) * n` of `value` (`index` known at run time)."""
        return self._rows(value, self._times(index, n), n)

    def add_rows(self, value: SSAValue, part: SSAValue, index: SSAValue) -> SSAValue:
        """`value` with `part` added to its rows `index * n` on (`n`: `part`'s rows)."""
        n = part.type.get_shape()[0]  # type: ignore[attr-defined]
        start = self._times(index, n)
        return self._updated(value, self.sum(self._rows(value, start, n), part), start)

    def load(self, stack: SSAValue, index: SSAValue) -> SSAValue:
        """Row `index` of `stack`."""
        return self.reshape(self._rows(stack, index, 1), stack.type.get_shape()[1:])  # type: ignore[attr-defined]

    def store(self, stack: SSAValue, value: SSAValue, index: SSAValue, valid: SSAValue) -> SSAValue:
        """`stack` with row `index` set to `value` where `valid` holds; else the
        stack's last row, which no microbatch uses, takes it (an update in
        place, where a select against the kept row would be a copy of it)."""
        ty = stack.type
        assert isinstance(ty, TensorType)
        spare = self.const(ty.get_shape()[0] - 1)
        return self.put(stack, value, self.select(valid, index, spare))

    def clone(self, ops: Sequence[Operation], values: dict[SSAValue, SSAValue]) -> list[Operation]:
        """Clone `ops` in order, reading `values` for the values they map."""
        return [self.add(op.clone(value_mapper=values)) for op in ops]

    def part(
        self, value: SSAValue, d: int, n: int, index: SSAValue | int, before: Operation
    ) -> SSAValue:
        """Part `index` (of size `n`) of `value` along dim `d`, made before `before`."""
        ty = value.type
        assert isinstance(ty, TensorType)
        shape = list(ty.get_shape())
        rank = len(shape)
        shape[d] = n
        part_type = TensorType(ty.get_element_type(), shape)
        made: list[Operation] = []
        if isinstance(index, int):
            starts, limits = [0] * rank, list(ty.get_shape())
            starts[d], limits[d] = index * n, (index + 1) * n
            made.append(
                SliceOp.create(
                    operands=[value],
                    result_types=[part_type],
                    properties={
                        "start_indices": DenseArrayBase.from_list(i64, starts),
                        "limit_indices": DenseArrayBase.from_list(i64, limits),
                        "strides": DenseArrayBase.from_list(i64, [1] * rank),
                    },
                )
            )
        else:
            scalar = TensorType(i32, [])
            size, zero = splat(scalar, n), splat(scalar, 0)
            start = shlo.MultiplyOp(index, size.results[0], scalar)
            indices = [zero.results[0]] * rank
            indices[d] = start.results[0]
            made += [
                size,
                zero,
                start,
                shlo.DynamicSliceOp.create(
                    operands=[value, *indices],
                    result_types=[part_type],
                    properties={"slice_sizes": DenseArrayBase.from_list(i64, shape)},
                ),
            ]
        Rewriter.insert_op(made, InsertPoint.before(before))
        return made[-1].results[0]

    def clone_loop(
        self, loop: Operation, operands: Sequence[SSAValue], varying: Sequence[str]
    ) -> Operation:
        clone = loop.clone()
        clone.operands = list(operands)
        clone.attributes[VARYING] = ArrayAttr([StringAttr(a) for a in varying])
        return self.add(clone)

    def region(self, build: Callable[[], list[SSAValue]]) -> tuple[Region, list[Attribute]]:
        """A region running what `build` adds, returning what it gives."""
        saved, self.block = self.block, Block()
        try:
            outs = build()
            self.add(shlo.ReturnOp(list(outs)))
            return Region(self.block), [v.type for v in outs]
        finally:
            self.block = saved

    def case(
        self,
        index: SSAValue,
        branches: Sequence[Callable[[], list[SSAValue]]],
        varying: Sequence[Sequence[str]],
    ) -> list[SSAValue]:
        """`stablehlo.case` of `branches` (each gives the same types)."""
        built = [self.region(build) for build in branches]
        op = shlo.CaseOp.create(
            operands=[index], result_types=built[0][1], regions=[r for r, _ in built]
        )
        op.attributes[VARYING] = per_result(varying)
        return list(self.add(op).results)

    def if_(
        self,
        pred: SSAValue,
        taken: Callable[[], list[SSAValue]],
        other: Callable[[], list[SSAValue]],
        varying: Sequence[Sequence[str]],
    ) -> list[SSAValue]:
        """`stablehlo.if`: `taken` where `pred` holds, else `other`."""
        (yes, types), (no, _) = self.region(taken), self.region(other)
        op = shlo.IfOp.create(operands=[pred], result_types=types, regions=[yes, no])
        op.attributes[VARYING] = per_result(varying)
        return list(self.add(op).results)

    def of_stage(self, table: Sequence[int], stage: SSAValue) -> SSAValue:
        """`table[stage]` (a constant table indexed by the device's stage)."""
        ty = TensorType(i32, [len(table)])
        const = self.add(shlo.ConstantOp(DenseIntOrFPElementsAttr.from_list(ty, list(table))))
        return self.load(const.results[0], stage)

    def put(self, stack: SSAValue, value: SSAValue, index: SSAValue | int) -> SSAValue:
        """`stack` with row `index` set to `value`."""
        at = self.const(index) if isinstance(index, int) else index
        return self._updated(stack, self._lead(value), at)


def per_result(varying: Sequence[Sequence[str]]) -> ArrayAttr:
    return ArrayAttr([ArrayAttr([StringAttr(a) for a in axes]) for axes in varying])


def stacked(ty: Attribute, n: int) -> TensorType:
    assert isinstance(ty, TensorType)
    return TensorType(ty.get_element_type(), [n, *ty.get_shape()])
