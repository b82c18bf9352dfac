"""The part of Shardy (`sdy`, OpenXLA's sharding dialect) that JAX writes.

`jax.jit(f).lower(...)` states shardings in Shardy's words: `sdy.mesh @mesh =
<["batch"=4, "model"=2]>` declares a mesh, `#sdy.sharding<@mesh, [{"batch"},
{}]>` on an argument or result says how it is split (JAX tags every scalar
argument `#sdy.sharding<@empty_mesh, []>`), and `sdy.sharding_constraint`
is `jax.lax.with_sharding_constraint` or `jax.sharding.reshard` on a value;
`sdy.manual_computation` is a nested `jax.shard_map` (a manual region: its
body is per-device code, ending in `sdy.return`).
xdsl-jax has no `sdy` dialect; partir defines what it reads, with Shardy's
syntax, so such programs import, print and parse back. The `Annotations`
tactic (`partir.annotations`) turns these shardings into tiling actions and
then removes them.

A dim's axes are listed major first (`{"batch", "model"}` is
`PartitionSpec(("batch", "model"))`); `?` after them marks the dim open
(propagation may split it further), `p<k>` a priority. Sub-axes
(`"x":(1)2`) and inline meshes are refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    AnyTensorType,
    ArrayAttr,
    IntAttr,
    StringAttr,
    SymbolNameConstraint,
    TensorType,
)
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsTerminator, Pure, ReturnLike
from xdsl.utils.exceptions import VerifyException

from dialects.escaping import quoted


def _parse_axis_names(parser: AttrParser, sharding_text: str) -> list[str]:
    """`{"a", "b"}`: axis names (a sub-axis `"a":(1)2` is refused)."""

    def axis() -> str:
        name = parser.parse_str_literal()
        if parser.parse_optional_punctuation(":") is not None:
            parser.raise_error(
                f"sub-axis of {quoted(name)} in {sharding_text}: partir splits over whole "
                "mesh axes; name whole axes in the PartitionSpec"
            )
        return name

    return parser.parse_comma_separated_list(parser.Delimiter.BRACES, axis)


@irdl_attr_definition
class MeshAttr(ParametrizedAttribute):
    """`#sdy.mesh<["batch"=4, "model"=2]>`: mesh axes and their sizes, in order
    (device ids, if JAX lists them, are kept; partir places devices itself)."""

    name = "sdy.mesh"
    axis_names: ArrayAttr[StringAttr]
    axis_sizes: ArrayAttr[IntAttr]
    device_ids: ArrayAttr[IntAttr]

    def __init__(self, axes: dict[str, int], device_ids: Sequence[int] = ()):
        super().__init__(
            ArrayAttr(StringAttr(a) for a in axes),
            ArrayAttr(IntAttr(s) for s in axes.values()),
            ArrayAttr(IntAttr(d) for d in device_ids),
        )

    @property
    def axes(self) -> dict[str, int]:
        return {
            n.data: s.data for n, s in zip(self.axis_names.data, self.axis_sizes.data, strict=True)
        }

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            names, sizes, ids = cls.parse_body(parser)
        return names, sizes, ids

    @staticmethod
    def parse_body(
        parser: AttrParser,
    ) -> tuple[ArrayAttr[StringAttr], ArrayAttr[IntAttr], ArrayAttr[IntAttr]]:
        """`["a"=4, ...]` then optionally `, device_ids=[...]` (no brackets around)."""

        def axis() -> tuple[str, int]:
            name = parser.parse_str_literal()
            parser.parse_punctuation("=")
            return name, parser.parse_integer(allow_boolean=False, allow_negative=False)

        axes = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, axis)
        ids: list[int] = []
        if parser.parse_optional_punctuation(",") is not None:
            parser.parse_keyword("device_ids")
            parser.parse_punctuation("=")
            ids = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE,
                lambda: parser.parse_integer(allow_boolean=False, allow_negative=False),
            )
        return (
            ArrayAttr(StringAttr(n) for n, _ in axes),
            ArrayAttr(IntAttr(s) for _, s in axes),
            ArrayAttr(IntAttr(i) for i in ids),
        )

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            self.print_body(printer)

    def print_body(self, printer: Printer) -> None:
        def axis(item: tuple[str, int]) -> None:
            printer.print_string_literal(item[0])
            printer.print_string(f"={item[1]}")

        with printer.in_square_brackets():
            printer.print_list(self.axes.items(), axis)
        if self.device_ids.data:
            printer.print_string(", device_ids=")
            with printer.in_square_brackets():
                printer.print_list(self.device_ids.data, lambda i: printer.print_int(i.data))


@irdl_attr_definition
class ShardingAttr(ParametrizedAttribute):
    """`#sdy.sharding<@mesh, [{"batch"}, {"model", ?}], replicated={"x"}>`: per
    dim, the mesh axes it is split over (major first), on mesh `@mesh`.

    `open_dims` lists the dims written open (`?`), `priorities` each dim's
    `p<k>` (-1: none); `replicated` and `unreduced` name axes the value is
    explicitly whole over, or a pending sum over (JAX's unreduced arrays)."""

    name = "sdy.sharding"
    mesh_name: StringAttr
    dim_axes: ArrayAttr[ArrayAttr[StringAttr]]
    open_dims: ArrayAttr[IntAttr]
    priorities: ArrayAttr[IntAttr]
    replicated: ArrayAttr[StringAttr]
    unreduced: ArrayAttr[StringAttr]

    def __init__(
        self,
        mesh_name: str,
        dim_axes: Sequence[Sequence[str]],
        open_dims: Sequence[int] = (),
        priorities: Sequence[int] | None = None,
        replicated: Sequence[str] = (),
        unreduced: Sequence[str] = (),
    ):
        super().__init__(
            StringAttr(mesh_name),
            ArrayAttr(ArrayAttr(StringAttr(a) for a in axes) for axes in dim_axes),
            ArrayAttr(IntAttr(d) for d in open_dims),
            ArrayAttr(IntAttr(p) for p in (priorities or [-1] * len(dim_axes))),
            ArrayAttr(StringAttr(a) for a in replicated),
            ArrayAttr(StringAttr(a) for a in unreduced),
        )

    @property
    def dims(self) -> list[tuple[str, ...]]:
        """Each dim's axes, major first."""
        return [tuple(a.data for a in axes.data) for axes in self.dim_axes.data]

    @property
    def axes(self) -> list[str]:
        """Every axis the sharding names, in order of first mention."""
        named = [a for axes in self.dims for a in axes]
        named += [a.data for a in (*self.replicated.data, *self.unreduced.data)]
        return list(dict.fromkeys(named))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            return cls.parse_body(parser)

    @classmethod
    def parse_body(cls, parser: AttrParser) -> Sequence[Attribute]:
        """`@mesh, [dims...]` then optional `, replicated={...}`, `, unreduced={...}`."""
        start = parser.pos
        mesh = parser.parse_optional_symbol_name()
        if mesh is None:
            parser.raise_error(
                "an sdy.sharding with an inline mesh: partir reads shardings on a mesh "
                "declared by name (sdy.mesh @mesh = <...>)",
                start,
            )
        parser.parse_punctuation(",")
        text = f"the sharding on @{mesh.data}"
        dims: list[list[str]] = []
        open_dims: list[int] = []
        priorities: list[int] = []

        def dim() -> None:
            axes: list[str] = []
            is_open = False

            def item() -> None:
                nonlocal is_open
                if parser.parse_optional_punctuation("?") is not None:
                    is_open = True
                    return
                name = parser.parse_str_literal()
                if parser.parse_optional_punctuation(":") is not None:
                    parser.raise_error(
                        f"sub-axis of {quoted(name)} in {text}: partir splits over whole mesh "
                        "axes; name whole axes in the PartitionSpec"
                    )
                axes.append(name)

            parser.parse_comma_separated_list(parser.Delimiter.BRACES, item)
            pos = parser.pos
            priority = parser.parse_optional_identifier()
            if priority is not None:
                if not (priority[:1] == "p" and priority[1:].isdigit()):
                    parser.raise_error(f"expected a priority p<k> in {text}", pos, parser.pos)
                priorities.append(int(priority[1:]))
            else:
                priorities.append(-1)
            if is_open:
                open_dims.append(len(dims))
            dims.append(axes)

        parser.parse_comma_separated_list(parser.Delimiter.SQUARE, dim)
        lists: dict[str, list[str]] = {"replicated": [], "unreduced": []}
        while parser.parse_optional_punctuation(",") is not None:
            pos = parser.pos
            key = parser.parse_identifier()
            if key not in lists:
                parser.raise_error(
                    f"{text}: unknown part {quoted(key)} (partir reads replicated= and "
                    "unreduced=)",
                    pos,
                )
            parser.parse_punctuation("=")
            lists[key] = _parse_axis_names(parser, text)
        return (
            StringAttr(mesh.data),
            ArrayAttr(ArrayAttr(StringAttr(a) for a in axes) for axes in dims),
            ArrayAttr(IntAttr(d) for d in open_dims),
            ArrayAttr(IntAttr(p) for p in priorities),
            ArrayAttr(StringAttr(a) for a in lists["replicated"]),
            ArrayAttr(StringAttr(a) for a in lists["unreduced"]),
        )

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            self.print_body(printer)

    def print_body(self, printer: Printer) -> None:
        printer.print_string(f"@{self.mesh_name.data}, ")
        opened = {d.data for d in self.open_dims.data}
        priorities = [p.data for p in self.priorities.data]

        def dim(item: tuple[int, tuple[str, ...]]) -> None:
            index, axes = item
            with printer.in_braces():
                printer.print_list(axes, printer.print_string_literal)
                if index in opened:
                    printer.print_string(", ?" if axes else "?")
            if priorities[index] >= 0:
                printer.print_string(f"p{priorities[index]}")

        with printer.in_square_brackets():
            printer.print_list(enumerate(self.dims), dim)
        for key, names in (("replicated", self.replicated), ("unreduced", self.unreduced)):
            if names.data:
                printer.print_string(f", {key}=")
                with printer.in_braces():
                    printer.print_list([n.data for n in names.data], printer.print_string_literal)

    def verify(self) -> None:
        if len(self.priorities.data) != len(self.dim_axes.data):
            raise VerifyException("sdy.sharding: one priority per dim")
        named = [a for axes in self.dims for a in axes]
        if len(named) != len(set(named)):
            raise VerifyException(f"sdy.sharding names an axis twice: {named}")


SHARDING = "sdy.sharding"
"""The argument / result attribute holding a `ShardingAttr`."""


@irdl_op_definition
class MeshOp(IRDLOperation):
    """`sdy.mesh @mesh = <["batch"=4, "model"=2]>`: a named mesh JAX's
    shardings refer to. Not a symbol of xDSL's symbol table: partir declares
    its own mesh as `partir.mesh @mesh` in the same module while JAX's is
    still there (until `Annotations` removes it), and the shardings name
    JAX's by its text (`partir.annotations` reads them)."""

    name = "sdy.mesh"
    sym_name = prop_def(SymbolNameConstraint())
    mesh = prop_def(MeshAttr)

    def __init__(self, name: str, mesh: MeshAttr):
        super().__init__(properties={"sym_name": StringAttr(name), "mesh": mesh})

    @classmethod
    def parse(cls, parser: Parser) -> MeshOp:
        name = parser.parse_symbol_name()
        parser.parse_punctuation("=")
        with parser.in_angle_brackets():
            names, sizes, ids = MeshAttr.parse_body(parser)
        op = cls(name.data, MeshAttr.new((names, sizes, ids)))
        attributes = parser.parse_optional_attr_dict()
        op.attributes.update(attributes)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(f" @{self.sym_name.data} = ")
        with printer.in_angle_brackets():
            self.mesh.print_body(printer)
        if self.attributes:
            printer.print_op_attributes(self.attributes)


RESHARD = "partir.reshard"
"""The unit attribute on a constraint `Annotations` keeps rather than removes
(`partir.annotations.is_reshard`): it changes the sharding its operand
already has (`jax.sharding.reshard(x, P(None, None))` of an `x` typed
`P("batch", None)`), so its result is a value of its own, split as it says
whatever its operand is. Propagation stops at it (`rewrites.registry`) and
the SPMD lowering redistributes between the two (`lowering.to_spmd`)."""


@irdl_op_definition
class ShardingConstraintOp(IRDLOperation):
    """`sdy.sharding_constraint %x <@mesh, [{"batch"}, {}]> : tensor<8x4xf32>`:
    `with_sharding_constraint` or `reshard` of `%x`; the result is `%x`."""

    name = "sdy.sharding_constraint"
    input = operand_def(AnyTensorType)
    sharding = prop_def(ShardingAttr)
    result = result_def(AnyTensorType)
    traits = traits_def(Pure())

    def __init__(self, value: SSAValue, sharding: ShardingAttr):
        super().__init__(
            operands=[value], result_types=[value.type], properties={"sharding": sharding}
        )

    @classmethod
    def parse(cls, parser: Parser) -> ShardingConstraintOp:
        operand = parser.parse_unresolved_operand()
        with parser.in_angle_brackets():
            sharding = ShardingAttr.new(ShardingAttr.parse_body(parser))
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ty = parser.parse_type()
        op = cls(parser.resolve_operand(operand, ty), sharding)
        op.attributes.update(attributes)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(" ")
        with printer.in_angle_brackets():
            self.sharding.print_body(printer)
        if self.attributes:
            printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)

    @property
    def is_reshard(self) -> bool:
        """Whether `Annotations` kept it as a reshard (`RESHARD`)."""
        return RESHARD in self.attributes

    def verify_(self) -> None:
        if self.input.type != self.result.type:
            raise VerifyException(f"{self.name}: the result's type must be the operand's")
        rank = len(self.sharding.dims)
        ty = self.input.type
        if isinstance(ty, TensorType) and ty.get_num_dims() != rank:
            raise VerifyException(
                f"{self.name}: the sharding has {rank} dims, the value {ty.get_num_dims()}"
            )


