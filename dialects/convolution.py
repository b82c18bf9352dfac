"""`stablehlo.convolution` and its `#stablehlo.conv<...>` dimension numbers.

xdsl-jax 0.6 has neither. JAX emits the op for every `lax.conv_general_dilated`
(`flax.linen.Conv`, a ViT's patch embedding) and for both of its gradients;
the dimension numbers come in MLIR's compact form, which names each
dimension's role in order: `[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]` is
NHWC x HWIO -> NHWC (`b` batch, `f` feature, `i`/`o` the kernel's input and
output features, a number the index of a spatial dimension).

`ConvolutionOp` reads every optional window field with its spec default, so
the registry, the interpreter and the emitter see one complete description.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from xdsl.dialects.builtin import (
    AnyTensorType,
    ArrayAttr,
    DenseArrayBase,
    DenseIntElementsAttr,
    IntAttr,
    IntegerAttr,
    TensorType,
    i1,
    i64,
)
from xdsl.ir import Attribute, ParametrizedAttribute
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import NoMemoryEffect
from xdsl.utils.exceptions import VerifyException


@dataclass(frozen=True)
class Layout:
    """One operand's dims by role: the two named ones and the spatial ones in order."""

    major: int  # batch (lhs, result) or input feature (kernel)
    minor: int  # feature (lhs, result) or output feature (kernel)
    spatial: tuple[int, ...]

    @property
    def rank(self) -> int:
        return 2 + len(self.spatial)


_ROLES = (("b", "f"), ("i", "o"), ("b", "f"))  # lhs, kernel, result


def _ints(values: Sequence[int]) -> ArrayAttr[IntAttr]:
    return ArrayAttr(IntAttr(v) for v in values)


@irdl_attr_definition
class ConvDimensionNumbers(ParametrizedAttribute):
    """Which dim of the input, kernel and output is batch, feature and spatial."""

    name = "stablehlo.conv"

    input_batch_dimension: IntAttr
    input_feature_dimension: IntAttr
    input_spatial_dimensions: ArrayAttr[IntAttr]
    kernel_input_feature_dimension: IntAttr
    kernel_output_feature_dimension: IntAttr
    kernel_spatial_dimensions: ArrayAttr[IntAttr]
    output_batch_dimension: IntAttr
    output_feature_dimension: IntAttr
    output_spatial_dimensions: ArrayAttr[IntAttr]

    @staticmethod
    def of(lhs: Layout, kernel: Layout, out: Layout) -> ConvDimensionNumbers:
        return ConvDimensionNumbers(
            IntAttr(lhs.major), IntAttr(lhs.minor), _ints(lhs.spatial),
            IntAttr(kernel.major), IntAttr(kernel.minor), _ints(kernel.spatial),
            IntAttr(out.major), IntAttr(out.minor), _ints(out.spatial),
        )  # fmt: skip

    def layouts(self) -> tuple[Layout, Layout, Layout]:
        """The input's, kernel's and output's layouts."""
        return (
            _layout_of(
                self.input_batch_dimension,
                self.input_feature_dimension,
                self.input_spatial_dimensions,
            ),
            _layout_of(
                self.kernel_input_feature_dimension,
                self.kernel_output_feature_dimension,
                self.kernel_spatial_dimensions,
            ),
            _layout_of(
                self.output_batch_dimension,
                self.output_feature_dimension,
                self.output_spatial_dimensions,
            ),
        )

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        """The compact form `[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]`."""
        with parser.in_angle_brackets():
            return cls.parse_compact(parser).parameters

    @staticmethod
    def parse_compact(parser: AttrParser) -> ConvDimensionNumbers:
        """`[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]`, without the brackets
        (the op's pretty syntax writes it so after `dim_numbers =`)."""
        layouts: list[Layout] = []
        for k, (major, minor) in enumerate(_ROLES):
            if k == 1:
                parser.parse_keyword("x")
            elif k == 2:
                parser.parse_punctuation("->")
            start = parser.pos
            roles = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: _parse_role(parser)
            )
            layouts.append(_layout(roles, major, minor, parser, start))
        if len({len(layout.spatial) for layout in layouts}) != 1:
            parser.raise_error("#stablehlo.conv: the three layouts need the same spatial dims")
        return ConvDimensionNumbers.of(*layouts)

    def print_parameters(self, printer: Printer) -> None:
        texts = []
        for layout, (major, minor) in zip(self.layouts(), _ROLES, strict=True):
            roles = [""] * layout.rank
            roles[layout.major], roles[layout.minor] = major, minor
            for k, d in enumerate(layout.spatial):
                roles[d] = str(k)
            texts.append("[" + ", ".join(roles) + "]")
        printer.print_string(f"<{texts[0]}x{texts[1]}->{texts[2]}>")


