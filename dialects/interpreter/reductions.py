"""StableHLO ops that combine elements: dot_general, convolution, reduce,
reduce_window, select_and_scatter, sort and map.

convolution gathers each output position's window of the (dilated, padded)
input and contracts it with the kernel like dot_general. reduce and map run
their region through the interpreter (once on whole arrays when it is
elementwise); a reduce body that is a single add / multiply / max /
min / and / or / xor is reduced by NumPy. reduce_window gathers each result's
window (after base dilation and padding with the init value) and reduces it
like reduce; select_and_scatter walks the same windows with its `select`
region and scatters with its `scatter` region. See
`dialects.interpreter.stablehlo` for the conventions.
"""

from __future__ import annotations

import functools
import math
import string
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.ir import Operation, Region
from xdsl_jax.dialects import stablehlo as shlo

from dialects.attributes import ints
from dialects.convolution import ConvolutionOp
from dialects.dtypes import element_kind
from dialects.interpreter.common import (
    element_dtype,
    run_region,
    runs_batched,
    scalars,
    single_binary_op,
    typed,
    widen,
)
from dialects.interpreter.elementwise import add, maximum, minimum, multiply
from dialects.stablehlo_ext import ReduceOp, ReduceWindowOp, SelectAndScatterOp, SortOp

# --------------------------------------------------------------------------
# Folding a region


def _fold(
    interp: Interpreter, body: Region, accumulators: Sequence[Any], columns: Sequence[np.ndarray]
) -> list[Any]:
    """Left fold of `body` over the last axis of `columns`, starting from `accumulators`."""
    values = list(accumulators)
    for r in range(columns[0].shape[-1]):
        values = list(run_region(interp, body, [*values, *(c[..., r] for c in columns)], "fold"))
    return values


def fold_region(
    interp: Interpreter,
    body: Region,
    inits: Sequence[np.ndarray],
    columns: Sequence[np.ndarray],
) -> list[np.ndarray]:
    """For each index of `columns[i][..., :]`, fold `body` over the last axis from `inits`."""
    shape = columns[0].shape[:-1]
    if runs_batched(body):
        starts = [np.broadcast_to(i, shape) for i in inits]
        return [np.broadcast_to(v, shape) for v in _fold(interp, body, starts, columns)]
    results = [np.empty(shape, dtype=i.dtype) for i in inits]
    for index in np.ndindex(*shape):
        row = [np.asarray(c[index]) for c in columns]
        for result, value in zip(results, _fold(interp, body, inits, row), strict=True):
            result[index] = value
    return results


# --------------------------------------------------------------------------
# reduce


