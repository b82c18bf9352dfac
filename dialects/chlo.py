"""The part of CHLO (XLA's "client HLO") that JAX emits next to StableHLO.

`jax.jit(f).lower(...)` gives StableHLO plus a few CHLO ops: `jnp.square` is
`chlo.square`, exact GELU uses `chlo.erf`/`chlo.erfc`, `jnp.tan` is `chlo.tan`,
and so on. xdsl-jax has no CHLO dialect and jaxlib exposes no pass that expands
CHLO into StableHLO, so partir defines the elementwise ones here, with MLIR's
syntax (`chlo.erf %x : tensor<4xf32> -> tensor<4xf32>`), and `chlo.top_k`
(`lax.top_k`, in generic syntax). Ops not listed still import, as
unregistered ops, and fail later by name.
"""

from __future__ import annotations

from xdsl.dialects.builtin import AnyTensorType, IntegerAttr, TensorType, i64
from xdsl.ir import Dialect
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

# name -> whether the result is a predicate (i1) rather than the operand's type.
UNARY_OPS: dict[str, bool] = {
    "acos": False,
    "acosh": False,
    "asin": False,
    "asinh": False,
    "atan": False,
    "atanh": False,
    "bessel_i1e": False,
    "conj": False,
    "cosh": False,
    "digamma": False,
    "erf": False,
    "erf_inv": False,
    "erfc": False,
    "is_inf": True,
    "is_neg_inf": True,
    "is_pos_inf": True,
    "lgamma": False,
    "sinh": False,
    "square": False,
    "tan": False,
}
BINARY_OPS = ("next_after", "polygamma", "zeta")


class ChloUnaryOp(IRDLOperation):
    """Base of the elementwise unary CHLO ops."""

    operand = operand_def(AnyTensorType)
    result = result_def(AnyTensorType)
    traits = traits_def(Pure())
    assembly_format = "$operand attr-dict `:` type($operand) `->` type($result)"


class ChloBinaryOp(IRDLOperation):
    """Base of the elementwise binary CHLO ops."""

    lhs = operand_def(AnyTensorType)
    rhs = operand_def(AnyTensorType)
    result = result_def(AnyTensorType)
    traits = traits_def(Pure())
    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"


def _class_name(op: str) -> str:
    return "".join(part.capitalize() for part in op.split("_")) + "Op"


def _define(base: type[IRDLOperation], op: str) -> type[IRDLOperation]:
    cls = type(_class_name(op), (base,), {"name": f"chlo.{op}", "__doc__": f"`chlo.{op}`."})
    return irdl_op_definition(cls)


UNARY_CLASSES = {op: _define(ChloUnaryOp, op) for op in UNARY_OPS}
BINARY_CLASSES = {op: _define(ChloBinaryOp, op) for op in BINARY_OPS}


@irdl_op_definition
class TopKOp(IRDLOperation):
    """`chlo.top_k`: the `k` largest elements along the last dim, largest
    first, and their indices (`lax.top_k`; ties keep index order)."""

    name = "chlo.top_k"

    operand = operand_def(AnyTensorType)
    k = prop_def(IntegerAttr)
    values = result_def(AnyTensorType)
    indices = result_def(AnyTensorType)
    traits = traits_def(Pure())

    @property
    def count(self) -> int:
        return int(self.k.value.data)

    @classmethod
    def parse(cls, parser: Parser) -> TopKOp:
        """MLIR's pretty syntax, as `jax.jit(f).lower().as_text()` prints it:
        `chlo.top_k(%x, k = 2) : T -> (V, I)` (printed back generic)."""
        parser.parse_punctuation("(")
        operand = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        parser.parse_keyword("k")
        parser.parse_punctuation("=")
        k = parser.parse_integer(allow_boolean=False, allow_negative=False)
        parser.parse_punctuation(")")
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        pos = parser.pos
        operand_type = parser.parse_type()
        parser.parse_punctuation("->")
        results = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_type)
        if len(results) != 2:
            parser.raise_error("chlo.top_k gives (values, indices)", pos, parser.pos)
        return cls.create(
            operands=[parser.resolve_operand(operand, operand_type)],
            result_types=results,
            properties={"k": IntegerAttr(k, i64)},
            attributes=attributes,
        )

    def verify_(self) -> None:
        src = self.operand.type
        assert isinstance(src, TensorType)
        shape = src.get_shape()
        if not shape or not 0 <= self.count <= shape[-1]:
            raise VerifyException(f"{self.name}: k = {self.count} must fit the last dim of {src}")


CHLO = Dialect("chlo", [*UNARY_CLASSES.values(), *BINARY_CLASSES.values(), TopKOp], [])
