"""StableHLO as xdsl-jax defines it, with the gaps partir met closed.

`xdsl_jax.dialects.stablehlo` is the array dialect; this module only replaces
what JAX emits but xdsl-jax 0.6 cannot represent:

- `stablehlo.compare`: JAX writes the optional comparison type under StableHLO's
  own property name `compare_type` (`#stablehlo<comparison_type FLOAT>`);
  xdsl-jax calls it `comparison_type` and rejects the real name. `CompareOp`
  below is the same op with the property spelled as StableHLO spells it.
- `stablehlo.reduce`: xdsl-jax's pretty syntax prints the reducer's block
  arguments as pairs `(acc0, x0) (acc1, x1)` but parses them back in pair order,
  so a two-input reduce (argmax) silently swaps its body arguments after a
  print/parse round trip; and it prints an attribute dictionary it cannot
  parse. `ReduceOp` parses both as printed.
- `stablehlo.pad`: xdsl-jax types the padding value as `tensor<i32>`, so every
  float pad JAX emits (`jnp.pad`) fails to verify. `PadOp` takes any 0-d tensor
  of the operand's element type, as the spec says.
- `stablehlo.slice`: xdsl-jax does not verify the bounds, so a slice reading
  past its operand (a global bound left on a per-device part) verified, and
  only JAX rejected the emitted program. `SliceOp` checks them, as the spec does.
- `stablehlo.dynamic_update_slice`: missing from xdsl-jax, and in every
  `lax.scan` JAX emits (each step writes its output row). `DynamicUpdateSliceOp`.
- `stablehlo.reverse`: missing from xdsl-jax, and what `x[::-1]`, `jnp.flip` and
  the gradient of a reversed slice lower to. `ReverseOp`.
- `stablehlo.while`: xdsl-jax prints the iteration arguments' names for `do`
  but lets `cond`'s arguments take fresh names that the text never defines, so
  no program with a `lax.scan` or `fori_loop` printed and parsed back
  ("values used but not defined"). `WhileOp` names both regions' arguments
  alike, as the parser reads them.
- `stablehlo.select_and_scatter`: missing from xdsl-jax, and what the gradient
  of max / min pooling lowers to. `SelectAndScatterOp`.
- `stablehlo.rng_bit_generator` and its `#stablehlo<rng_algorithm ...>`:
  missing from xdsl-jax, and what `jax.random` emits for `rbg` / `unsafe_rbg`
  keys. `RngBitGeneratorOp`, `RngAlgorithmAttr`.
- `stablehlo.convolution`: missing, with its dimension-number attribute
  (`dialects.convolution`).
- the collectives (`all_reduce`, `all_gather`, `reduce_scatter`,
  `collective_permute`, `all_to_all`) and `partition_id` that a nested
  `jax.shard_map`'s body holds: missing (`dialects.stablehlo_collectives`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from xdsl.dialects.builtin import (
    AnyTensorType,
    BoolAttr,
    DenseArrayBase,
    DenseIntElementsAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
    i1,
    i64,
)
from xdsl.dialects.utils import EnumAttribute, StrEnum
from xdsl.dialects.utils.format import print_assignment
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    Operation,
    Region,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
)
from xdsl.irdl import (
    IRDLOperation,
    SameVariadicOperandSize,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import NoMemoryEffect
from xdsl.utils.exceptions import VerifyException
from xdsl_jax.dialects import stablehlo as _xj
from xdsl_jax.dialects.stablehlo import reduction_ops as _reduction
from xdsl_jax.dialects.stablehlo.attributes import (
    ComparisonDirection,
    ComparisonDirectionAttr,
    ComparisonType,
    ComparisonTypeAttr,
)
from xdsl_jax.dialects.stablehlo.types import PredTensorType
from xdsl_jax.xdsl_extras.traits import Elementwise, SameOperandsAndResultShape

from dialects.convolution import ConvDimensionNumbers, ConvolutionOp
from dialects.stablehlo_collectives import COLLECTIVE_OPS, ChannelHandleAttr


@irdl_op_definition
class CompareOp(IRDLOperation):
    """`stablehlo.compare` with StableHLO's `compare_type` property."""

    name = "stablehlo.compare"

    assembly_format = (
        "$comparison_direction `,` $lhs `,` $rhs (`,` $compare_type^)? "
        "attr-dict `:` functional-type(operands, results)"
    )

    lhs = operand_def(AnyTensorType)
    rhs = operand_def(AnyTensorType)
    result = result_def(PredTensorType)
    comparison_direction = prop_def(ComparisonDirectionAttr)
    compare_type = opt_prop_def(ComparisonTypeAttr)

    traits = traits_def(NoMemoryEffect(), Elementwise(), SameOperandsAndResultShape())

    def __init__(
        self,
        lhs: SSAValue,
        rhs: SSAValue,
        direction: ComparisonDirection,
        compare_type: ComparisonType | None = None,
    ):
        assert isinstance(lhs.type, TensorType)
        props: dict[str, Attribute] = {"comparison_direction": ComparisonDirectionAttr(direction)}
        if compare_type is not None:
            props["compare_type"] = ComparisonTypeAttr(compare_type)
        super().__init__(
            operands=[lhs, rhs],
            result_types=[TensorType(i1, lhs.type.get_shape())],
            properties=props,
        )


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """`stablehlo.reduce`, parsing its pretty syntax back as it is printed.

    The fields, printer and verifier are xdsl-jax's; only `parse` differs.
    """

    name = "stablehlo.reduce"

    inputs = var_operand_def(AnyTensorType)
    init_values = var_operand_def(AnyTensorType)
    dimensions = prop_def(DenseArrayBase.constr(i64))
    result = var_result_def(AnyTensorType)
    body = region_def("single_block")

    irdl_options = (SameVariadicOperandSize(),)
    traits = traits_def(*_xj.ReduceOp.traits)

    print = _xj.ReduceOp.print

    def verify_(self) -> None:
        # xdsl-jax's checks, by its own helpers (its `verify_` would re-run
        # the IRDL checks of its own op definition).
        inputs = [cast(TensorType, v.type) for v in self.inputs]
        inits = [cast(TensorType, v.type) for v in self.init_values]
        elements = [t.element_type for t in inputs]
        dims = self.dimensions.get_values()
        pairs = _reduction._verify_reduce_counts(self.inputs, self.init_values, self.result)
        shape, rank = _reduction._verify_reduce_input_shapes(inputs)
        _reduction._verify_reduce_dimensions(dims, rank)
        _reduction._verify_reduce_init_values(inits, elements)
        _reduction._verify_reduce_results([r.type for r in self.result], shape, dims, elements)
        _reduction._verify_reduce_body(self.body, pairs, elements)

    @classmethod
    def parse(cls, parser: Parser) -> ReduceOp:
        """The region form (`... : T reducer(%a: t, %b: t) {...}`), and the
        compact one MLIR prints for a single-op body (`applies stablehlo.add
        across dimensions = [1] : T`), as `jax.jit(f).lower().as_text()` has it."""
        pairs = _reduction._parse_reduce_operand_pairs(parser)
        operands, inits = zip(*pairs, strict=True)
        applied = None
        if parser.parse_optional_keyword("applies") is not None:
            pos = parser.pos
            applied = (parser.parse_identifier(), pos)
        dimensions = _reduction._parse_reduce_dimensions(parser)
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        func_type = parser.parse_function_type()
        if applied is not None:
            body = _applied_body(parser, *applied, func_type.inputs.data[len(pairs):])
        else:
            parser.parse_keyword("reducer")
            flat = _reduction._parse_reduce_reducer_args(parser)
            # Printed as (acc_i, x_i) pairs; the block takes all accs, then all xs.
            arguments = (*flat[0::2], *flat[1::2])
            body = parser.parse_region(arguments)
        resolved = parser.resolve_operands([*operands, *inits], func_type.inputs.data, parser.pos)
        n = len(pairs)
        return cls.build(
            operands=[resolved[:n], resolved[n:]],
            result_types=[func_type.outputs.data],
            regions=[body],
            properties={"dimensions": DenseArrayBase.from_list(i64, dimensions)},
            attributes=attributes,
        )