def _layout_of(major: IntAttr, minor: IntAttr, spatial: ArrayAttr[IntAttr]) -> Layout:
    return Layout(major.data, minor.data, tuple(a.data for a in spatial.data))


def _parse_role(parser: AttrParser) -> str | int:
    number = parser.parse_optional_integer(allow_boolean=False, allow_negative=False)
    return number if number is not None else parser.parse_identifier()


def _layout(
    roles: list[str | int], major: str, minor: str, parser: AttrParser, start: int
) -> Layout:
    spatial = sorted((r, d) for d, r in enumerate(roles) if isinstance(r, int))
    names = [r for r in roles if isinstance(r, str)]
    if sorted(names) != sorted((major, minor)) or [r for r, _ in spatial] != list(
        range(len(spatial))
    ):
        parser.raise_error(
            f"#stablehlo.conv: a layout names {major!r}, {minor!r} once each and "
            f"numbers its spatial dims 0..n-1; got {roles}",
            start,
            parser.pos,
        )
    return Layout(roles.index(major), roles.index(minor), tuple(d for _, d in spatial))


_WINDOW_FIELDS = {
    "stride": "window_strides",
    "lhs_dilate": "lhs_dilation",
    "rhs_dilate": "rhs_dilation",
    "reverse": "window_reversal",
    "pad": "padding",
}
"""The pretty syntax's `window = {...}` keys -> the op's properties."""


def _parse_window(parser: Parser) -> dict[str, Attribute]:
    """`{stride = [1, 1], pad = [[1, 1], [1, 1]], reverse = [false, false], ...}`."""
    found: dict[str, Attribute] = {}

    def entry() -> None:
        pos = parser.pos
        key = parser.parse_identifier()
        if key not in _WINDOW_FIELDS:
            parser.raise_error(f"stablehlo.convolution: unknown window field {key!r}", pos)
        parser.parse_punctuation("=")
        if key == "pad":
            pairs = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE,
                lambda: parser.parse_comma_separated_list(
                    parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_boolean=False)
                ),
            )
            flat = [v for pair in pairs for v in pair]
            found["padding"] = DenseIntElementsAttr.from_list(
                TensorType(i64, [len(pairs), 2]), flat
            )
            return
        values = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_boolean=True)
        )
        element = i1 if key == "reverse" else i64
        found[_WINDOW_FIELDS[key]] = DenseArrayBase.from_list(element, values)

    parser.parse_comma_separated_list(parser.Delimiter.BRACES, entry)
    return found