@irdl_attr_definition
class ShardingPerValueAttr(ParametrizedAttribute):
    """`#sdy.sharding_per_value<[<@mesh, [...]>, ...]>`: one sharding per value
    (a manual region's operands or results)."""

    name = "sdy.sharding_per_value"
    shardings: ArrayAttr[ShardingAttr]

    def __init__(self, shardings: Sequence[ShardingAttr]):
        super().__init__(ArrayAttr(shardings))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        def one() -> ShardingAttr:
            with parser.in_angle_brackets():
                return ShardingAttr.new(ShardingAttr.parse_body(parser))

        with parser.in_angle_brackets():
            found = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, one)
        return (ArrayAttr(found),)

    def print_parameters(self, printer: Printer) -> None:
        def one(sharding: ShardingAttr) -> None:
            with printer.in_angle_brackets():
                sharding.print_body(printer)

        with printer.in_angle_brackets(), printer.in_square_brackets():
            printer.print_list(self.shardings.data, one)


@irdl_attr_definition
class ManualAxesAttr(ParametrizedAttribute):
    """`#sdy<manual_axes{"batch", "model"}>`: the mesh axes a manual region's
    body is written per device over."""

    name = "sdy.manual_axes"
    axes: ArrayAttr[StringAttr]

    def __init__(self, axes: Sequence[str]):
        super().__init__(ArrayAttr(StringAttr(a) for a in axes))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.data for a in self.axes.data)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        names = _parse_axis_names(parser, "the manual axes")
        return (ArrayAttr(StringAttr(n) for n in names),)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_braces():
            printer.print_list(self.names, printer.print_string_literal)


