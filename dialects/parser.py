"""xDSL's MLIR parser with MLIR's reading of hex float literals.

MLIR prints a float that has no exact decimal form (NaN, ±inf) as its bit
pattern: `dense<0xFF800000> : tensor<f32>` is -inf, the initial value of every
max-reduction JAX emits (softmax, log-softmax). xDSL 0.73 prints the same hex
form but parses it back as the *integer* 4286578688.0, a silent wrong value.
`PartirParser` reads a hex literal inside a float `dense<...>` as the bits of
that float, as MLIR does. Every text partir parses goes through it.

It also reads a string literal with escaped non-ASCII bytes (`"\\C3\\A9"`,
as every printer writes `"é"`) as the string it is: xDSL lexes it as a bytes
literal, so `parse_str_literal` would refuse it and a `StringAttr` would come
back as a `BytesAttr`. MLIR strings are bytes; partir's names are UTF-8.

And it checks a dense literal's type against a constraint built once: xDSL
0.73 rebuilds that IRDL constraint from its generic type for every literal
(about 5 ms each, most of the time spent parsing a program's constants).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    AnyFloat,
    ComplexType,
    IndexType,
    IntegerType,
    RankedStructure,
)
from xdsl.irdl import base
from xdsl.parser import Parser
from xdsl.utils.mlir_lexer import MLIRTokenKind, StringLiteral

_DENSE_LITERAL_TYPE = base(
    RankedStructure[IntegerType | IndexType | AnyFloat | ComplexType]  # type: ignore[misc]
)
"""What xDSL's `_parse_dense_literal_type` accepts, built once."""


@dataclass
class _BitPatternElement(Parser._TensorLiteralElement):
    """A tensor literal element written in hex: for a float type, its bits."""

    def to_type(self, parser, type):
        if isinstance(type, AnyFloat) and isinstance(self.value, int):
            raw = self.value.to_bytes(type.compile_time_size, "little")
            return float(next(iter(type.iter_unpack(raw))))
        return super().to_type(parser, type)


class PartirParser(Parser):
    """`xdsl.parser.Parser`, reading hex float literals in dense attributes as
    bits and escaped UTF-8 string literals as strings."""

    def parse_optional_str_literal(self) -> str | None:
        text = super().parse_optional_str_literal()
        if text is not None or self._current_token.kind != MLIRTokenKind.BYTES_LIT:
            return text
        span = self._current_token.span
        try:
            decoded = StringLiteral.from_span(span).bytes_contents.decode("utf-8")
        except UnicodeDecodeError:
            return None
        self._consume_token(MLIRTokenKind.BYTES_LIT)
        return decoded

    def _parse_dense_literal_type(
        self,
    ) -> RankedStructure[IntegerType | IndexType | AnyFloat | ComplexType]:
        # xDSL's own checks, with the constraint built once (`_DENSE_LITERAL_TYPE`).
        type = self.expect(self.parse_optional_type, "Dense attribute must be typed!")
        if not _DENSE_LITERAL_TYPE.verifies(type):
            self.raise_error(
                "Expected memref, vector or tensor type of integer, index, float, or "
                "complex type"
            )
        if any(dim == DYNAMIC_INDEX for dim in type.get_shape()):
            self.raise_error("Dense literal attribute should have a static shape.")
        return type

    def _parse_tensor_literal_element(self) -> Parser._TensorLiteralElement:
        text = self._current_token.text
        element = super()._parse_tensor_literal_element()
        if text[:2] in ("0x", "0X") and isinstance(element.value, int):
            return _BitPatternElement(False, element.value, element.span)
        return element
