"""StableHLO semantics on NumPy arrays, written from the StableHLO spec.

This is the oracle for every partir rewrite, so each op is a direct reading of
https://github.com/openxla/stablehlo/blob/main/docs/spec.md, not a fast kernel.
Conventions that hold throughout:

- Floating-point and complex ops are evaluated on float64 / complex128 copies
  of their operands and rounded once to the result type, as StableHLO's own
  reference interpreter does (`mapWithUpcastToDouble`). For + - * / and sqrt
  this is the correctly rounded result in every type up to f32.
- Integer arithmetic wraps (two's complement).
- Where the spec leaves a case implementation-defined, the interpreter does
  what XLA does: integer x/0 = -1 and x%0 = x, INT_MIN/-1 = INT_MIN; float to
  integer conversion truncates and saturates (NaN -> 0); a scatter update
  whose window is not entirely inside the result is dropped. (Unlike XLA on
  CPU, subnormals are not flushed to zero, and reduce_precision to 0 mantissa
  bits turns NaN into inf, as the spec's reference interpreter does.)
- Regions (reduce, map, scatter bodies) are run through the interpreter. A
  region made only of elementwise ops is run once on whole arrays instead of
  once per element; for elementwise ops the two are the same computation.

An op this module cannot give a meaning raises `InterpretationError` naming it.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects.builtin import DYNAMIC_INDEX, ArrayAttr, IntegerAttr, TensorType
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    ReturnedValues,
    TerminatorValue,
    impl,
    impl_terminator,
    register_impls,
)
from xdsl.ir import Attribute, Operation, Region
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.dialects.stablehlo.attributes import ComparisonDirection, ComparisonType
from xdsl_jax.xdsl_extras.traits import Elementwise

from dialects.chlo import ChloBinaryOp, ChloUnaryOp
from dialects.interpreter.dtypes import dense_to_numpy, element_kind, numpy_dtype
from dialects.stablehlo_ext import CompareOp, PadOp, ReduceOp

# --------------------------------------------------------------------------
# Types and attributes


def element_dtype(ty: Attribute) -> np.dtype:
    """The NumPy dtype of a tensor type's elements."""
    if not isinstance(ty, TensorType):
        raise InterpretationError(f"expected a tensor type, got {ty}")
    return numpy_dtype(ty.element_type)


def typed(value: Any, ty: Attribute) -> np.ndarray:
    """`value` as an array of exactly the tensor type `ty` (dtype cast, shape checked)."""
    array = np.asarray(value, dtype=element_dtype(ty))
    assert isinstance(ty, TensorType)
    expected = ty.get_shape()
    if len(expected) != array.ndim or any(
        e not in (DYNAMIC_INDEX, s) for e, s in zip(expected, array.shape, strict=True)
    ):
        raise InterpretationError(f"computed a value of shape {array.shape} for type {ty}")
    return array


def elementwise_result(value: Any, ty: Attribute) -> np.ndarray:
    """`value` cast to the element type of `ty`.

    The shape is checked only for results of rank > 0: a region of elementwise
    ops on 0-d tensors may be run on whole arrays at once (see `runs_batched`).
    """
    assert isinstance(ty, TensorType)
    return typed(value, ty) if ty.get_shape() else np.asarray(value, dtype=element_dtype(ty))


def _ints(attr: ArrayAttr[IntegerAttr]) -> tuple[int, ...]:
    return tuple(a.value.data for a in attr.data)


def _array(attr: Any) -> tuple[int, ...]:
    """The values of a `DenseArrayBase` (`array<i64: ...>`) property."""
    return tuple(int(v) for v in attr.get_values())


def widen(x: np.ndarray) -> np.ndarray:
    """Float and complex arrays in double precision; others unchanged."""
    k = element_kind(x.dtype)
    if k == "f":
        return x.astype(np.float64)
    if k == "c":
        return x.astype(np.complex128)
    return x


def _bits(dtype: np.dtype, signed: bool) -> np.dtype:
    return np.dtype(f"{'' if signed else 'u'}int{dtype.itemsize * 8}")


# --------------------------------------------------------------------------
# Elementwise unary ops