@irdl_op_definition
class ConvolutionOp(IRDLOperation):
    """`stablehlo.convolution`: printed in generic syntax (as JAX's bridge
    gives it); parsed in that and in MLIR's pretty syntax
    (`jax.jit(f).lower().as_text()`)."""

    name = "stablehlo.convolution"

    lhs = operand_def(AnyTensorType)
    rhs = operand_def(AnyTensorType)
    result = result_def(AnyTensorType)
    dimension_numbers = prop_def(ConvDimensionNumbers)
    feature_group_count = prop_def(IntegerAttr)
    batch_group_count = prop_def(IntegerAttr)
    window_strides = opt_prop_def(DenseArrayBase.constr(i64))
    padding = opt_prop_def(DenseIntElementsAttr)
    lhs_dilation = opt_prop_def(DenseArrayBase.constr(i64))
    rhs_dilation = opt_prop_def(DenseArrayBase.constr(i64))
    window_reversal = opt_prop_def(DenseArrayBase.constr(i1))
    precision_config = opt_prop_def(ArrayAttr)

    traits = traits_def(NoMemoryEffect())

    @property
    def layouts(self) -> tuple[Layout, Layout, Layout]:
        return self.dimension_numbers.layouts()

    @classmethod
    def parse(cls, parser: Parser) -> ConvolutionOp:
        """`(%lhs, %rhs) dim_numbers = [b, 0, 1, f]x[...]->[...], window = {...}
        {feature_group_count = 1 : i64, ...} : (T, K) -> R`."""
        operands = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, parser.parse_unresolved_operand
        )
        parser.parse_keyword("dim_numbers")
        parser.parse_punctuation("=")
        properties: dict[str, Attribute] = {
            "dimension_numbers": ConvDimensionNumbers.parse_compact(parser)
        }
        if parser.parse_optional_punctuation(",") is not None:
            parser.parse_keyword("window")
            parser.parse_punctuation("=")
            properties.update(_parse_window(parser))
        attributes = parser.parse_optional_attr_dict()
        for name in list(attributes):
            if name in cls.get_irdl_definition().properties:
                properties[name] = attributes.pop(name)
        parser.parse_punctuation(":")
        pos = parser.pos
        func_type = parser.parse_function_type()
        resolved = parser.resolve_operands(operands, func_type.inputs.data, pos)
        return cls.create(
            operands=resolved,
            result_types=list(func_type.outputs.data),
            properties=properties,
            attributes=attributes,
        )

    @property
    def feature_groups(self) -> int:
        return int(self.feature_group_count.value.data)

    @property
    def batch_groups(self) -> int:
        return int(self.batch_group_count.value.data)

    def _per_spatial(self, name: str, default: int) -> tuple[int, ...]:
        attr = self.properties.get(name)
        if attr is None:
            return (default,) * len(self.layouts[0].spatial)
        assert isinstance(attr, DenseArrayBase)
        return tuple(int(v) for v in attr.get_values())

    @property
    def strides(self) -> tuple[int, ...]:
        return self._per_spatial("window_strides", 1)

    @property
    def lhs_dilations(self) -> tuple[int, ...]:
        return self._per_spatial("lhs_dilation", 1)

    @property
    def rhs_dilations(self) -> tuple[int, ...]:
        return self._per_spatial("rhs_dilation", 1)

    @property
    def reversed_window(self) -> tuple[bool, ...]:
        return tuple(bool(v) for v in self._per_spatial("window_reversal", 0))

    @property
    def pads(self) -> tuple[tuple[int, int], ...]:
        """(low, high) padding per spatial dim (negative crops)."""
        n = len(self.layouts[0].spatial)
        if self.padding is None:
            return ((0, 0),) * n
        flat = [int(v) for v in self.padding.get_values()]
        if len(flat) == 1:  # a splat
            flat = flat * (2 * n)
        return tuple((flat[2 * d], flat[2 * d + 1]) for d in range(len(flat) // 2))

    def output_spatial_sizes(self) -> tuple[int, ...]:
        """Each output spatial size the spec derives from the window."""
        lhs, kernel, _ = self.layouts
        src = cast(TensorType, self.lhs.type).get_shape()
        win = cast(TensorType, self.rhs.type).get_shape()
        sizes = []
        for k, (d, kd) in enumerate(zip(lhs.spatial, kernel.spatial, strict=True)):
            lo, hi = self.pads[k]
            dilated = (src[d] - 1) * self.lhs_dilations[k] + 1 if src[d] else 0
            extent = (win[kd] - 1) * self.rhs_dilations[k] + 1 if win[kd] else 0
            padded = dilated + lo + hi
            sizes.append(0 if padded < extent else (padded - extent) // self.strides[k] + 1)
        return tuple(sizes)

    def verify_(self) -> None:
        lhs, kernel, out = self.layouts
        values = (self.lhs, self.rhs, self.result)
        shapes = [cast(TensorType, v.type).get_shape() for v in values]
        roles = ((lhs, "lhs"), (kernel, "rhs"), (out, "result"))
        for (layout, what), s in zip(roles, shapes, strict=True):
            dims = sorted((layout.major, layout.minor, *layout.spatial))
            if dims != list(range(len(s))):
                raise VerifyException(
                    f"{self.name}: the dimension numbers do not describe the {what}'s "
                    f"{len(s)} dims"
                )
        n = len(lhs.spatial)
        fields = {
            "window_strides": self.strides, "lhs_dilation": self.lhs_dilations,
            "rhs_dilation": self.rhs_dilations,
        }
        for name, sizes in fields.items():
            if len(sizes) != n or any(v < 1 for v in sizes):
                raise VerifyException(
                    f"{self.name}: {name} {list(sizes)} needs {n} positive values"
                )
        if len(self.pads) != n or len(self.reversed_window) != n:
            raise VerifyException(f"{self.name}: padding and window_reversal need {n} entries")
        groups, batch_groups = self.feature_groups, self.batch_groups
        s_lhs, s_rhs, s_out = shapes
        if groups < 1 or batch_groups < 1 or (groups > 1 and batch_groups > 1):
            raise VerifyException(
                f"{self.name}: feature_group_count {groups} and batch_group_count "
                f"{batch_groups} must be positive, and one of them 1"
            )
        if s_lhs[lhs.minor] != s_rhs[kernel.major] * groups or s_lhs[lhs.minor] % groups:
            raise VerifyException(
                f"{self.name}: the input's {s_lhs[lhs.minor]} features must be the kernel's "
                f"{s_rhs[kernel.major]} input features times feature_group_count {groups}"
            )
        if s_lhs[lhs.major] % batch_groups or s_rhs[kernel.minor] % (groups * batch_groups):
            raise VerifyException(
                f"{self.name}: the group counts must divide the input's batch and the kernel's "
                "output features"
            )
        want = [0] * len(s_out)
        want[out.major] = s_lhs[lhs.major] // batch_groups
        want[out.minor] = s_rhs[kernel.minor]
        for d, size in zip(out.spatial, self.output_spatial_sizes(), strict=True):
            want[d] = size
        if list(s_out) != want:
            raise VerifyException(
                f"{self.name}: the result must have shape {want}, got {list(s_out)}"
            )