def _to_columns(x: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    """`x` with the reduced `dims` moved last and flattened into one axis."""
    kept = x.ndim - len(dims)
    moved = np.moveaxis(x, list(dims), list(range(kept, x.ndim)))
    return moved.reshape(*moved.shape[:kept], math.prod(moved.shape[kept:]))


def _tree(combine: Callable[[np.ndarray, np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """Pairwise reduction over the last axis, which must not be empty."""
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        paired = combine(x[..., :half], x[..., half : 2 * half])
        x = np.concatenate([paired, x[..., 2 * half :]], axis=-1)
    return x[..., 0]


def _sum(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        return np.any(x, axis=-1)
    return np.sum(widen(x), axis=-1, dtype=None if element_kind(x.dtype) in "fc" else x.dtype)


def _product(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        return np.all(x, axis=-1)
    return np.prod(widen(x), axis=-1, dtype=None if element_kind(x.dtype) in "fc" else x.dtype)


# A reduction body that is one of these ops is reduced with NumPy directly:
# (the op itself, to combine with the init value; a reduction over the last axis).
_FAST_REDUCTIONS: dict[type[Operation], tuple[Callable[..., Any], Callable[..., Any]]] = {
    shlo.AddOp: (add, _sum),
    shlo.MultiplyOp: (multiply, _product),
    shlo.MaximumOp: (maximum, lambda x: _tree(maximum, x)),
    shlo.MinimumOp: (minimum, lambda x: _tree(minimum, x)),
    shlo.AndOp: (np.bitwise_and, lambda x: np.bitwise_and.reduce(x, axis=-1)),
    shlo.OrOp: (np.bitwise_or, lambda x: np.bitwise_or.reduce(x, axis=-1)),
    shlo.XorOp: (np.bitwise_xor, lambda x: np.bitwise_xor.reduce(x, axis=-1)),
}


def reduce(
    interp: Interpreter,
    body: Region,
    inputs: Sequence[np.ndarray],
    inits: Sequence[np.ndarray],
    dims: Sequence[int],
) -> list[np.ndarray]:
    """`stablehlo.reduce`: fold `body` over `dims` of each input, starting from `inits`.

    The spec leaves the order of the fold to the implementation. A body that is
    a single add / multiply / max / min / and / or / xor is reduced by NumPy
    (float sums and products in double precision); any other body is folded
    left to right over the reduced elements in row-major order.
    """
    columns = [_to_columns(np.asarray(x), sorted(dims)) for x in inputs]
    combiner = single_binary_op(body)
    fast = _FAST_REDUCTIONS.get(combiner) if combiner is not None else None
    if fast is not None and len(inputs) == 1:
        combine, reduce_last = fast
        (column,), (init,) = columns, inits
        if column.shape[-1] == 0:
            return [np.broadcast_to(init, column.shape[:-1])]
        return [combine(np.asarray(init), np.asarray(reduce_last(column)))]
    return fold_region(interp, body, inits, columns)


# --------------------------------------------------------------------------
# reduce_window


def _padded(x: np.ndarray, init: np.ndarray, base: Sequence[int], pads: Sequence[tuple[int, int]]):
    """`x` dilated by `base` (init values between elements) and padded by
    `pads` (init values; a negative pad crops)."""
    if any(b > 1 for b in base):
        shape = [(n - 1) * b + 1 if n else 0 for n, b in zip(x.shape, base, strict=True)]
        dilated = np.full(shape, init, dtype=x.dtype)
        dilated[tuple(slice(None, None, b) for b in base)] = x
        x = dilated
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    x = np.pad(x, grow, constant_values=init)
    crop = tuple(
        slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(pads, x.shape, strict=True)
    )
    return x[crop]


def reduce_window(
    interp: Interpreter,
    body: Region,
    inputs: Sequence[np.ndarray],
    inits: Sequence[np.ndarray],
    window: Sequence[int],
    strides: Sequence[int],
    base: Sequence[int],
    dilation: Sequence[int],
    pads: Sequence[tuple[int, int]],
) -> list[np.ndarray]:
    """`stablehlo.reduce_window`: each result element reduces the window at
    its position (every `strides` step) of the dilated, padded input."""
    windows = []
    for x, init in zip(inputs, inits, strict=True):
        x = _padded(np.asarray(x), np.asarray(init), base, pads)
        extent = [(w - 1) * d + 1 for w, d in zip(window, dilation, strict=True)]
        view = np.lib.stride_tricks.sliding_window_view(x, extent)
        windows.append(view[(*(slice(None, None, s) for s in strides),
                             *(slice(None, None, d) for d in dilation))])
    rank = len(window)
    return reduce(interp, body, windows, inits, list(range(rank, 2 * rank)))


# --------------------------------------------------------------------------
# select_and_scatter


def _select_in_windows(
    interp: Interpreter,
    select: Region,
    operand: np.ndarray,
    counts: Sequence[int],
    window: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[tuple[int, int]],
) -> tuple[np.ndarray, np.ndarray]:
    """Per window (of `counts` windows per dim): whether it holds an operand
    element, and the operand index `select` picks in it.

    Positions are visited in row-major order; the first one in the operand
    (not in the padding) is picked, and each later one replaces the pick
    unless `select(picked, candidate)` holds, as XLA walks a window. So with
    `GE` the first of equal maxima is picked."""
    shape = tuple(counts)
    found = np.zeros(shape, bool)
    picked = np.zeros((*shape, operand.ndim), np.int64)
    value = np.zeros(shape, operand.dtype)
    batched = runs_batched(select)
    for offset in np.ndindex(*window):
        axes = [np.arange(c) * s + k - lo
                for c, s, k, (lo, _) in zip(counts, strides, offset, pads, strict=True)]
        grid = np.meshgrid(*axes, indexing="ij")  # the operand index per window
        inside = np.ones(shape, bool)
        for d, n in enumerate(operand.shape):
            inside &= (grid[d] >= 0) & (grid[d] < n)
        index = np.stack(grid, axis=-1) if grid else np.zeros((*shape, 0), np.int64)
        candidate = operand[tuple(np.clip(g, 0, max(n - 1, 0))
                                  for g, n in zip(grid, operand.shape, strict=True))]
        if batched:
            (keep,) = run_region(interp, select, [value, candidate], "select_and_scatter select")
            keep = np.broadcast_to(np.asarray(keep, bool), shape)
        else:
            keep = np.ones(shape, bool)
            for at in zip(*np.nonzero(inside & found), strict=True):
                (kept,) = run_region(interp, select, [np.asarray(value[at]),
                                                      np.asarray(candidate[at])], "select")
                keep[at] = bool(np.asarray(kept))
        take = inside & (~found | ~keep)
        value = np.where(take, candidate, value)
        picked = np.where(take[..., None], index, picked)
        found |= inside
    return found, picked


# A scatter region that is one of these ops accumulates with `ufunc.at`.
_SCATTER_UFUNCS: dict[type[Operation], np.ufunc] = {
    shlo.AddOp: np.add,
    shlo.MultiplyOp: np.multiply,
    shlo.MaximumOp: np.maximum,
    shlo.MinimumOp: np.minimum,
    shlo.AndOp: np.bitwise_and,
    shlo.OrOp: np.bitwise_or,
    shlo.XorOp: np.bitwise_xor,
}


def select_and_scatter(
    interp: Interpreter,
    op: SelectAndScatterOp,
    operand: np.ndarray,
    source: np.ndarray,
    init: np.ndarray,
) -> np.ndarray:
    """`stablehlo.select_and_scatter`: `init` everywhere, combined by the
    `scatter` region with each `source` element at the operand index its
    window picked (`_select_in_windows`), in row-major order of the source.
    A window wholly in the padding picks nothing; its source element is
    dropped. Sums and products accumulate in double precision."""
    found, picked = _select_in_windows(
        interp, op.select, operand, source.shape, op.window, op.strides, op.pads
    )
    targets = tuple(picked[found].T)
    combiner = single_binary_op(op.scatter)
    ufunc = _SCATTER_UFUNCS.get(combiner) if combiner is not None else None
    if ufunc is not None:
        result = np.full(operand.shape, widen(init))
        ufunc.at(result, targets, widen(source[found]))
        return result
    result = np.full(operand.shape, init)
    for at, value in zip(zip(*targets, strict=True), source[found], strict=True):
        (result[at],) = run_region(interp, op.scatter, [np.asarray(result[at]),
                                                        np.asarray(value)], "scatter")
    return result


# --------------------------------------------------------------------------
# sort


def sort(
    interp: Interpreter, comparator: Region, inputs: Sequence[np.ndarray], axis: int
) -> list[np.ndarray]:
    """`stablehlo.sort`: every lane along `axis` permuted (all inputs alike)
    into the order `comparator` defines, stably (Python's sort is)."""
    moved = [np.moveaxis(np.asarray(x), axis, -1) for x in inputs]
    outs = [np.empty_like(m) for m in moved]
    for lane in np.ndindex(*moved[0].shape[:-1]):
        rows = [m[lane] for m in moved]

        def before(i: int, j: int, rows: list[np.ndarray] = rows) -> int:
            pairs = [v for row in rows for v in (row[i], row[j])]
            if bool(np.asarray(run_region(interp, comparator, pairs, "sort comparator")[0])):
                return -1
            swapped = [v for row in rows for v in (row[j], row[i])]
            return 1 if bool(np.asarray(run_region(interp, comparator, swapped, "sort")[0])) else 0

        order = sorted(range(rows[0].shape[0]), key=functools.cmp_to_key(before))
        for out, row in zip(outs, rows, strict=True):
            out[lane] = row[order]
    return [np.moveaxis(o, -1, axis) for o in outs]


# --------------------------------------------------------------------------
# dot_general


def dot_general(
    lhs: np.ndarray,
    rhs: np.ndarray,
    batching: tuple[Sequence[int], Sequence[int]],
    contracting: tuple[Sequence[int], Sequence[int]],
) -> np.ndarray:
    """Result axes: batch dims, then lhs free dims, then rhs free dims, each in order.

    Products are summed in double precision (floats) or in 64-bit wrapping
    integers, which the result cast reduces modulo the result width.
    """
    letters = iter(string.ascii_letters)
    lhs_axes = [""] * lhs.ndim  # each dim's einsum letter ("" until it has one)
    rhs_axes = [""] * rhs.ndim
    for pairs in (batching, contracting):
        for l_dim, r_dim in zip(*pairs, strict=True):
            lhs_axes[l_dim] = rhs_axes[r_dim] = next(letters)
    lhs_free = [d for d in range(lhs.ndim) if not lhs_axes[d]]
    rhs_free = [d for d in range(rhs.ndim) if not rhs_axes[d]]
    for axes, free in ((lhs_axes, lhs_free), (rhs_axes, rhs_free)):
        for d in free:
            axes[d] = next(letters)
    out = [lhs_axes[d] for d in batching[0]] + [lhs_axes[d] for d in lhs_free]
    out += [rhs_axes[d] for d in rhs_free]
    spec = f"{''.join(lhs_axes)},{''.join(rhs_axes)}->{''.join(out)}"
    return np.einsum(spec, _dot_operand(lhs), _dot_operand(rhs), optimize=True)


def _dot_operand(x: np.ndarray) -> np.ndarray:
    return widen(x) if element_kind(x.dtype) in "fc" else x.astype(np.int64)


# --------------------------------------------------------------------------
# convolution


def convolution(op: ConvolutionOp, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """`stablehlo.convolution` as the spec defines it: each output position
    contracts its window of the input (dilated by `lhs_dilation`, zero-padded)
    with the kernel (dilated by `rhs_dilation`, reversed where asked) over the
    input features. Feature groups pair the i-th slice of the input features
    with the i-th slice of the output features; batch groups do the same with
    slices of the batch. Summed like dot_general."""
    lhs_l, kernel_l, out_l = op.layouts
    rank = len(lhs_l.spatial)
    x = np.transpose(_dot_operand(lhs), (lhs_l.major, *lhs_l.spatial, lhs_l.minor))
    k = np.transpose(_dot_operand(rhs), (*kernel_l.spatial, kernel_l.major, kernel_l.minor))
    flips = tuple(d for d, flip in enumerate(op.reversed_window) if flip)
    if flips:
        k = np.flip(k, flips)
    zero = np.zeros((), x.dtype)
    x = _padded(x, zero, (1, *op.lhs_dilations, 1), ((0, 0), *op.pads, (0, 0)))
    extent = [(w - 1) * d + 1 for w, d in zip(k.shape[:rank], op.rhs_dilations, strict=True)]
    view = np.lib.stride_tricks.sliding_window_view(x, extent, axis=tuple(range(1, rank + 1)))
    # [N, out spatial..., C, window...]
    view = view[(slice(None), *(slice(None, None, s) for s in op.strides), slice(None),
                 *(slice(None, None, d) for d in op.rhs_dilations))]
    groups = op.feature_groups * op.batch_groups
    n, c, o = x.shape[0], x.shape[-1], k.shape[-1]
    spatial = view.shape[1 : rank + 1]
    if op.batch_groups > 1:  # batch group g runs over batch rows [g*n/G, (g+1)*n/G)
        view = view.reshape(groups, n // groups, *spatial, c, *k.shape[:rank])
        view = np.moveaxis(view, 0, rank + 1)  # [N/G, spatial..., G, C, window...]
        cg = c
    else:  # feature group g reads input features [g*c/G, (g+1)*c/G)
        cg = c // groups
        view = view.reshape(n, *spatial, groups, cg, *k.shape[:rank])
    kg = k.reshape(*k.shape[:rank], cg, groups, o // groups)
    letters = string.ascii_letters
    win = letters[:rank]
    sp = letters[rank : 2 * rank]
    spec = f"N{sp}GC{win},{win}CGO->N{sp}GO"
    out = np.einsum(spec, view, kg, optimize=True)
    out = out.reshape(*out.shape[: rank + 1], -1)  # [N', spatial..., O]
    order = (out_l.major, *out_l.spatial, out_l.minor)
    return np.transpose(out, np.argsort(order))


# --------------------------------------------------------------------------
# The interpreter functions


@register_impls
class ReductionFunctions(InterpreterFunctions):
    """dot_general, reduce and map: the ops that combine elements."""

    @impl(shlo.MapOp)
    def run_map(self, interp: Interpreter, op: shlo.MapOp, args: PythonValues) -> PythonValues:
        (region,) = op.computation
        ty = op.result.type
        inputs = [np.asarray(a) for a in args]
        if runs_batched(region):
            (value,) = run_region(interp, region, inputs, "stablehlo.map")
            return (typed(np.broadcast_to(value, inputs[0].shape), ty),)
        result = np.empty(inputs[0].shape, dtype=element_dtype(ty))
        for index in np.ndindex(*result.shape):
            (result[index],) = run_region(interp, region, scalars(inputs, index), "stablehlo.map")
        return (typed(result, ty),)

    @impl(shlo.DotGeneralOp)
    def run_dot_general(
        self, interp: Interpreter, op: shlo.DotGeneralOp, args: PythonValues
    ) -> PythonValues:
        dn = op.dot_dimension_numbers
        batching = (ints(dn.lhs_batching_dimensions), ints(dn.rhs_batching_dimensions))
        contracting = (ints(dn.lhs_contracting_dimensions), ints(dn.rhs_contracting_dimensions))
        with np.errstate(all="ignore"):
            value = dot_general(np.asarray(args[0]), np.asarray(args[1]), batching, contracting)
            ty = op.results[0].type
            if element_dtype(ty) == np.bool_:
                value = value != 0
            return (typed(value, ty),)

    @impl(ConvolutionOp)
    def run_convolution(
        self, interp: Interpreter, op: ConvolutionOp, args: PythonValues
    ) -> PythonValues:
        with np.errstate(all="ignore"):
            value = convolution(op, np.asarray(args[0]), np.asarray(args[1]))
            return (typed(value, op.result.type),)

    @impl(SortOp)
    def run_sort(self, interp: Interpreter, op: SortOp, args: PythonValues) -> PythonValues:
        values = sort(interp, op.comparator, [np.asarray(a) for a in args], op.axis)
        return tuple(typed(v, r.type) for v, r in zip(values, op.results, strict=True))

    @impl(ReduceWindowOp)
    def run_reduce_window(
        self, interp: Interpreter, op: ReduceWindowOp, args: PythonValues
    ) -> PythonValues:
        n = len(op.inputs)
        arrays = [np.asarray(a) for a in args]
        with np.errstate(all="ignore"):
            values = reduce_window(
                interp, op.body, arrays[:n], arrays[n:], op.window, op.strides,
                op.base_dilation, op.window_dilation, op.pads,
            )
            return tuple(typed(v, r.type) for v, r in zip(values, op.results, strict=True))

    @impl(SelectAndScatterOp)
    def run_select_and_scatter(
        self, interp: Interpreter, op: SelectAndScatterOp, args: PythonValues
    ) -> PythonValues:
        operand, source, init = (np.asarray(a) for a in args)
        with np.errstate(all="ignore"):
            return (typed(select_and_scatter(interp, op, operand, source, init), op.result.type),)

    @impl(ReduceOp)
    def run_reduce(self, interp: Interpreter, op: ReduceOp, args: PythonValues) -> PythonValues:
        n = len(op.inputs)
        arrays = [np.asarray(a) for a in args]
        with np.errstate(all="ignore"):
            values = reduce(interp, op.body, arrays[:n], arrays[n:], ints(op.dimensions))
            return tuple(typed(v, r.type) for v, r in zip(values, op.results, strict=True))
