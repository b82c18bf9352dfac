"""StableHLO ops that move, select or create elements without computing on them.

broadcast_in_dim, reshape, transpose, reverse, concatenate, slice, dynamic_slice, pad,
gather, scatter, iota and constant. (scatter combines updates with its region,
which runs through the interpreter.) See `dialects.interpreter.stablehlo` for
the conventions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.ir import Region
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo

from dialects.attributes import ints
from dialects.dtypes import dense_to_numpy
from dialects.interpreter.common import (
    element_dtype,
    run_region,
    scalars,
    single_binary_op,
    typed,
)
from dialects.regions import returns_update
from dialects.stablehlo_ext import DynamicUpdateSliceOp, PadOp, ReverseOp, SliceOp

# --------------------------------------------------------------------------
# Data movement


def broadcast_in_dim(x: np.ndarray, dims: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    order = np.argsort(dims)
    x = np.transpose(x, order)
    expanded = [1] * len(shape)
    for size, dim in zip(x.shape, sorted(dims), strict=True):
        expanded[dim] = size
    return np.array(np.broadcast_to(x.reshape(expanded), tuple(shape)))


def pad(
    x: np.ndarray,
    value: np.ndarray,
    low: Sequence[int],
    high: Sequence[int],
    interior: Sequence[int],
) -> np.ndarray:
    """Interior padding first, then edge padding; negative edges cut elements off."""
    full_shape, inside, kept = [], [], []
    for n, lo, hi, i in zip(x.shape, low, high, interior, strict=True):
        spread = n + max(n - 1, 0) * i  # x with i padding elements between neighbours
        full = max(lo, 0) + spread + max(hi, 0)
        full_shape.append(full)
        inside.append(slice(max(lo, 0), max(lo, 0) + spread, i + 1))
        kept.append(slice(max(-lo, 0), full - max(-hi, 0)))
    result = np.full(full_shape, value, dtype=x.dtype)
    result[tuple(inside)] = x
    return result[tuple(kept)]


def _index_vector(indices: np.ndarray, batch_index: Sequence[Any], vector_dim: int) -> list[Any]:
    """The components of `indices[bi0, ..., :, ..., biN]`, `:` at `vector_dim`."""
    indices = indices.astype(np.int64)
    if vector_dim == indices.ndim:
        return [indices[tuple(batch_index)]]
    before, after = tuple(batch_index[:vector_dim]), tuple(batch_index[vector_dim:])
    return [indices[(*before, k, *after)] for k in range(indices.shape[vector_dim])]


def gather(
    operand: np.ndarray,
    start_indices: np.ndarray,
    dn: shlo.GatherDimensionNumbers,
    slice_sizes: Sequence[int],
    result_shape: Sequence[int],
) -> np.ndarray:
    """`result[result_index] = operand[operand_index]`, computed for all indices at once."""
    offset_dims = ints(dn.offset_dims)
    collapsed, operand_batching = ints(dn.collapsed_slice_dims), ints(dn.operand_batching_dims)
    vector_dim = dn.index_vector_dim.value.data
    result_index = np.indices(tuple(result_shape), sparse=False)
    batch_index = [result_index[d] for d in range(len(result_shape)) if d not in offset_dims]
    start = _index_vector(start_indices, batch_index, vector_dim)

    operand_index: list[Any] = [0] * operand.ndim
    for d_start, d_operand in enumerate(ints(dn.start_index_map)):
        high = operand.shape[d_operand] - slice_sizes[d_operand]
        operand_index[d_operand] = np.clip(start[d_start], 0, high)
    start_batching = ints(dn.start_indices_batching_dims)
    for d_operand, d_start in zip(operand_batching, start_batching, strict=True):
        operand_index[d_operand] = batch_index[d_start - (d_start >= vector_dim)]
    window_dims = [d for d in range(operand.ndim) if d not in collapsed + operand_batching]
    for d_operand, d_result in zip(window_dims, offset_dims, strict=True):
        operand_index[d_operand] = operand_index[d_operand] + result_index[d_result]
    full = [np.broadcast_to(i, tuple(result_shape)) for i in operand_index]
    return operand[tuple(full)]


def scatter_targets(
    operand_shape: Sequence[int],
    scatter_indices: np.ndarray,
    update_shape: Sequence[int],
    dn: shlo.ScatterDimensionNumbers,
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """For every update element, its result index and whether its window is in bounds.

    A window that is not entirely inside the result is dropped, as XLA does.
    """
    window_dims = ints(dn.update_window_dims)
    inserted, input_batching = ints(dn.inserted_window_dims), ints(dn.input_batching_dims)
    vector_dim = dn.index_vector_dim.value.data
    update_index = np.indices(tuple(update_shape), sparse=False)
    scatter_index = [update_index[d] for d in range(len(update_shape)) if d not in window_dims]
    start = _index_vector(scatter_indices, scatter_index, vector_dim)

    zero = np.zeros(tuple(update_shape), dtype=np.int64)
    window_start: list[Any] = [zero] * len(operand_shape)
    for d_start, d_input in enumerate(ints(dn.scatter_dims_to_operand_dims)):
        window_start[d_input] = window_start[d_input] + start[d_start]
    indices_batching = ints(dn.scatter_indices_batching_dims)
    for d_input, d_start in zip(input_batching, indices_batching, strict=True):
        batch = scatter_index[d_start - (d_start >= vector_dim)]
        window_start[d_input] = window_start[d_input] + batch
    extent = [1] * len(operand_shape)
    target = list(window_start)
    not_window = inserted + input_batching
    operand_window_dims = [d for d in range(len(operand_shape)) if d not in not_window]
    for d_input, d_update in zip(operand_window_dims, window_dims, strict=True):
        extent[d_input] = update_shape[d_update]
        target[d_input] = target[d_input] + update_index[d_update]
    in_bounds = np.ones(tuple(update_shape), dtype=bool)
    for d, size in enumerate(operand_shape):
        in_bounds &= (window_start[d] >= 0) & (window_start[d] + extent[d] <= size)
    return tuple(np.broadcast_to(t, tuple(update_shape)) for t in target), in_bounds


def scatter(
    interp: Interpreter,
    body: Region,
    inputs: Sequence[np.ndarray],
    scatter_indices: np.ndarray,
    updates: Sequence[np.ndarray],
    dn: shlo.ScatterDimensionNumbers,
) -> list[np.ndarray]:
    """Apply `body(result, update)` for each update element, in row-major update order."""
    results = [np.array(x) for x in inputs]
    target, in_bounds = scatter_targets(results[0].shape, scatter_indices, updates[0].shape, dn)
    where = tuple(t[in_bounds] for t in target)
    values = [u[in_bounds] for u in updates]
    single = single_binary_op(body) if len(inputs) == 1 else None
    if returns_update(body):
        for result, value in zip(results, values, strict=True):
            result[where] = value
    elif single is shlo.AddOp and results[0].dtype != np.bool_:
        np.add.at(results[0], where, values[0])  # sequential, rounding after each add
    elif single is shlo.MultiplyOp and results[0].dtype != np.bool_:
        np.multiply.at(results[0], where, values[0])
    else:
        for k in range(len(where[0]) if where else 0):
            index = tuple(int(w[k]) for w in where)
            current = scalars(results, index)
            update = [np.asarray(v[k]) for v in values]
            new = run_region(interp, body, [*current, *update], "stablehlo.scatter")
            for result, value in zip(results, new, strict=True):
                result[index] = value
    return results


def iota(shape: Sequence[int], dim: int, dtype: np.dtype) -> np.ndarray:
    counts = np.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    return np.broadcast_to(counts, tuple(shape)).astype(dtype)


# --------------------------------------------------------------------------
# The interpreter functions


def _clamped_window(starts, shape, sizes) -> tuple[slice, ...]:
    """The window of `sizes` at run-time `starts`, each start clamped so the
    window lies inside `shape` (StableHLO's dynamic_slice/update_slice rule)."""
    window = []
    for start, dim, size in zip(starts, shape, sizes, strict=True):
        first = min(max(int(np.asarray(start)), 0), dim - size)
        window.append(slice(first, first + size))
    return tuple(window)


@register_impls
class DataMovementFunctions(InterpreterFunctions):
    """Ops that move, select or create elements without computing on them."""

    @impl(shlo.BroadcastInDimOp)
    def run_broadcast_in_dim(
        self, interp: Interpreter, op: shlo.BroadcastInDimOp, args: PythonValues
    ) -> PythonValues:
        ty = op.result.type
        dims = ints(op.broadcast_dimensions)
        return (typed(broadcast_in_dim(np.asarray(args[0]), dims, ty.get_shape()), ty),)

    @impl(shlo.DynamicBroadcastInDimOp)
    def run_dynamic_broadcast_in_dim(
        self, interp: Interpreter, op: shlo.DynamicBroadcastInDimOp, args: PythonValues
    ) -> PythonValues:
        shape = [int(d) for d in np.asarray(args[1])]
        dims = ints(op.broadcast_dimensions)
        return (typed(broadcast_in_dim(np.asarray(args[0]), dims, shape), op.result.type),)

    @impl(shlo.ConcatenateOp)
    def run_concatenate(
        self, interp: Interpreter, op: shlo.ConcatenateOp, args: PythonValues
    ) -> PythonValues:
        value = np.concatenate([np.asarray(a) for a in args], axis=op.dimension.value.data)
        return (typed(value, op.result.type),)

    @impl(shlo.DynamicSliceOp)
    def run_dynamic_slice(
        self, interp: Interpreter, op: shlo.DynamicSliceOp, args: PythonValues
    ) -> PythonValues:
        """Start indices are clamped so that the slice lies inside the operand."""
        x = np.asarray(args[0])
        window = _clamped_window(args[1:], x.shape, ints(op.slice_sizes))
        return (typed(x[window], op.result.type),)

    @impl(DynamicUpdateSliceOp)
    def run_dynamic_update_slice(
        self, interp: Interpreter, op: DynamicUpdateSliceOp, args: PythonValues
    ) -> PythonValues:
        """Start indices are clamped so that the update lies inside the operand."""
        x, update = np.array(args[0]), np.asarray(args[1])
        x[_clamped_window(args[2:], x.shape, update.shape)] = update
        return (typed(x, op.result.type),)

    @impl(shlo.GatherOp)
    def run_gather(
        self, interp: Interpreter, op: shlo.GatherOp, args: PythonValues
    ) -> PythonValues:
        ty = op.result.type
        value = gather(
            np.asarray(args[0]),
            np.asarray(args[1]),
            op.dimension_numbers,
            ints(op.slice_sizes),
            ty.get_shape(),
        )
        return (typed(value, ty),)

    @impl(PadOp)
    def run_pad(self, interp: Interpreter, op: PadOp, args: PythonValues) -> PythonValues:
        value = pad(
            np.asarray(args[0]),
            np.asarray(args[1]),
            ints(op.edge_padding_low),
            ints(op.edge_padding_high),
            ints(op.interior_padding),
        )
        return (typed(value, op.result.type),)

    @impl(shlo.ReshapeOp)
    def run_reshape(
        self, interp: Interpreter, op: shlo.ReshapeOp, args: PythonValues
    ) -> PythonValues:
        ty = op.result.type
        return (typed(np.reshape(args[0], ty.get_shape()), ty),)

    @impl(ReverseOp)
    def run_reverse(self, interp: Interpreter, op: ReverseOp, args: PythonValues) -> PythonValues:
        value = np.flip(np.asarray(args[0]), axis=ints(op.dimensions))
        return (typed(value, op.result.type),)

    @impl(shlo.ScatterOp)
    def run_scatter(
        self, interp: Interpreter, op: shlo.ScatterOp, args: PythonValues
    ) -> PythonValues:
        n = len(op.inputs)
        arrays = [np.asarray(a) for a in args]
        body, dn = op.update_computation, op.scatter_dimension_numbers
        with np.errstate(all="ignore"):
            results = scatter(interp, body, arrays[:n], arrays[n], arrays[n + 1 :], dn)
        return tuple(typed(v, r.type) for v, r in zip(results, op.results, strict=True))

    @impl(SliceOp)
    def run_slice(self, interp: Interpreter, op: SliceOp, args: PythonValues) -> PythonValues:
        """Bounds outside the operand are an error, never clamped (NumPy would)."""
        x = np.asarray(args[0])
        bounds = zip(
            ints(op.start_indices),
            ints(op.limit_indices),
            ints(op.strides),
            strict=True,
        )
        window = []
        for d, (start, limit, stride) in enumerate(bounds):
            if not 0 <= start <= limit <= x.shape[d] or stride <= 0:
                raise InterpretationError(
                    f"stablehlo.slice reads [{start}:{limit}:{stride}] of dim {d}, "
                    f"which has size {x.shape[d]}"
                )
            window.append(slice(start, limit, stride))
        return (typed(x[tuple(window)], op.result.type),)

    @impl(shlo.TransposeOp)
    def run_transpose(
        self, interp: Interpreter, op: shlo.TransposeOp, args: PythonValues
    ) -> PythonValues:
        return (typed(np.transpose(args[0], ints(op.permutation)), op.result.type),)

    @impl(shlo.ConstantOp)
    def run_constant(
        self, interp: Interpreter, op: shlo.ConstantOp, args: PythonValues
    ) -> PythonValues:
        return (typed(dense_to_numpy(op.value), op.output.type),)

    @impl(shlo.IotaOp)
    def run_iota(self, interp: Interpreter, op: shlo.IotaOp, args: PythonValues) -> PythonValues:
        ty = op.output.type
        value = iota(ty.get_shape(), op.iota_dimension.value.data, element_dtype(ty))
        return (typed(value, ty),)
