"""Emitters for elementwise ops: one `lax` (or `jnp`) call per op.

The unary, binary and CHLO ops map by name to a function of the same
operands; comparisons, selects, clamps, roundings and conversions add their
attributes as arguments. Each emitter returns the expression for the op's
results (see `lowering.jax_body.Emitter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import Operation
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.dialects.stablehlo.attributes import (
    ComparisonDirection,
    ComparisonType,
    ComparisonTypeAttr,
    ResultAccuracyMode,
)

from dialects import stablehlo_ext as ext
from dialects.dtypes import element_kind
from lowering.jax_ir import by_name, element_dtype, int_value, unsupported

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter, Emitter

UNARY: dict[str, str] = by_name(
    {
        shlo.AbsOp: "lax.abs",
        shlo.CbrtOp: "lax.cbrt",
        shlo.CeilOp: "lax.ceil",
        shlo.CosineOp: "lax.cos",
        shlo.CountLeadingZerosOp: "lax.clz",
        shlo.ExponentialMinusOneOp: "lax.expm1",
        shlo.ExponentialOp: "lax.exp",
        shlo.FloorOp: "lax.floor",
        shlo.ImagOp: "lax.imag",
        shlo.IsFiniteOp: "lax.is_finite",
        shlo.LogisticOp: "lax.logistic",
        shlo.LogOp: "lax.log",
        shlo.LogPlusOneOp: "lax.log1p",
        shlo.NegateOp: "lax.neg",
        shlo.NotOp: "lax.bitwise_not",
        shlo.PopcntOp: "lax.population_count",
        shlo.RealOp: "lax.real",
        shlo.RsqrtOp: "lax.rsqrt",
        shlo.SineOp: "lax.sin",
        shlo.SignOp: "lax.sign",
        shlo.SqrtOp: "lax.sqrt",
        shlo.TanOp: "lax.tan",
        shlo.TanhOp: "lax.tanh",
    }
)

BINARY: dict[str, str] = by_name(
    {
        shlo.AddOp: "lax.add",
        shlo.AndOp: "lax.bitwise_and",
        shlo.Atan2Op: "lax.atan2",
        shlo.ComplexOp: "lax.complex",
        shlo.DivideOp: "lax.div",
        shlo.MaximumOp: "lax.max",
        shlo.MinimumOp: "lax.min",
        shlo.MultiplyOp: "lax.mul",
        shlo.OrOp: "lax.bitwise_or",
        shlo.PowerOp: "lax.pow",
        shlo.RemainderOp: "lax.rem",
        shlo.ShiftLeftOp: "lax.shift_left",
        shlo.ShiftRightArithmeticOp: "lax.shift_right_arithmetic",
        shlo.ShiftRightLogicalOp: "lax.shift_right_logical",
        shlo.SubtractOp: "lax.sub",
        shlo.XorOp: "lax.bitwise_xor",
    }
)

ON_BOOLEANS: dict[str, str] = by_name(
    {
        shlo.AddOp: "lax.bitwise_or",  # StableHLO: i1 add is logical or, mul is and;
        shlo.MultiplyOp: "lax.bitwise_and",  # lax.add/mul reject booleans.
    }
)

CHLO: dict[str, str] = {  # `chlo.<name>` (see dialects.chlo)
    "acos": "lax.acos",
    "acosh": "lax.acosh",
    "asin": "lax.asin",
    "asinh": "lax.asinh",
    "atan": "lax.atan",
    "atanh": "lax.atanh",
    "bessel_i1e": "lax.bessel_i1e",
    "conj": "jnp.conj",  # lax.conj turns real operands complex; chlo.conj keeps the type.
    "cosh": "lax.cosh",
    "digamma": "lax.digamma",
    "erf": "lax.erf",
    "erf_inv": "lax.erf_inv",
    "erfc": "lax.erfc",
    "is_inf": "jnp.isinf",
    "is_neg_inf": "jnp.isneginf",
    "is_pos_inf": "jnp.isposinf",
    "lgamma": "lax.lgamma",
    "sinh": "lax.sinh",
    "square": "lax.square",
    "tan": "lax.tan",
    "next_after": "lax.nextafter",
    "polygamma": "lax.polygamma",
    "zeta": "lax.zeta",
}


def function_of(op: Operation) -> str:
    """The `lax` function computing elementwise op `op` on its operand types."""
    if op.name in ON_BOOLEANS and element_dtype(op, op.operands[0].type) == np.bool_:
        return ON_BOOLEANS[op.name]
    if op.name in UNARY:
        return UNARY[op.name]
    if op.name in BINARY:
        return BINARY[op.name]
    return CHLO[op.name.removeprefix("chlo.")]


def _check_accuracy(op: Operation) -> None:
    accuracy = op.properties.get("result_accuracy")
    if accuracy is not None and getattr(accuracy, "data", None) != ResultAccuracyMode.DEFAULT:
        raise unsupported(op, "only the default result accuracy is supported")


def emit_elementwise(em: BodyEmitter, op: Operation) -> str:
    _check_accuracy(op)
    return f"{function_of(op)}({em.args(op)})"


def emit_round(method: str) -> Emitter:
    def emit(em: BodyEmitter, op: Operation) -> str:
        return f"lax.round({em.args(op)}, lax.RoundingMethod.{method})"

    return emit


_DIRECTIONS: dict[ComparisonDirection, str] = {
    ComparisonDirection.EQ: "lax.eq",
    ComparisonDirection.NE: "lax.ne",
    ComparisonDirection.LT: "lax.lt",
    ComparisonDirection.LE: "lax.le",
    ComparisonDirection.GT: "lax.gt",
    ComparisonDirection.GE: "lax.ge",
}

_NATURAL_COMPARISON: dict[str, ComparisonType] = {
    "f": ComparisonType.FLOAT,
    "c": ComparisonType.FLOAT,
    "i": ComparisonType.SIGNED,
    "u": ComparisonType.UNSIGNED,
    "b": ComparisonType.UNSIGNED,
}


def emit_compare(em: BodyEmitter, op: ext.CompareOp) -> str:
    """`lax.lt(a, b)`; only when the comparison type is the operands' natural one
    (lax has no TOTALORDER or sign-reinterpreting comparisons)."""
    attr = op.properties.get("compare_type") or op.properties.get("comparison_type")
    assert attr is None or isinstance(attr, ComparisonTypeAttr)  # both spellings hold one
    kind = element_kind(element_dtype(op, op.operands[0].type))
    if attr is not None and attr.data != _NATURAL_COMPARISON[kind]:
        raise unsupported(op, f"{attr.data} comparison of {op.operands[0].type}")
    return f"{_DIRECTIONS[op.comparison_direction.data]}({em.args(op)})"


def emit_select(em: BodyEmitter, op: Operation) -> str:
    return f"lax.select({em.args(op)})"


def emit_clamp(em: BodyEmitter, op: Operation) -> str:
    return f"lax.clamp({em.args(op)})"


def emit_convert(em: BodyEmitter, op: Operation) -> str:
    return f"lax.convert_element_type({em.args(op)}, {em.dtype(op, op.results[0].type)})"


def emit_bitcast_convert(em: BodyEmitter, op: Operation) -> str:
    return f"lax.bitcast_convert_type({em.args(op)}, {em.dtype(op, op.results[0].type)})"


def emit_reduce_precision(em: BodyEmitter, op: shlo.ReducePrecisionOp) -> str:
    exponent, mantissa = int_value(op.exponent_bits), int_value(op.mantissa_bits)
    return (
        f"lax.reduce_precision({em.args(op)}, exponent_bits={exponent}, mantissa_bits={mantissa})"
    )
