"""StableHLO's elementwise arithmetic, logical and bitwise ops; select and clamp.

Each op is a NumPy function of its operands (floats and complex numbers in
double precision, integers wrapping), applied by `elementwise_impl` and cast
to the result type. See `dialects.interpreter.stablehlo` for the conventions.
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
from xdsl.ir import Operation
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo

from dialects.dtypes import element_kind
from dialects.interpreter.common import elementwise_result, int_dtype, widen

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
    u = x.view(int_dtype(x.dtype, signed=False))
    return sum(((u >> bit) & 1 for bit in range(width)), np.zeros_like(u))


def _count_leading_zeros(x: np.ndarray) -> np.ndarray:
    width = x.dtype.itemsize * 8
    u = x.view(int_dtype(x.dtype, signed=False))
    length = np.zeros(u.shape, dtype=np.int64)
    for bit in range(width):
        length = np.where((u >> bit) != 0, bit + 1, length)
    return width - length


def _is_finite(x: np.ndarray) -> np.ndarray:
    return np.isfinite(widen(x))


# --------------------------------------------------------------------------
# Elementwise binary ops


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.add(widen(a), widen(b))  # i1: logical or


def _subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.subtract(widen(a), widen(b))


def multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
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


def maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
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


def minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
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
    unsigned = int_dtype(exponent.dtype, signed=False)
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
    unsigned = s.view(int_dtype(s.dtype, signed=False))
    in_range = unsigned < x.dtype.itemsize * 8
    return x, np.where(in_range, unsigned, 0).astype(x.dtype), in_range


def _shift_left(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    x, amount, in_range = _shift_amounts(x, s)
    return np.where(in_range, np.left_shift(x, amount), np.zeros_like(x))


def _shift_right_logical(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    x, amount, in_range = _shift_amounts(x, s)
    unsigned = int_dtype(x.dtype, signed=False)
    shifted = np.right_shift(x.view(unsigned), amount.view(unsigned)).view(x.dtype)
    return np.where(in_range, shifted, np.zeros_like(x))


def _shift_right_arithmetic(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    x, amount, in_range = _shift_amounts(x, s)
    signed = int_dtype(x.dtype, signed=True)
    bits = x.view(signed)
    amount = np.where(in_range, amount.view(signed), x.dtype.itemsize * 8 - 1).astype(signed)
    return np.right_shift(bits, amount).view(x.dtype)  # out of range: all sign bits


def _select(pred: np.ndarray, on_true: np.ndarray, on_false: np.ndarray) -> np.ndarray:
    return np.where(pred, on_true, on_false)


def _clamp(low: np.ndarray, x: np.ndarray, high: np.ndarray) -> np.ndarray:
    return minimum(maximum(x, low), high)


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
class ElementwiseFunctions(InterpreterFunctions):
    """The elementwise arithmetic, logical and bitwise ops; select and clamp."""

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

    run_add = elementwise_impl(shlo.AddOp, add)
    run_and = elementwise_impl(shlo.AndOp, np.bitwise_and)
    run_atan2 = elementwise_impl(shlo.Atan2Op, _atan2)
    run_complex = elementwise_impl(shlo.ComplexOp, _complex)
    run_divide = elementwise_impl(shlo.DivideOp, _divide)
    run_maximum = elementwise_impl(shlo.MaximumOp, maximum)
    run_minimum = elementwise_impl(shlo.MinimumOp, minimum)
    run_multiply = elementwise_impl(shlo.MultiplyOp, multiply)
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
