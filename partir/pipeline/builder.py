"""The ops a pipeline schedule is made of, appended to one block.

Constants, per-microbatch buffers (a stack of values, read and written at a
run-time index), a value's part along a dim, and conditionals built from
Python functions that add their branches' ops (`region`, `case`). The
schedule (`partir.pipeline.program`) says what to build; this says how, in
StableHLO and the SPMD dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

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

Branch = Callable[[], list[SSAValue]]
"""Adds a branch's ops to the builder and gives the values it returns."""


class Builder:
    """Appends ops to the pipelined function's block (or a branch's)."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.memo: dict[object, SSAValue] = {}

    def add(self, op: Operation) -> Operation:
        self.block.add_op(op)
        return op

    def _one(self, op: Operation) -> SSAValue:
        return self.add(op).results[0]

    def const(self, n: int) -> SSAValue:
        key = ("i32", n, id(self.block))
        if key not in self.memo:
            self.memo[key] = self._one(splat(TensorType(i32, []), n))
        return self.memo[key]

    def zeros(self, ty: Attribute) -> SSAValue:
        assert isinstance(ty, TensorType)
        scalar = self._one(splat(TensorType(ty.get_element_type(), []), 0))
        return self._broadcast(scalar, ty.get_shape(), [])

    def _broadcast(self, value: SSAValue, shape: Sequence[int], dims: Iterable[int]) -> SSAValue:
        ty = TensorType(value.type.get_element_type(), list(shape))  # type: ignore[attr-defined]
        dimensions = {"broadcast_dimensions": DenseArrayBase.from_list(i64, list(dims))}
        return self._one(
            shlo.BroadcastInDimOp.create(operands=[value], result_types=[ty], properties=dimensions)
        )

    def sum(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self._one(shlo.AddOp(x, y, x.type))

    def cmp(self, x: SSAValue, y: SSAValue, direction: str) -> SSAValue:
        return self._one(CompareOp(x, y, ComparisonDirection[direction]))

    def and_(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self._one(shlo.AndOp(x, y, x.type))

    def select(self, pred: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._one(shlo.SelectOp.create(operands=[pred, a, b], result_types=[a.type]))

    def rows(self, value: SSAValue, dim: int, start: int, stop: int) -> SSAValue:
        """`value`'s elements `start` to `stop` along `dim`."""
        ty = value.type
        assert isinstance(ty, TensorType)
        shape = list(ty.get_shape())
        starts, limits = [0] * len(shape), list(shape)
        starts[dim], limits[dim] = start, stop
        shape[dim] = stop - start
        return self._one(
            SliceOp.create(
                operands=[value],
                result_types=[TensorType(ty.get_element_type(), shape)],
                properties={
                    "start_indices": DenseArrayBase.from_list(i64, starts),
                    "limit_indices": DenseArrayBase.from_list(i64, limits),
                    "strides": DenseArrayBase.from_list(i64, [1] * len(shape)),
                },
            )
        )

    def stack(self, values: Sequence[SSAValue]) -> SSAValue:
        return self.concat([self._lead(v) for v in values])

    def _lead(self, value: SSAValue) -> SSAValue:
        """`value` with a leading dim of 1."""
        shape = value.type.get_shape()  # type: ignore[attr-defined]
        return self._broadcast(value, [1, *shape], range(1, len(shape) + 1))

    def concat(self, values: Sequence[SSAValue]) -> SSAValue:
        """`values` one after another along dim 0."""
        ty = values[0].type
        assert isinstance(ty, TensorType)
        rows = sum(v.type.get_shape()[0] for v in values)  # type: ignore[attr-defined]
        return self._one(
            shlo.ConcatenateOp.create(
                operands=list(values),
                result_types=[TensorType(ty.get_element_type(), [rows, *ty.get_shape()[1:]])],
                properties={"dimension": IntegerAttr(0, i64)},
            )
        )

    def reshape(self, value: SSAValue, shape: Sequence[int]) -> SSAValue:
        ty = TensorType(value.type.get_element_type(), list(shape))  # type: ignore[attr-defined]
        return self._one(shlo.ReshapeOp.create(operands=[value], result_types=[ty]))

    def _rows(self, value: SSAValue, start: SSAValue, n: int, dim: int = 0) -> SSAValue:
        """Elements `start` to `start + n` of `value` along `dim` (`start`
        known at run time)."""
        ty = value.type
        assert isinstance(ty, TensorType)
        shape = list(ty.get_shape())
        shape[dim] = n
        starts = [self.const(0)] * len(shape)
        starts[dim] = start
        return self._one(
            shlo.DynamicSliceOp.create(
                operands=[value, *starts],
                result_types=[TensorType(ty.get_element_type(), shape)],
                properties={"slice_sizes": DenseArrayBase.from_list(i64, shape)},
            )
        )

    def _updated(self, value: SSAValue, rows: SSAValue, start: SSAValue) -> SSAValue:
        """`value` with `rows` written from row `start` on."""
        zeros = [self.const(0)] * (value.type.get_num_dims() - 1)  # type: ignore[attr-defined]
        operands = [value, rows, start, *zeros]
        return self._one(DynamicUpdateSliceOp.create(operands=operands, result_types=[value.type]))

    def _times(self, index: SSAValue, n: int) -> SSAValue:
        return self._one(shlo.MultiplyOp(index, self.const(n), index.type))

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

    def put(self, stack: SSAValue, value: SSAValue, index: SSAValue) -> SSAValue:
        """`stack` with row `index` set to `value`."""
        return self._updated(stack, self._lead(value), index)

    def store(self, stack: SSAValue, value: SSAValue, index: SSAValue, valid: SSAValue) -> SSAValue:
        """`stack` with row `index` set to `value` where `valid` holds; else the
        stack's last row, which no microbatch uses, takes it (an update in
        place, where a select against the kept row would be a copy of it)."""
        spare = self.const(stack.type.get_shape()[0] - 1)  # type: ignore[attr-defined]
        return self.put(stack, value, self.select(valid, index, spare))

    def of_stage(self, table: Sequence[int], stage: SSAValue) -> SSAValue:
        """`table[stage]` (a constant table indexed by the device's stage)."""
        ty = TensorType(i32, [len(table)])
        const = self._one(shlo.ConstantOp(DenseIntOrFPElementsAttr.from_list(ty, list(table))))
        return self.load(const, stage)

    def part(
        self, value: SSAValue, d: int, n: int, index: SSAValue | int, before: Operation
    ) -> SSAValue:
        """Part `index` (of size `n`) of `value` along dim `d`, made before `before`."""
        scratch = Builder(Block())
        if isinstance(index, int):
            made = scratch.rows(value, d, index * n, (index + 1) * n)
        else:
            made = scratch._rows(value, scratch._times(index, n), n, d)
        ops = list(scratch.block.ops)
        for op in ops:
            op.detach()
        Rewriter.insert_op(ops, InsertPoint.before(before))
        return made

    def clone(self, ops: Sequence[Operation], values: dict[SSAValue, SSAValue]) -> list[Operation]:
        """Clone `ops` in order, reading `values` for the values they map."""
        return [self.add(op.clone(value_mapper=values)) for op in ops]

    def clone_loop(
        self, loop: Operation, operands: Sequence[SSAValue], varying: Sequence[str]
    ) -> Operation:
        clone = loop.clone()
        clone.operands = list(operands)
        clone.attributes[VARYING] = ArrayAttr([StringAttr(a) for a in varying])
        return self.add(clone)

    def region(self, build: Branch) -> tuple[Region, list[Attribute]]:
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
        branches: Sequence[Branch],
        varying: Sequence[Sequence[str]],
        kind: type[Operation] = shlo.CaseOp,
    ) -> list[SSAValue]:
        """`stablehlo.case` of `branches` (each gives the same types, which
        differ over the `varying` axes); `kind=shlo.IfOp`: `stablehlo.if` on
        a predicate, the branches (taken, other)."""
        built = [self.region(build) for build in branches]
        op = kind.create(operands=[index], result_types=built[0][1], regions=[r for r, _ in built])
        op.attributes[VARYING] = ArrayAttr([ArrayAttr([StringAttr(a) for a in v]) for v in varying])
        return list(self.add(op).results)


def stacked(ty: Attribute, n: int) -> TensorType:
    assert isinstance(ty, TensorType)
    return TensorType(ty.get_element_type(), [n, *ty.get_shape()])