@irdl_op_definition
class ManualComputationOp(IRDLOperation):
    """`sdy.manual_computation`: a nested `jax.shard_map`. Its operands are
    split as `in_shardings` say before they enter, its body runs on every
    device over `manual_axes` at the parts' (local) types with its own
    collectives, and its results are the devices' parts put together as
    `out_shardings` say. Shardy's syntax:

        %r = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"batch"}]>]
             out_shardings=[<@mesh, [{"batch"}]>] manual_axes={"batch"}
             (%a: tensor<2xf32>) { ... sdy.return %b : tensor<2xf32> }
             : (tensor<8xf32>) -> tensor<8xf32>
    """

    name = "sdy.manual_computation"
    tensors = var_operand_def(AnyTensorType)
    results_ = var_result_def(AnyTensorType)
    in_shardings = prop_def(ShardingPerValueAttr)
    out_shardings = prop_def(ShardingPerValueAttr)
    manual_axes = prop_def(ManualAxesAttr)
    body = region_def("single_block")

    def __init__(
        self,
        operands: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        in_shardings: ShardingPerValueAttr,
        out_shardings: ShardingPerValueAttr,
        manual_axes: ManualAxesAttr,
        body: Region,
    ):
        super().__init__(
            operands=[operands],
            result_types=[result_types],
            properties={
                "in_shardings": in_shardings,
                "out_shardings": out_shardings,
                "manual_axes": manual_axes,
            },
            regions=[body],
        )

    @classmethod
    def parse(cls, parser: Parser) -> ManualComputationOp:
        operands = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, parser.parse_unresolved_operand
        )
        shardings: dict[str, ShardingPerValueAttr] = {}
        for key in ("in_shardings", "out_shardings"):
            parser.parse_keyword(key)
            parser.parse_punctuation("=")

            def one() -> ShardingAttr:
                with parser.in_angle_brackets():
                    return ShardingAttr.new(ShardingAttr.parse_body(parser))

            found = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, one)
            shardings[key] = ShardingPerValueAttr(found)
        parser.parse_keyword("manual_axes")
        parser.parse_punctuation("=")
        axes = ManualAxesAttr(_parse_axis_names(parser, "the manual axes"))
        args = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, lambda: parser.parse_argument(expect_type=True)
        )
        body = parser.parse_region(args)
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        function = parser.parse_function_type()
        resolved = parser.resolve_operands(operands, function.inputs.data, parser.pos)
        op = cls(
            resolved, function.outputs.data, shardings["in_shardings"],
            shardings["out_shardings"], axes, body,
        )
        op.attributes.update(attributes)
        return op

    def print(self, printer: Printer) -> None:
        def one(sharding: ShardingAttr) -> None:
            with printer.in_angle_brackets():
                sharding.print_body(printer)

        with printer.in_parens():
            printer.print_list(self.tensors, printer.print_operand)
        for key, value in (
            ("in_shardings", self.in_shardings),
            ("out_shardings", self.out_shardings),
        ):
            printer.print_string(f" {key}=")
            with printer.in_square_brackets():
                printer.print_list(value.shardings.data, one)
        printer.print_string(" manual_axes=")
        self.manual_axes.print_parameters(printer)
        printer.print_string(" ")
        with printer.in_parens():
            printer.print_list(self.body.block.args, printer.print_block_argument)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)
        if self.attributes:
            printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_function_type(
            [v.type for v in self.tensors], [r.type for r in self.results_]
        )

    def verify_(self) -> None:
        block = self.body.block
        ins, outs = self.in_shardings.shardings.data, self.out_shardings.shardings.data
        if len(ins) != len(self.tensors) or len(outs) != len(self.results_):
            raise VerifyException(f"{self.name}: one sharding per operand and per result")
        if len(block.args) != len(self.tensors):
            raise VerifyException(f"{self.name}: its body takes one argument per operand")


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """`sdy.return`: the values a manual region's body yields (each device's part)."""

    name = "sdy.return"
    values = var_operand_def()
    traits = traits_def(IsTerminator(), HasParent(ManualComputationOp), ReturnLike(), Pure())
    assembly_format = "attr-dict ($values^ `:` type($values))?"


SDY = Dialect(
    "sdy",
    [MeshOp, ShardingConstraintOp, ManualComputationOp, ReturnOp],
    [MeshAttr, ShardingAttr, ShardingPerValueAttr, ManualAxesAttr],
)
