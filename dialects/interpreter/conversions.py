"""Elementwise StableHLO ops that need more than their operands.

convert, bitcast_convert and reduce_precision depend on the result type or on
attributes, compare on its direction and comparison type. See
`dialects.interpreter.stablehlo` for the conventions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.dialects.stablehlo.attributes import ComparisonDirection, ComparisonType

from dialects.dtypes import element_kind
from dialects.interpreter.common import (
    element_dtype,
    elementwise_result,
    int_dtype,
    typed,
    widen,
)
from dialects.stablehlo_ext import CompareOp

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
        bits = int_dtype(lhs.dtype, signed=compare_type == ComparisonType.SIGNED)
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
    signed = int_dtype(x.dtype, signed=True)
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
    v = x.view(int_dtype(x.dtype, signed=False)).astype(np.uint64)
    if mantissa_bits < src_mantissa:
        shift = np.uint64(src_mantissa - mantissa_bits)
        last_bit = np.uint64(1) << shift
        bias = (last_bit >> np.uint64(1)) - np.uint64(1) + ((v & last_bit) >> shift)
        v = (v + bias) & ~(last_bit - np.uint64(1))
    if exponent_bits < src_exponent:
        sign = v & np.uint64(1 << (width - 1))
        exponent_mask = np.uint64(((1 << src_exponent) - 1) << src_mantissa)
        src_bias, reduced_bias = (1 << (src_exponent - 1)) - 1, (1 << (exponent_bits - 1)) - 1
        exponent = v & exponent_mask
        overflow = exponent > np.uint64((src_bias + reduced_bias) << src_mantissa)
        underflow = exponent <= np.uint64((src_bias - reduced_bias) << src_mantissa)
        v = np.where(overflow, sign | exponent_mask, np.where(underflow, sign, v))
    v = (v & np.uint64((1 << width) - 1)).astype(int_dtype(x.dtype, signed=False))
    result = v.view(x.dtype)
    nan_result = x if mantissa_bits > 0 else np.full_like(x, np.inf)
    return np.where(np.isnan(widen(x)), nan_result, result)


# --------------------------------------------------------------------------
# The interpreter functions


@register_impls
class ConversionFunctions(InterpreterFunctions):
    """convert, bitcast_convert, reduce_precision and compare."""

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
        lhs, rhs = args
        return (elementwise_result(compare(lhs, rhs, direction, compare_type), op.result.type),)

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