def in_double(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` applied to double-precision copies of its operands."""
    return lambda *xs: fn(*(widen(np.asarray(x)) for x in xs))


def _abs(x: np.ndarray) -> np.ndarray:
    return np.abs(widen(x))


def _cbrt(x: np.ndarray) -> np.ndarray:
    x = widen(x)
    if element_kind(x.dtype) != "c":
        return np.cbrt(x)
    # The principal cube root, as the spec's reference interpreter defines it.
    theta = np.arctan2(x.imag, x.real) / 3.0
    return np.abs(x) ** (1.0 / 3.0) * (np.cos(theta) + 1j * np.sin(theta))


def _logistic(x: np.ndarray) -> np.ndarray:
    x = widen(x)
    return 1.0 / (1.0 + np.exp(-x))


def _not(x: np.ndarray) -> np.ndarray:
    return np.invert(x)  # logical not for i1, bitwise not for integers


def _real(x: np.ndarray) -> np.ndarray:
    return np.real(x)


def _imag(x: np.ndarray) -> np.ndarray:
    return np.imag(x) if element_kind(x.dtype) == "c" else np.zeros_like(x)


def _round_nearest_afz(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero; keeps -0.0, NaN and infinities."""
    x = widen(x)
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _sign(x: np.ndarray) -> np.ndarray:
    k = element_kind(x.dtype)
    x = widen(x)
    if k == "f":
        return np.where((x == 0) | np.isnan(x), x, np.sign(x))  # sign(±0) = ±0
    if k == "c":
        nan = np.isnan(x.real) | np.isnan(x.imag)
        magnitude = np.abs(x)
        unit = x / np.where(magnitude == 0, 1, magnitude)
        return np.where(nan, complex(np.nan, np.nan), unit)
    return np.sign(x)


def _popcnt(x: np.ndarray) -> np.ndarray:
    width = x.dtype.itemsize * 8
    u = x.view(_bits(x.dtype, signed=False))
    return sum(((u >> bit) & 1 for bit in range(width)), np.zeros_like(u))


def _count_leading_zeros(x: np.ndarray) -> np.ndarray:
    width = x.dtype.itemsize * 8
    u = x.view(_bits(x.dtype, signed=False))
    length = np.zeros(u.shape, dtype=np.int64)
    for bit in range(width):
        length = np.where((u >> bit) != 0, bit + 1, length)
    return width - length


def _is_finite(x: np.ndarray) -> np.ndarray:
    return np.isfinite(widen(x))


# --------------------------------------------------------------------------
# Elementwise binary ops


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.add(widen(a), widen(b))  # i1: logical or


def _subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.subtract(widen(a), widen(b))


def _multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.multiply(widen(a), widen(b))  # i1: logical and


def _safe_divisor(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(b with 1 where it is 0 or where a/b overflows, where b was 0)."""
    zero = b == 0
    overflow = np.zeros_like(zero)
    if element_kind(a.dtype) == "i":
        overflow = (a == np.iinfo(a.dtype).min) & (b == -1)
    return np.where(zero | overflow, np.ones_like(b), b), zero


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Float division, or integer division truncated toward zero."""
    if element_kind(a.dtype) in "fc":
        return np.divide(widen(a), widen(b))
    a, b = np.broadcast_arrays(a, b)
    divisor, zero = _safe_divisor(a, b)
    quotient = a // divisor  # rounds toward -inf ...
    inexact = (a % divisor) != 0
    quotient = np.where(inexact & ((a < 0) != (divisor < 0)), quotient + 1, quotient)
    all_ones = np.invert(np.zeros_like(a))
    return np.where(zero, all_ones, quotient)  # ... XLA: x/0 = -1 (all bits set)


def _remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The remainder with the sign of the dividend (C's fmod / `%`)."""
    k = element_kind(a.dtype)
    if k == "c":
        raise InterpretationError("stablehlo.remainder of complex numbers has no semantics")
    if k == "f":
        return np.fmod(widen(a), widen(b))
    a, b = np.broadcast_arrays(a, b)
    divisor, zero = _safe_divisor(a, b)
    return np.where(zero, a, np.fmod(a, divisor))  # XLA: x % 0 = x


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE-754 maximum for floats (NaN wins, -0 < +0); lexicographic for complex."""
    k = element_kind(a.dtype)
    if k == "f":
        wa, wb = widen(a), widen(b)
        pick_a = (wa > wb) | ((wa == wb) & np.signbit(wb)) | np.isnan(wa)
    elif k == "c":
        pick_a = (a.real > b.real) | ((a.real == b.real) & (a.imag > b.imag))
    else:
        return np.maximum(a, b)  # i1: or
    return np.where(pick_a, a, b)


def _minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE-754 minimum for floats (NaN wins, -0 < +0); lexicographic for complex."""
    k = element_kind(a.dtype)
    if k == "f":
        wa, wb = widen(a), widen(b)
        pick_a = (wa < wb) | ((wa == wb) & np.signbit(wa)) | np.isnan(wa)
    elif k == "c":
        pick_a = (a.real < b.real) | ((a.real == b.real) & (a.imag < b.imag))
    else:
        return np.minimum(a, b)  # i1: and
    return np.where(pick_a, a, b)


def _atan2(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    y, x = widen(y), widen(x)
    if element_kind(y.dtype) != "c":
        return np.arctan2(y, x)
    return -1j * np.log((x + 1j * y) / np.sqrt(x * x + y * y))


def _complex(re: np.ndarray, im: np.ndarray) -> np.ndarray:
    re, im = np.broadcast_arrays(widen(re), widen(im))
    result = np.empty(re.shape, dtype=np.complex128)
    result.real, result.imag = re, im  # not re + 1j*im, which turns inf into NaN
    return result


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if element_kind(a.dtype) in "fc":
        return np.power(widen(a), widen(b))
    if a.dtype == np.bool_:
        return _integer_power(a.astype(np.uint8), b.astype(np.uint8)).astype(np.bool_)
    return _integer_power(*np.broadcast_arrays(a, b))


def _integer_power(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """Square-and-multiply, wrapping. A negative exponent gives 0 unless |base| = 1."""
    negative = exponent < 0
    to_zero = negative & (base != 1) & (base != -1) if element_kind(base.dtype) == "i" else negative
    unsigned = _bits(exponent.dtype, signed=False)
    e = np.where(negative, -exponent, exponent).astype(exponent.dtype).view(unsigned)
    result, square = np.ones_like(base), base.copy()
    for _ in range(exponent.dtype.itemsize * 8):
        result = np.where((e & 1) != 0, result * square, result)
        square = square * square
        e = e >> 1
    return np.where(to_zero, np.zeros_like(base), result)


def _shift_amounts(x: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, the amount, whether it is in [0, bit width)); amounts are read as unsigned."""
    x, s = np.broadcast_arrays(x, s)
    unsigned = s.view(_bits(s.dtype, signed=False))
    in_range = unsigned < x.dtype.itemsize * 8
    return x, np.where(in_range, unsigned, 0).astype(x.dtype), in_range


def _shift_left(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    x, amount, in_range = _shift_amounts(x, s)
    return np.where(in_range, np.left_shift(x, amount), np.zeros_like(x))


def _shift_right_logical(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    x, amount, in_range = _shift_amounts(x, s)
    unsigned = _bits(x.dtype, signed=False)
    shifted = np.right_shift(x.view(unsigned), amount.view(unsigned)).view(x.dtype)
    return np.where(in_range, shifted, np.zeros_like(x))


def _shift_right_arithmetic(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    x, amount, in_range = _shift_amounts(x, s)
    signed = _bits(x.dtype, signed=True)
    bits = x.view(signed)
    amount = np.where(in_range, amount.view(signed), x.dtype.itemsize * 8 - 1).astype(signed)
    return np.right_shift(bits, amount).view(x.dtype)  # out of range: all sign bits


def _select(pred: np.ndarray, on_true: np.ndarray, on_false: np.ndarray) -> np.ndarray:
    return np.where(pred, on_true, on_false)


def _clamp(low: np.ndarray, x: np.ndarray, high: np.ndarray) -> np.ndarray:
    return _minimum(_maximum(x, low), high)


# --------------------------------------------------------------------------
# Ops that need more than their operands: convert, compare, reduce_precision


def convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`stablehlo.convert`: to i1 is `!= 0`; float to integer truncates and saturates."""
    source, target = element_kind(x.dtype), element_kind(dtype)
    if target == "b":
        return x != 0
    if source == "c" and target != "c":
        x, source = np.real(x), "f"
    if source == "f" and target in "iu":
        return _float_to_integer(x, dtype)
    return x.astype(dtype)


def _float_to_integer(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    t = np.trunc(x.astype(np.float64))
    too_big = t >= float(info.max) + 1  # both bounds are exact powers of two in f64
    too_small = t < float(info.min)
    nan = np.isnan(t)
    safe = np.where(too_big | too_small | nan, 0, t).astype(dtype)
    return np.where(too_big, info.max, np.where(too_small, info.min, safe)).astype(dtype)


_DIRECTIONS: dict[ComparisonDirection, Callable[[Any, Any], np.ndarray]] = {
    ComparisonDirection.EQ: np.equal,
    ComparisonDirection.NE: np.not_equal,
    ComparisonDirection.GE: np.greater_equal,
    ComparisonDirection.GT: np.greater,
    ComparisonDirection.LE: np.less_equal,
    ComparisonDirection.LT: np.less,
}
_STRICT = {
    ComparisonDirection.GE: np.greater,
    ComparisonDirection.GT: np.greater,
    ComparisonDirection.LE: np.less,
    ComparisonDirection.LT: np.less,
}


def compare(
    lhs: np.ndarray,
    rhs: np.ndarray,
    direction: ComparisonDirection,
    compare_type: ComparisonType | None,
) -> np.ndarray:
    """`stablehlo.compare`: FLOAT is IEEE (NaN unordered), TOTALORDER is IEEE totalOrder."""
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
    k = element_kind(lhs.dtype)
    if compare_type == ComparisonType.TOTALORDER:
        lhs, rhs = _total_order_key(lhs), _total_order_key(rhs)
    elif compare_type in (ComparisonType.SIGNED, ComparisonType.UNSIGNED) and k in "iu":
        bits = _bits(lhs.dtype, signed=compare_type == ComparisonType.SIGNED)
        lhs, rhs = lhs.view(bits), rhs.view(bits)
    elif k == "c" and direction in _STRICT:
        # Lexicographic on (real, imag).
        strict = _STRICT[direction]
        tie = (lhs.real == rhs.real) & _DIRECTIONS[direction](lhs.imag, rhs.imag)
        return strict(lhs.real, rhs.real) | tie
    elif k == "f":
        lhs, rhs = widen(lhs), widen(rhs)
    return _DIRECTIONS[direction](lhs, rhs)


def _total_order_key(x: np.ndarray) -> np.ndarray:
    """Integers ordered as IEEE totalOrder orders the floats: -NaN < -inf < -0 < +0 < NaN."""
    signed = _bits(x.dtype, signed=True)
    bits = x.view(signed)
    return np.where(bits < 0, bits ^ np.iinfo(signed).max, bits)


_FLOAT_LAYOUTS = {  # dtype name -> (exponent bits, mantissa bits)
    "float16": (5, 10),
    "bfloat16": (8, 7),
    "float32": (8, 23),
    "float64": (11, 52),
}


def reduce_precision(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """`x` rounded to a float with the given exponent and mantissa widths, in x's type.

    The bit manipulation of the spec's reference implementation: round the
    mantissa to nearest-even, then flush exponents out of range to ±0 / ±inf.
    """
    layout = _FLOAT_LAYOUTS.get(x.dtype.name)
    if layout is None:
        raise InterpretationError(f"stablehlo.reduce_precision on {x.dtype} is not supported")
    src_exponent, src_mantissa = layout
    width = x.dtype.itemsize * 8
    v = x.view(_bits(x.dtype, signed=False)).astype(np.uint64)
    if mantissa_bits < src_mantissa:
        shift = np.uint64(src_mantissa - mantissa_bits)
        last_bit = np.uint64(1) << shift
        bias = (last_bit >> np.uint64(1)) - np.uint64(1) + ((v & last_bit) >> shift)
        v = (v + bias) & ~(last_bit - np.uint64(1))
    if exponent_bits < src_exponent:
        sign = v & np.uint64(1 << (width - 1))
        exponent_mask = np.uint64(((1 << src_exponent) - 1) << src_mantissa)
        bias, reduced_bias = (1 << (src_exponent - 1)) - 1, (1 << (exponent_bits - 1)) - 1
        exponent = v & exponent_mask
        overflow = exponent > np.uint64((bias + reduced_bias) << src_mantissa)
        underflow = exponent <= np.uint64((bias - reduced_bias) << src_mantissa)
        v = np.where(overflow, sign | exponent_mask, np.where(underflow, sign, v))
    v = (v & np.uint64((1 << width) - 1)).astype(_bits(x.dtype, signed=False))
    result = v.view(x.dtype)
    nan_result = x if mantissa_bits > 0 else np.full_like(x, np.inf)
    return np.where(np.isnan(widen(x)), nan_result, result)


# --------------------------------------------------------------------------
# Regions


def run_region(interp: Interpreter, region: Region, args: Sequence[Any], name: str) -> tuple:
    return tuple(interp.run_ssacfg_region(region, tuple(args), name))


_BATCHABLE = (
    shlo.SelectOp, shlo.ClampOp, shlo.ConstantOp, shlo.ReturnOp, ChloUnaryOp, ChloBinaryOp
)


def _is_elementwise(op: Operation) -> bool:
    return op.has_trait(Elementwise) or isinstance(op, _BATCHABLE)


def runs_batched(region: Region) -> bool:
    """Whether `region` maps 0-d tensors through elementwise ops only.

    Such a region computes the same thing on arrays of any shape, element by
    element, so it can be run once on whole arrays.
    """
    block = region.block
    scalar_args = all(
        isinstance(a.type, TensorType) and not a.type.get_shape() for a in block.args
    )
    return scalar_args and all(_is_elementwise(op) for op in block.ops)


def _scalars(arrays: Sequence[np.ndarray], index: tuple[int, ...]) -> list[np.ndarray]:
    return [np.asarray(a[index]) for a in arrays]


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


def _single_binary_op(region: Region) -> type[Operation] | None:
    """The op class if `region` is `return op(arg0, arg1)` (either operand order)."""
    ops = list(region.block.ops)
    args = region.block.args
    if len(args) != 2 or len(ops) != 2 or not isinstance(ops[1], shlo.ReturnOp):
        return None
    op, ret = ops
    if set(op.operands) != set(args) or len(op.operands) != 2:
        return None
    if list(ret.operands) != list(op.results):
        return None
    return type(op)


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
    shlo.AddOp: (_add, _sum),
    shlo.MultiplyOp: (_multiply, _product),
    shlo.MaximumOp: (_maximum, lambda x: _tree(_maximum, x)),
    shlo.MinimumOp: (_minimum, lambda x: _tree(_minimum, x)),
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
    fast = _FAST_REDUCTIONS.get(_single_binary_op(body))  # type: ignore[arg-type]
    if fast is not None and len(inputs) == 1:
        combine, reduce_last = fast
        (column,), (init,) = columns, inits
        if column.shape[-1] == 0:
            return [np.broadcast_to(init, column.shape[:-1])]
        return [combine(np.asarray(init), np.asarray(reduce_last(column)))]
    return fold_region(interp, body, inits, columns)


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
    lhs_axes: list[str | None] = [None] * lhs.ndim
    rhs_axes: list[str | None] = [None] * rhs.ndim
    for pairs in (batching, contracting):
        for l_dim, r_dim in zip(*pairs, strict=True):
            lhs_axes[l_dim] = rhs_axes[r_dim] = next(letters)
    lhs_free = [d for d in range(lhs.ndim) if lhs_axes[d] is None]
    rhs_free = [d for d in range(rhs.ndim) if rhs_axes[d] is None]
    for axes, free in ((lhs_axes, lhs_free), (rhs_axes, rhs_free)):
        for d in free:
            axes[d] = next(letters)
    out = [lhs_axes[d] for d in batching[0]] + [lhs_axes[d] for d in lhs_free]
    out += [rhs_axes[d] for d in rhs_free]
    spec = f"{''.join(lhs_axes)},{''.join(rhs_axes)}->{''.join(out)}"  # type: ignore[arg-type]
    return np.einsum(spec, _dot_operand(lhs), _dot_operand(rhs), optimize=True)


def _dot_operand(x: np.ndarray) -> np.ndarray:
    return widen(x) if element_kind(x.dtype) in "fc" else x.astype(np.int64)


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
    offset_dims = _ints(dn.offset_dims)
    collapsed, operand_batching = _ints(dn.collapsed_slice_dims), _ints(dn.operand_batching_dims)
    vector_dim = dn.index_vector_dim.value.data
    result_index = np.indices(tuple(result_shape), sparse=False)
    batch_index = [result_index[d] for d in range(len(result_shape)) if d not in offset_dims]
    start = _index_vector(start_indices, batch_index, vector_dim)

    operand_index: list[Any] = [0] * operand.ndim
    for d_start, d_operand in enumerate(_ints(dn.start_index_map)):
        high = operand.shape[d_operand] - slice_sizes[d_operand]
        operand_index[d_operand] = np.clip(start[d_start], 0, high)
    start_batching = _ints(dn.start_indices_batching_dims)
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
    window_dims = _ints(dn.update_window_dims)
    inserted, input_batching = _ints(dn.inserted_window_dims), _ints(dn.input_batching_dims)
    vector_dim = dn.index_vector_dim.value.data
    update_index = np.indices(tuple(update_shape), sparse=False)
    scatter_index = [update_index[d] for d in range(len(update_shape)) if d not in window_dims]
    start = _index_vector(scatter_indices, scatter_index, vector_dim)

    zero = np.zeros(tuple(update_shape), dtype=np.int64)
    window_start: list[Any] = [zero] * len(operand_shape)
    for d_start, d_input in enumerate(_ints(dn.scatter_dims_to_operand_dims)):
        window_start[d_input] = window_start[d_input] + start[d_start]
    indices_batching = _ints(dn.scatter_indices_batching_dims)
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


def _returns_updates(region: Region, count: int) -> bool:
    """Whether the scatter body is `return %update...` (an overwrite)."""
    ops = list(region.block.ops)
    updates = list(region.block.args[count:])
    return len(ops) == 1 and list(ops[0].operands) == updates


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
    single = _single_binary_op(body) if len(inputs) == 1 else None
    if _returns_updates(body, len(inputs)):
        for result, value in zip(results, values, strict=True):
            result[where] = value
    elif single is shlo.AddOp and results[0].dtype != np.bool_:
        np.add.at(results[0], where, values[0])  # sequential, rounding after each add
    elif single is shlo.MultiplyOp and results[0].dtype != np.bool_:
        np.multiply.at(results[0], where, values[0])
    else:
        for k in range(len(where[0]) if where else 0):
            index = tuple(int(w[k]) for w in where)
            current = _scalars(results, index)
            update = [np.asarray(v[k]) for v in values]
            new = run_region(interp, body, [*current, *update], "stablehlo.scatter")
            for result, value in zip(results, new, strict=True):
                result[index] = value
    return results


def iota(shape: Sequence[int], dim: int, dtype: np.dtype) -> np.ndarray:
    counts = np.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    return np.broadcast_to(counts, tuple(shape)).astype(dtype)


@dataclass(frozen=True)
class Token:
    """The value of a `!stablehlo.token`: carries no data, only ordering."""


# --------------------------------------------------------------------------
# The interpreter functions


def elementwise_impl(op_type: type[Operation], fn: Callable[..., Any]) -> Any:
    """An `@impl` applying `fn` to the operands and casting to the result type."""

    @impl(op_type)
    def run(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        with np.errstate(all="ignore"):
            value = fn(*(np.asarray(a) for a in args))
        return (elementwise_result(value, op.results[0].type),)

    return run


@register_impls
class StableHLOFunctions(InterpreterFunctions):
    """Implementations of the StableHLO ops of `dialects.stablehlo_ext.StableHLO`."""

    run_abs = elementwise_impl(shlo.AbsOp, _abs)
    run_cbrt = elementwise_impl(shlo.CbrtOp, _cbrt)
    run_ceil = elementwise_impl(shlo.CeilOp, in_double(np.ceil))
    run_cosine = elementwise_impl(shlo.CosineOp, in_double(np.cos))
    run_count_leading_zeros = elementwise_impl(shlo.CountLeadingZerosOp, _count_leading_zeros)
    run_exponential = elementwise_impl(shlo.ExponentialOp, in_double(np.exp))
    run_exponential_minus_one = elementwise_impl(shlo.ExponentialMinusOneOp, in_double(np.expm1))
    run_floor = elementwise_impl(shlo.FloorOp, in_double(np.floor))
    run_imag = elementwise_impl(shlo.ImagOp, _imag)
    run_is_finite = elementwise_impl(shlo.IsFiniteOp, _is_finite)
    run_log = elementwise_impl(shlo.LogOp, in_double(np.log))
    run_log_plus_one = elementwise_impl(shlo.LogPlusOneOp, in_double(np.log1p))
    run_logistic = elementwise_impl(shlo.LogisticOp, _logistic)
    run_negate = elementwise_impl(shlo.NegateOp, np.negative)
    run_not = elementwise_impl(shlo.NotOp, _not)
    run_popcnt = elementwise_impl(shlo.PopcntOp, _popcnt)
    run_real = elementwise_impl(shlo.RealOp, _real)
    run_round_nearest_afz = elementwise_impl(shlo.RoundNearestAfzOp, _round_nearest_afz)
    run_round_nearest_even = elementwise_impl(shlo.RoundNearestEvenOp, in_double(np.rint))
    run_rsqrt = elementwise_impl(shlo.RsqrtOp, in_double(lambda x: 1.0 / np.sqrt(x)))
    run_sign = elementwise_impl(shlo.SignOp, _sign)
    run_sine = elementwise_impl(shlo.SineOp, in_double(np.sin))
    run_sqrt = elementwise_impl(shlo.SqrtOp, in_double(np.sqrt))
    run_tan = elementwise_impl(shlo.TanOp, in_double(np.tan))
    run_tanh = elementwise_impl(shlo.TanhOp, in_double(np.tanh))

    run_add = elementwise_impl(shlo.AddOp, _add)
    run_and = elementwise_impl(shlo.AndOp, np.bitwise_and)
    run_atan2 = elementwise_impl(shlo.Atan2Op, _atan2)
    run_complex = elementwise_impl(shlo.ComplexOp, _complex)
    run_divide = elementwise_impl(shlo.DivideOp, _divide)
    run_maximum = elementwise_impl(shlo.MaximumOp, _maximum)
    run_minimum = elementwise_impl(shlo.MinimumOp, _minimum)
    run_multiply = elementwise_impl(shlo.MultiplyOp, _multiply)
    run_or = elementwise_impl(shlo.OrOp, np.bitwise_or)
    run_power = elementwise_impl(shlo.PowerOp, _power)
    run_remainder = elementwise_impl(shlo.RemainderOp, _remainder)
    run_shift_left = elementwise_impl(shlo.ShiftLeftOp, _shift_left)
    run_shift_right_arithmetic = elementwise_impl(
        shlo.ShiftRightArithmeticOp, _shift_right_arithmetic
    )
    run_shift_right_logical = elementwise_impl(shlo.ShiftRightLogicalOp, _shift_right_logical)
    run_subtract = elementwise_impl(shlo.SubtractOp, _subtract)
    run_xor = elementwise_impl(shlo.XorOp, np.bitwise_xor)

    run_select = elementwise_impl(shlo.SelectOp, _select)
    run_clamp = elementwise_impl(shlo.ClampOp, _clamp)

    @impl(shlo.ConvertOp)
    def run_convert(
        self, interp: Interpreter, op: shlo.ConvertOp, args: PythonValues
    ) -> PythonValues:
        ty = op.result.type
        with np.errstate(all="ignore"):
            return (elementwise_result(convert(np.asarray(args[0]), element_dtype(ty)), ty),)

    @impl(CompareOp)
    def run_compare(self, interp: Interpreter, op: CompareOp, args: PythonValues) -> PythonValues:
        direction = op.comparison_direction.data
        compare_type = op.compare_type.data if op.compare_type is not None else None
        return (elementwise_result(compare(*args, direction, compare_type), op.result.type),)

    @impl(shlo.ReducePrecisionOp)
    def run_reduce_precision(
        self, interp: Interpreter, op: shlo.ReducePrecisionOp, args: PythonValues
    ) -> PythonValues:
        exponent, mantissa = op.exponent_bits.value.data, op.mantissa_bits.value.data
        with np.errstate(all="ignore"):
            value = reduce_precision(np.asarray(args[0]), exponent, mantissa)
        return (elementwise_result(value, op.result.type),)

    @impl(shlo.BitcastConvertOp)
    def run_bitcast_convert(
        self, interp: Interpreter, op: shlo.BitcastConvertOp, args: PythonValues
    ) -> PythonValues:
        """Reinterpret the bytes; a narrower result splits each element along a new last axis."""
        ty = op.result.type
        flat = np.ascontiguousarray(args[0]).reshape(-1)
        return (typed(flat.view(element_dtype(ty)).reshape(ty.get_shape()), ty),)

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
            (result[index],) = run_region(interp, region, _scalars(inputs, index), "stablehlo.map")
        return (typed(result, ty),)

    # ----- data movement

    @impl(shlo.BroadcastInDimOp)
    def run_broadcast_in_dim(
        self, interp: Interpreter, op: shlo.BroadcastInDimOp, args: PythonValues
    ) -> PythonValues:
        ty = op.result.type
        dims = _array(op.broadcast_dimensions)
        return (typed(broadcast_in_dim(np.asarray(args[0]), dims, ty.get_shape()), ty),)

    @impl(shlo.DynamicBroadcastInDimOp)
    def run_dynamic_broadcast_in_dim(
        self, interp: Interpreter, op: shlo.DynamicBroadcastInDimOp, args: PythonValues
    ) -> PythonValues:
        shape = [int(d) for d in np.asarray(args[1])]
        dims = _array(op.broadcast_dimensions)
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
        x, starts = np.asarray(args[0]), [int(np.asarray(s)) for s in args[1:]]
        window = []
        for start, dim, size in zip(starts, x.shape, _array(op.slice_sizes), strict=True):
            first = min(max(start, 0), dim - size)
            window.append(slice(first, first + size))
        return (typed(x[tuple(window)], op.result.type),)

    @impl(shlo.GatherOp)
    def run_gather(
        self, interp: Interpreter, op: shlo.GatherOp, args: PythonValues
    ) -> PythonValues:
        ty = op.result.type
        value = gather(
            np.asarray(args[0]),
            np.asarray(args[1]),
            op.dimension_numbers,
            _array(op.slice_sizes),
            ty.get_shape(),
        )
        return (typed(value, ty),)

    @impl(PadOp)
    def run_pad(self, interp: Interpreter, op: PadOp, args: PythonValues) -> PythonValues:
        value = pad(
            np.asarray(args[0]),
            np.asarray(args[1]),
            _array(op.edge_padding_low),
            _array(op.edge_padding_high),
            _array(op.interior_padding),
        )
        return (typed(value, op.result.type),)

    @impl(shlo.ReshapeOp)
    def run_reshape(
        self, interp: Interpreter, op: shlo.ReshapeOp, args: PythonValues
    ) -> PythonValues:
        ty = op.result.type
        return (typed(np.reshape(args[0], ty.get_shape()), ty),)

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

    @impl(shlo.SliceOp)
    def run_slice(self, interp: Interpreter, op: shlo.SliceOp, args: PythonValues) -> PythonValues:
        window = tuple(
            slice(start, limit, stride)
            for start, limit, stride in zip(
                _array(op.start_indices), _array(op.limit_indices), _array(op.strides), strict=True
            )
        )
        return (typed(np.asarray(args[0])[window], op.result.type),)

    @impl(shlo.TransposeOp)
    def run_transpose(
        self, interp: Interpreter, op: shlo.TransposeOp, args: PythonValues
    ) -> PythonValues:
        return (typed(np.transpose(args[0], _array(op.permutation)), op.result.type),)

    # ----- reductions

    @impl(shlo.DotGeneralOp)
    def run_dot_general(
        self, interp: Interpreter, op: shlo.DotGeneralOp, args: PythonValues
    ) -> PythonValues:
        dn = op.dot_dimension_numbers
        batching = (_ints(dn.lhs_batching_dimensions), _ints(dn.rhs_batching_dimensions))
        contracting = (_ints(dn.lhs_contracting_dimensions), _ints(dn.rhs_contracting_dimensions))
        with np.errstate(all="ignore"):
            value = dot_general(np.asarray(args[0]), np.asarray(args[1]), batching, contracting)
            ty = op.results[0].type
            if element_dtype(ty) == np.bool_:
                value = value != 0
            return (typed(value, ty),)

    @impl(ReduceOp)
    def run_reduce(
        self, interp: Interpreter, op: ReduceOp, args: PythonValues
    ) -> PythonValues:
        n = len(op.inputs)
        arrays = [np.asarray(a) for a in args]
        with np.errstate(all="ignore"):
            values = reduce(interp, op.body, arrays[:n], arrays[n:], _array(op.dimensions))
            return tuple(typed(v, r.type) for v, r in zip(values, op.results, strict=True))

    # ----- constants

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

    # ----- control flow

    @impl_terminator(shlo.ReturnOp)
    def run_return(
        self, interp: Interpreter, op: shlo.ReturnOp, args: PythonValues
    ) -> tuple[TerminatorValue, PythonValues]:
        return ReturnedValues(args), ()

    @impl(shlo.IfOp)
    def run_if(self, interp: Interpreter, op: shlo.IfOp, args: PythonValues) -> PythonValues:
        branch = op.true_branch if bool(np.asarray(args[0])) else op.false_branch
        return run_region(interp, branch, (), "stablehlo.if")

    @impl(shlo.CaseOp)
    def run_case(self, interp: Interpreter, op: shlo.CaseOp, args: PythonValues) -> PythonValues:
        """An index outside [0, number of branches) runs the last branch."""
        index = int(np.asarray(args[0]))
        branches = list(op.branches)
        branch = branches[index] if 0 <= index < len(branches) else branches[-1]
        return run_region(interp, branch, (), "stablehlo.case")

    @impl(shlo.WhileOp)
    def run_while(self, interp: Interpreter, op: shlo.WhileOp, args: PythonValues) -> PythonValues:
        values = tuple(args)
        while bool(np.asarray(run_region(interp, op.cond, values, "stablehlo.while cond")[0])):
            values = run_region(interp, op.body, values, "stablehlo.while body")
        return values

    @impl(shlo.OptimizationBarrierOp)
    def run_optimization_barrier(
        self, interp: Interpreter, op: shlo.OptimizationBarrierOp, args: PythonValues
    ) -> PythonValues:
        return tuple(args)

    @impl(shlo.AfterAllOp)
    def run_after_all(
        self, interp: Interpreter, op: shlo.AfterAllOp, args: PythonValues
    ) -> PythonValues:
        return (Token(),)

    @impl(shlo.CustomCallOp)
    def run_custom_call(
        self, interp: Interpreter, op: shlo.CustomCallOp, args: PythonValues
    ) -> PythonValues:
        target = op.call_target_name.data
        raise InterpretationError(
            f"stablehlo.custom_call @{target}: the interpreter has no semantics for this target"
        )