def _applied_body(
    parser: Parser, name: str, pos: int, inits: Sequence[Attribute]
) -> Region:
    """The body a compact reduce names: `name` on the accumulator and the
    element, of the init value's type (one input: MLIR prints the compact
    form for one)."""
    op_type = parser.ctx.get_optional_op(name)
    if op_type is None or len(inits) != 1:
        parser.raise_error(f"stablehlo.reduce applies {name}: not a known binary op", pos)
    scalar = inits[0]
    block = Block(arg_types=[scalar, scalar])
    combined = op_type.create(operands=list(block.args), result_types=[scalar])
    block.add_ops([combined, _xj.ReturnOp(list(combined.results))])
    return Region(block)


@irdl_op_definition
class PadOp(IRDLOperation):
    """`stablehlo.pad` whose padding value may be any 0-d tensor of the operand's
    element type (xdsl-jax's fields and syntax otherwise)."""

    name = "stablehlo.pad"

    operand = operand_def(AnyTensorType)
    padding_value = operand_def(AnyTensorType)
    result = result_def(AnyTensorType)
    edge_padding_low = prop_def(DenseArrayBase.constr(i64))
    edge_padding_high = prop_def(DenseArrayBase.constr(i64))
    interior_padding = prop_def(DenseArrayBase.constr(i64))

    traits = traits_def(*_xj.PadOp.traits)
    assembly_format = _xj.PadOp.assembly_format

    def get_edge_padding_low(self) -> tuple[int, ...]:
        return self.edge_padding_low.get_values()

    def get_edge_padding_high(self) -> tuple[int, ...]:
        return self.edge_padding_high.get_values()

    def get_interior_padding(self) -> tuple[int, ...]:
        return self.interior_padding.get_values()

    def verify_(self) -> None:
        pad_t, operand_t = self.padding_value.type, self.operand.type
        assert isinstance(pad_t, TensorType) and isinstance(operand_t, TensorType)
        if pad_t.get_num_dims() != 0 or pad_t.element_type != operand_t.element_type:
            raise VerifyException(
                f"stablehlo.pad: the padding value must be a 0-d tensor of "
                f"{operand_t.element_type}, got {pad_t}"
            )
        low, high = self.get_edge_padding_low(), self.get_edge_padding_high()
        interior = self.get_interior_padding()
        src = operand_t.get_shape()
        if not len(low) == len(high) == len(interior) == len(src):
            raise VerifyException("stablehlo.pad: one low, high and interior padding per dim")
        if any(i < 0 for i in interior):
            raise VerifyException(f"stablehlo.pad: interior padding must be >= 0, got {interior}")
        want = [
            lo + n + max(n - 1, 0) * i + hi
            for n, lo, hi, i in zip(src, low, high, interior, strict=True)
        ]
        if list(self.result.type.get_shape()) != want:
            raise VerifyException(
                f"stablehlo.pad: padding {operand_t} gives shape {want}, "
                f"but the result is {self.result.type}"
            )


@irdl_op_definition
class SliceOp(IRDLOperation):
    """`stablehlo.slice` with the spec's bound checks (xdsl-jax's fields and syntax)."""

    name = "stablehlo.slice"

    operand = operand_def(AnyTensorType)
    start_indices = prop_def(DenseArrayBase.constr(i64))
    limit_indices = prop_def(DenseArrayBase.constr(i64))
    strides = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AnyTensorType)

    assembly_format = _xj.SliceOp.assembly_format
    custom_directives = _xj.SliceOp.custom_directives
    traits = traits_def(*_xj.SliceOp.traits)

    def verify_(self) -> None:
        operand_t, result_t = self.operand.type, self.result.type
        assert isinstance(operand_t, TensorType) and isinstance(result_t, TensorType)
        src = operand_t.get_shape()
        starts = self.start_indices.get_values()
        limits = self.limit_indices.get_values()
        strides = self.strides.get_values()
        if not len(starts) == len(limits) == len(strides) == len(src):
            raise VerifyException(
                f"stablehlo.slice: one start, limit and stride per dim of {operand_t}"
            )
        for d, (n, start, limit, stride) in enumerate(
            zip(src, starts, limits, strides, strict=True)
        ):
            if not 0 <= start <= limit <= n or stride <= 0:
                raise VerifyException(
                    f"stablehlo.slice: dim {d} of {operand_t} has size {n}, but the slice "
                    f"reads [{start}:{limit}:{stride}] (needs 0 <= start <= limit <= {n}, "
                    "stride > 0)"
                )
        want = [
            -(-(limit - start) // stride)
            for start, limit, stride in zip(starts, limits, strides, strict=True)
        ]
        if list(result_t.get_shape()) != want:
            raise VerifyException(
                f"stablehlo.slice: slicing {operand_t} gives shape {want}, "
                f"but the result is {result_t}"
            )


@irdl_op_definition
class DynamicUpdateSliceOp(IRDLOperation):
    """`stablehlo.dynamic_update_slice %operand, %update, %i, %j`: the operand
    with `update` written at the (clamped) run-time start indices."""

    name = "stablehlo.dynamic_update_slice"

    operand = operand_def(AnyTensorType)
    update = operand_def(AnyTensorType)
    start_indices = var_operand_def(AnyTensorType)
    result = result_def(AnyTensorType)

    traits = traits_def(NoMemoryEffect())
    assembly_format = "operands attr-dict `:` functional-type(operands, results)"

    def verify_(self) -> None:
        operand_t, update_t = self.operand.type, self.update.type
        assert isinstance(operand_t, TensorType) and isinstance(update_t, TensorType)
        if self.result.type != operand_t:
            raise VerifyException(
                f"{self.name}: the result {self.result.type} must have the operand's "
                f"type {operand_t}"
            )
        if update_t.get_num_dims() != operand_t.get_num_dims() or len(self.start_indices) != (
            operand_t.get_num_dims()
        ):
            raise VerifyException(
                f"{self.name}: needs an update of the operand's rank and one start index per dim"
            )


@irdl_op_definition
class ReverseOp(IRDLOperation):
    """`stablehlo.reverse %x, dims = [0, 2] : tensor<...>`: the operand with the
    order of its elements along each of `dimensions` reversed."""

    name = "stablehlo.reverse"

    operand = operand_def(AnyTensorType)
    dimensions = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AnyTensorType)

    traits = traits_def(NoMemoryEffect())

    def __init__(self, operand: SSAValue, dimensions: Sequence[int]):
        super().__init__(
            operands=[operand],
            result_types=[operand.type],
            properties={"dimensions": DenseArrayBase.from_list(i64, list(dimensions))},
        )

    def verify_(self) -> None:
        operand_t = self.operand.type
        assert isinstance(operand_t, TensorType)
        if self.result.type != operand_t:
            raise VerifyException(
                f"{self.name}: the result {self.result.type} must have the operand's "
                f"type {operand_t}"
            )
        dims, rank = self.dimensions.get_values(), operand_t.get_num_dims()
        if any(not 0 <= d < rank for d in dims) or len(set(dims)) != len(dims):
            raise VerifyException(
                f"{self.name}: dims {list(dims)} must be distinct dims of {operand_t} "
                f"(0 <= dim < {rank})"
            )

    @classmethod
    def parse(cls, parser: Parser) -> ReverseOp:
        """JAX's pretty form: `%x, dims = [0, 1] attr-dict : type`."""
        unresolved = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        parser.parse_keyword("dims")
        parser.parse_punctuation("=")
        dims = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ty = parser.parse_type()
        operand = parser.resolve_operand(unresolved, ty)
        op = cls(operand, dims)
        op.attributes.update(attributes)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_ssa_value(self.operand)
        printer.print_string(", dims = [")
        printer.print_list(self.dimensions.get_values(), printer.print_int)
        printer.print_string("]")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.operand.type)


class WhileOp(_xj.WhileOp):
    """xdsl-jax's `stablehlo.while` (its definition, inherited), printing `cond`
    with `do`'s argument names."""

    def print(self, printer: Printer) -> None:
        body, cond = self.body.block.args, self.cond.block.args
        with printer.in_parens():
            printer.print_list(
                zip(body, self.operand, strict=True),
                lambda pair: print_assignment(printer, pair[0], pair[1]),
            )
        # MLIR's custom form declares one name per iteration argument for both
        # regions; xDSL's printer has no public way to alias a name.
        for cond_arg, body_arg in zip(cond, body, strict=True):
            printer._ssa_values[cond_arg] = printer._ssa_values[body_arg]
        if self.operand:
            printer.print_string(" : ")
            printer.print_list((v.type for v in self.operand), printer.print_attribute)
        if self.attributes:
            printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string("\ncond ")
        printer.print_region(self.cond, print_entry_block_args=False)
        printer.print_string(" do ")
        printer.print_region(self.body, print_entry_block_args=False)


def _rank(value: SSAValue) -> int:
    return cast(TensorType, value.type).get_num_dims()


def _per_dim(
    attr: DenseArrayBase[IntegerType] | None, operand: SSAValue, default: int
) -> tuple[int, ...]:
    """A per-dim window property of a windowed op, `default` in each dim if absent."""
    if attr is None:
        return (default,) * _rank(operand)
    return tuple(int(v) for v in attr.get_values())


def _padding_pairs(
    attr: DenseIntElementsAttr | None, operand: SSAValue
) -> tuple[tuple[int, int], ...]:
    """A windowed op's `padding` (a `rank x 2` tensor, maybe a splat) as
    (low, high) pairs, no padding if absent."""
    rank = _rank(operand)
    if attr is None:
        return ((0, 0),) * rank
    flat = [int(v) for v in attr.get_values()]
    if len(flat) == 1:  # a splat
        flat = flat * (2 * rank)
    return tuple((flat[2 * d], flat[2 * d + 1]) for d in range(len(flat) // 2))


@irdl_op_definition
class ReduceWindowOp(IRDLOperation):
    """`stablehlo.reduce_window` (generic syntax, as JAX prints it): each
    result element reduces, with `body`, the window of the (padded, dilated)
    input at its position (`jnp.cumsum`, pooling)."""

    name = "stablehlo.reduce_window"

    inputs = var_operand_def(AnyTensorType)
    init_values = var_operand_def(AnyTensorType)
    window_dimensions = prop_def(DenseArrayBase.constr(i64))
    window_strides = opt_prop_def(DenseArrayBase.constr(i64))
    base_dilations = opt_prop_def(DenseArrayBase.constr(i64))
    window_dilations = opt_prop_def(DenseArrayBase.constr(i64))
    padding = opt_prop_def(DenseIntElementsAttr)
    results_ = var_result_def(AnyTensorType)
    body = region_def("single_block")

    irdl_options = (SameVariadicOperandSize(),)
    traits = traits_def(NoMemoryEffect())

    @property
    def window(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.window_dimensions.get_values())

    @property
    def strides(self) -> tuple[int, ...]:
        return _per_dim(self.window_strides, self.inputs[0], 1)

    @property
    def base_dilation(self) -> tuple[int, ...]:
        return _per_dim(self.base_dilations, self.inputs[0], 1)

    @property
    def window_dilation(self) -> tuple[int, ...]:
        return _per_dim(self.window_dilations, self.inputs[0], 1)

    @property
    def pads(self) -> tuple[tuple[int, int], ...]:
        """(low, high) padding per dim."""
        return _padding_pairs(self.padding, self.inputs[0])

    def verify_(self) -> None:
        rank = cast(TensorType, self.inputs[0].type).get_num_dims()
        fields = {
            "window_dimensions": self.window, "window_strides": self.strides,
            "base_dilations": self.base_dilation, "window_dilations": self.window_dilation,
        }
        for name, values in fields.items():
            if len(values) != rank or any(v < 1 for v in values):
                raise VerifyException(
                    f"{self.name}: {name} {list(values)} needs {rank} positive values"
                )
        if len(self.pads) != rank:
            raise VerifyException(f"{self.name}: padding needs one (low, high) pair per dim")


@irdl_op_definition
class SortOp(IRDLOperation):
    """`stablehlo.sort` (generic syntax, as JAX prints it): the inputs
    permuted together along `dimension`, ordered by `comparator` (which says
    whether its first element set goes before its second)."""

    name = "stablehlo.sort"

    inputs = var_operand_def(AnyTensorType)
    dimension = prop_def(IntegerAttr)
    is_stable = opt_prop_def(BoolAttr)
    results_ = var_result_def(AnyTensorType)
    comparator = region_def("single_block")

    traits = traits_def(NoMemoryEffect())

    @property
    def axis(self) -> int:
        return int(self.dimension.value.data)

    @property
    def stable(self) -> bool:
        return self.is_stable is not None and bool(self.is_stable.value.data)

    def verify_(self) -> None:
        shapes = {cast(TensorType, v.type).get_shape() for v in self.inputs}
        if len(shapes) != 1:
            raise VerifyException(f"{self.name}: the inputs must have one shape")
        rank = len(shapes.pop())
        if not -rank <= self.axis < rank:
            raise VerifyException(f"{self.name}: dimension {self.axis} is not a dim of rank {rank}")
        if [v.type for v in self.inputs] != [r.type for r in self.results]:
            raise VerifyException(f"{self.name}: the results must have the inputs' types")


@irdl_op_definition
class SelectAndScatterOp(IRDLOperation):
    """`stablehlo.select_and_scatter` (generic syntax, as JAX prints it): in
    each window of `operand` (every `window_strides` step, after `padding`),
    `select` picks one element; the result is `init_value` everywhere,
    combined by `scatter` with the `source` element of each window that
    picked it. The gradient of max / min pooling (`select` is `GE` / `LE`,
    `scatter` is `add`)."""

    name = "stablehlo.select_and_scatter"

    operand = operand_def(AnyTensorType)
    source = operand_def(AnyTensorType)
    init_value = operand_def(AnyTensorType)
    window_dimensions = opt_prop_def(DenseArrayBase.constr(i64))
    window_strides = opt_prop_def(DenseArrayBase.constr(i64))
    padding = opt_prop_def(DenseIntElementsAttr)
    result = result_def(AnyTensorType)
    select = region_def("single_block")
    scatter = region_def("single_block")

    traits = traits_def(NoMemoryEffect())

    @property
    def window(self) -> tuple[int, ...]:
        return _per_dim(self.window_dimensions, self.operand, 1)

    @property
    def strides(self) -> tuple[int, ...]:
        return _per_dim(self.window_strides, self.operand, 1)

    @property
    def pads(self) -> tuple[tuple[int, int], ...]:
        """(low, high) padding per dim."""
        return _padding_pairs(self.padding, self.operand)

    def windows(self) -> tuple[int, ...]:
        """How many windows fit along each dim: the source's shape (spec C2)."""
        shape = cast(TensorType, self.operand.type).get_shape()
        counts = []
        for n, w, s, (lo, hi) in zip(shape, self.window, self.strides, self.pads, strict=True):
            padded = lo + n + hi
            counts.append(0 if padded == 0 or w > padded else (padded - w) // s + 1)
        return tuple(counts)

    def verify_(self) -> None:
        operand_t = cast(TensorType, self.operand.type)
        source_t = cast(TensorType, self.source.type)
        init_t = cast(TensorType, self.init_value.type)
        rank, element = operand_t.get_num_dims(), operand_t.element_type
        for name, values in (("window_dimensions", self.window), ("window_strides", self.strides)):
            if len(values) != rank or any(v < 1 for v in values):
                raise VerifyException(
                    f"{self.name}: {name} {list(values)} needs {rank} positive values"
                )
        if self.padding is not None and tuple(self.padding.type.get_shape()) != (rank, 2):
            raise VerifyException(f"{self.name}: padding needs one (low, high) pair per dim")
        if source_t.element_type != element or init_t != TensorType(element, []):
            raise VerifyException(
                f"{self.name}: the source and the 0-d init value must have the operand's "
                f"element type {element}"
            )
        if tuple(source_t.get_shape()) != self.windows():
            raise VerifyException(
                f"{self.name}: the source must have one element per window, "
                f"{list(self.windows())}, got {source_t}"
            )
        if self.result.type != operand_t:
            raise VerifyException(f"{self.name}: the result must have the operand's type")
        scalar = TensorType(element, [])
        for region, returns, what in ((self.select, TensorType(i1, []), "select"),
                                      (self.scatter, scalar, "scatter")):
            block = region.block
            ret = block.last_op
            if [a.type for a in block.args] != [scalar, scalar] or ret is None or [
                v.type for v in ret.operands
            ] != [returns]:
                raise VerifyException(
                    f"{self.name}: {what} must map ({scalar}, {scalar}) to {returns}"
                )


class RngAlgorithm(StrEnum):
    """Which generator `stablehlo.rng_bit_generator` runs (`DEFAULT`: the backend's)."""

    DEFAULT = "DEFAULT"
    THREE_FRY = "THREE_FRY"
    PHILOX = "PHILOX"


@irdl_attr_definition
class RngAlgorithmAttr(EnumAttribute[RngAlgorithm], SpacedOpaqueSyntaxAttribute):
    """`#stablehlo<rng_algorithm DEFAULT>`."""

    name = "stablehlo.rng_algorithm"


@irdl_op_definition
class RngBitGeneratorOp(IRDLOperation):
    """`stablehlo.rng_bit_generator %state, algorithm = DEFAULT : ...`: random
    bits of the `output` type from `initial_state`, and the state after them.
    Which bits is the backend's choice (`DEFAULT`), as the spec allows; what
    `jax.random` emits for `rbg` and `unsafe_rbg` keys."""

    name = "stablehlo.rng_bit_generator"

    initial_state = operand_def(AnyTensorType)
    rng_algorithm = prop_def(RngAlgorithmAttr)
    output_state = result_def(AnyTensorType)
    output = result_def(AnyTensorType)

    traits = traits_def(NoMemoryEffect())
    assembly_format = (
        "$initial_state `,` `algorithm` `=` $rng_algorithm attr-dict "
        "`:` functional-type(operands, results)"
    )

    @property
    def algorithm(self) -> RngAlgorithm:
        return self.rng_algorithm.data

    def verify_(self) -> None:
        if self.output_state.type != self.initial_state.type:
            raise VerifyException(
                f"{self.name}: the output state must have the initial state's type "
                f"{self.initial_state.type}"
            )


def _stablehlo_dialect() -> Dialect:
    replaced: dict[str, type[Operation]] = {
        CompareOp.name: CompareOp,
        ReduceOp.name: ReduceOp,
        PadOp.name: PadOp,
        SliceOp.name: SliceOp,
        WhileOp.name: WhileOp,
    }
    ops: list[type[Operation]] = [replaced.get(op.name, op) for op in _xj.StableHLO.operations]
    ops.extend((
        DynamicUpdateSliceOp, ReverseOp, ReduceWindowOp, SortOp, ConvolutionOp,
        SelectAndScatterOp, RngBitGeneratorOp, *COLLECTIVE_OPS,
    ))
    attributes: list[type[Attribute]] = [
        *_xj.StableHLO.attributes, ConvDimensionNumbers, RngAlgorithmAttr, ChannelHandleAttr,
    ]
    return Dialect("stablehlo", ops, attributes)


StableHLO = _stablehlo_dialect()
