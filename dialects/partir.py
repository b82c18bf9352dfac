"""The partir core dialect: a mesh, ranges over its axes, and tile/sum loops.

A program in this dialect is ordinary StableHLO in which some values are
computed by loops over named mesh axes:

    partir.mesh @mesh ["batch" = 4, "model" = 2]

    %y = partir.loop "batch" [#partir.tile<0>] (%r: !partir.range<4>) {
      %xs = partir.slice 0 %x[%r] : tensor<32x64xf32> -> tensor<8x64xf32>
      %e = stablehlo.exponential %xs : tensor<8x64xf32>
      partir.yield %e : tensor<8x64xf32>
    } : tensor<32x64xf32>

The sequential meaning is simple (see `dialects.interpreter.core`): a `tile<d>`
loop concatenates its body's results along `d` over the range, a `sum` loop adds
them. The lowering gives the same loops a parallel meaning, one iteration per
device along the axis; the verifier enforces what makes both meanings agree.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    IntAttr,
    IntegerAttr,
    ModuleOp,
    NoneAttr,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import (
    Attribute,
    Block,
    BlockArgument,
    Dialect,
    Operation,
    ParametrizedAttribute,
    Region,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    IRDLOperation,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import (
    HasParent,
    IsTerminator,
    Pure,
    RecursiveMemoryEffect,
    ReturnLike,
    SymbolOpInterface,
)
from xdsl.utils.exceptions import VerifyException

from dialects.dtypes import tensor_type
from dialects.escaping import quoted
from dialects.mesh import Mesh

# --------------------------------------------------------------------------
# Types and attributes
# --------------------------------------------------------------------------


@irdl_attr_definition
class RangeType(ParametrizedAttribute, TypeAttribute):
    """`!partir.range<N>`: the values 0..N-1, one per device along a mesh axis."""

    name = "partir.range"
    size: IntAttr

    def __init__(self, size: int | IntAttr):
        super().__init__(IntAttr(size) if isinstance(size, int) else size)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            n = parser.parse_integer(allow_boolean=False, allow_negative=False)
        return (IntAttr(n),)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_int(self.size.data)

    def verify(self) -> None:
        if self.size.data <= 0:
            raise VerifyException(f"range size must be positive, got {self.size.data}")


@irdl_attr_definition
class TileAttr(ParametrizedAttribute):
    """`#partir.tile<d>`: the loop's result concatenates the body's results on dim d."""

    name = "partir.tile"
    dim: IntAttr

    def __init__(self, dim: int | IntAttr):
        super().__init__(IntAttr(dim) if isinstance(dim, int) else dim)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            d = parser.parse_integer(allow_boolean=False, allow_negative=False)
        return (IntAttr(d),)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_int(self.dim.data)


@irdl_attr_definition
class SumAttr(ParametrizedAttribute):
    """`#partir.sum`: the loop's result is the sum of the body's results."""

    name = "partir.sum"


LoopAction = base(TileAttr) | base(SumAttr)
"""As a constraint (not `TileAttr | SumAttr`) so that `LoopOp.action` is typed."""


@irdl_attr_definition
class OriginAttr(ParametrizedAttribute):
    """`#partir.origin<3, "Megatron", "params['attn']['wq']">`: the action behind
    a loop (numbered in schedule order), the tactic that asked for it and the
    value it tiled. Later stages say from it why a value is split, and
    propagation lets the earlier action win a conflict."""

    name = "partir.origin"
    action: IntAttr
    tactic: StringAttr
    value: StringAttr

    def __init__(self, action: int, tactic: str, value: str = ""):
        super().__init__(IntAttr(action), StringAttr(tactic), StringAttr(value))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            action = parser.parse_integer(allow_boolean=False, allow_negative=False)
            parser.parse_punctuation(",")
            tactic = parser.parse_str_literal()
            value = ""
            if parser.parse_optional_punctuation(",") is not None:
                value = parser.parse_str_literal()
        return (IntAttr(action), StringAttr(tactic), StringAttr(value))

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_int(self.action.data)
            printer.print_string(", ")
            printer.print_string_literal(self.tactic.data)
            if self.value.data:
                printer.print_string(", ")
                printer.print_string_literal(self.value.data)

    def describe(self) -> str:
        what = f" of {self.value.data}" if self.value.data else ""
        return f"action {self.action.data} ({self.tactic.data}{what})"


ORIGIN = "origin"
"""The loop attribute holding its `OriginAttr`."""


class _KeyedParameters:
    """`<key = value, ...>` syntax for an attribute whose parameters are, in
    `KEYS` order, string literals, lists of them (`[...]`) or an optional
    integer (`none` or a number): the conflict and selection records."""

    KEYS: ClassVar[tuple[str, ...]]
    parameters: tuple[Attribute, ...]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        kinds = cls._kinds()
        params: list[Attribute] = []
        with parser.in_angle_brackets():
            for i, key in enumerate(cls.KEYS):
                if i:
                    parser.parse_punctuation(",")
                parser.parse_keyword(key)
                parser.parse_punctuation("=")
                kind = kinds[key]
                if kind is ArrayAttr:
                    names = parser.parse_comma_separated_list(
                        parser.Delimiter.SQUARE, parser.parse_str_literal
                    )
                    params.append(ArrayAttr(StringAttr(n) for n in names))
                elif kind is StringAttr:
                    params.append(StringAttr(parser.parse_str_literal()))
                elif parser.parse_optional_keyword("none") is not None:
                    params.append(NoneAttr())
                else:
                    number = parser.parse_integer(allow_boolean=False, allow_negative=False)
                    params.append(IntAttr(number))
        return params

    @classmethod
    def _kinds(cls) -> dict[str, type]:
        """Each key's parameter kind, read from the class's annotations."""
        hints = {k: str(v) for k, v in cls.__annotations__.items()}
        return {
            key: ArrayAttr
            if hints[key].startswith("ArrayAttr")
            else StringAttr
            if hints[key] == "StringAttr"
            else IntAttr
            for key in cls.KEYS
        }

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            for i, (key, param) in enumerate(zip(self.KEYS, self.parameters, strict=True)):
                printer.print_string(f"{', ' if i else ''}{key} = ")
                if isinstance(param, StringAttr):
                    printer.print_string_literal(param.data)
                elif isinstance(param, ArrayAttr):
                    with printer.in_square_brackets():
                        printer.print_list(param, lambda v: printer.print_string_literal(v.data))
                else:
                    printer.print_string(str(param.data) if isinstance(param, IntAttr) else "none")


@irdl_attr_definition
class ConflictAttr(_KeyedParameters, ParametrizedAttribute):
    """`#partir.conflict<op = "stablehlo.add", axis = "batch", values = ["x", "y"],
    winner = "...", loser = "...", detail = "...">`: at `op`, `values` wanted `axis`
    in incompatible ways and the earlier action won. Propagation records each
    one in the module's `CONFLICTS` list (`rewrites.conflicts` reads and writes it),
    so whichever pass ran it, later passes, the CLI and the report see them."""

    name = "partir.conflict"
    op: StringAttr
    axis: StringAttr
    values: ArrayAttr[StringAttr]
    winner: StringAttr
    loser: StringAttr
    detail: StringAttr

    KEYS: ClassVar[tuple[str, ...]] = ("op", "axis", "values", "winner", "loser", "detail")

    def __init__(
        self, op: str, axis: str, values: Sequence[str], winner: str, loser: str, detail: str
    ):
        super().__init__(
            StringAttr(op),
            StringAttr(axis),
            ArrayAttr(StringAttr(v) for v in values),
            StringAttr(winner),
            StringAttr(loser),
            StringAttr(detail),
        )


CONFLICTS = "partir.conflicts"
"""The module attribute listing propagation's `ConflictAttr`s, in the order found."""


@irdl_attr_definition
class SelectionAttr(_KeyedParameters, ParametrizedAttribute):
    """`#partir.selection<tactic = "BatchParallel(batch)", role = "data", dim = 0,
    axis = "batch", reason = "...", leaves = ["x", "y"]>`: what a tactic
    decided about some arguments or results, and why: split on `dim` over
    `axis`, or (`dim = none`, `axis = ""`) left as they are. Leaves that share
    a decision and its reason share one attribute. The tactic passes record
    them in the module's `SELECTIONS` list (`partir.selections` reads and
    writes it), so the report and `partir-inspect` say what each tactic chose
    from the IR alone. Every name is a string literal, never an identifier."""

    name = "partir.selection"
    tactic: StringAttr
    role: StringAttr
    dim: IntAttr | NoneAttr
    axis: StringAttr
    reason: StringAttr
    leaves: ArrayAttr[StringAttr]

    KEYS: ClassVar[tuple[str, ...]] = ("tactic", "role", "dim", "axis", "reason", "leaves")

    def __init__(
        self,
        tactic: str,
        role: str,
        dim: int | None,
        axis: str,
        reason: str,
        leaves: Sequence[str],
    ):
        super().__init__(
            StringAttr(tactic),
            StringAttr(role),
            NoneAttr() if dim is None else IntAttr(dim),
            StringAttr(axis),
            StringAttr(reason),
            ArrayAttr(StringAttr(leaf) for leaf in leaves),
        )

    @property
    def split_dim(self) -> int | None:
        return self.dim.data if isinstance(self.dim, IntAttr) else None


SELECTIONS = "partir.selections"
"""The module attribute listing each tactic's `SelectionAttr`s, in schedule order."""

ACTIONS = "partir.actions"
"""The module attribute counting the tiling actions taken so far (an i64
`IntegerAttr`; `rewrites.actions.take_action_numbers` owns it), so numbers stay
in schedule order across passes."""

# --------------------------------------------------------------------------
# The mesh
# --------------------------------------------------------------------------


@irdl_op_definition
class MeshOp(IRDLOperation):
    """`partir.mesh @mesh ["batch" = 4, "model" = 2]`: the named device axes.

    A module declares one mesh at its top level; every loop names one of its
    axes, and the lowering maps the axes onto a JAX mesh of the same shape.
    """

    name = "partir.mesh"

    sym_name = prop_def(StringAttr)
    axis_names = prop_def(ArrayAttr[StringAttr])
    axis_sizes = prop_def(DenseArrayBase.constr(I64))

    traits = traits_def(SymbolOpInterface(), HasParent(ModuleOp))

    def __init__(self, axes: Mapping[str, int] | Sequence[tuple[str, int]], name: str = "mesh"):
        items = list(axes.items()) if isinstance(axes, Mapping) else list(axes)
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "axis_names": ArrayAttr([StringAttr(n) for n, _ in items]),
                "axis_sizes": DenseArrayBase.from_list(i64, [s for _, s in items]),
            }
        )

    @property
    def axes(self) -> dict[str, int]:
        """Axis name -> size, in declaration order."""
        sizes = self.axis_sizes.get_values()
        return {n.data: int(s) for n, s in zip(self.axis_names.data, sizes, strict=True)}

    @property
    def mesh(self) -> Mesh:
        """The mesh value this op declares (`Mesh.single_device()` if it has no axes)."""
        axes = self.axes
        return Mesh(axes) if axes else Mesh.single_device()

    def verify_(self) -> None:
        names = [n.data for n in self.axis_names.data]
        sizes = self.axis_sizes.get_values()
        if len(names) != len(sizes):
            raise VerifyException(
                f"mesh @{self.sym_name.data} has {len(names)} axis names but {len(sizes)} sizes"
            )
        if len(set(names)) != len(names):
            raise VerifyException(f"mesh @{self.sym_name.data} repeats an axis name: {names}")
        for n, s in zip(names, sizes, strict=True):
            if s <= 0:
                raise VerifyException(f'mesh axis {quoted(n)} must have a positive size, got {s}')
        parent = self.parent_block()
        if parent is not None:
            meshes = [op for op in parent.ops if isinstance(op, MeshOp)]
            if len(meshes) > 1:
                raise VerifyException(
                    "a module declares one partir.mesh; found "
                    + ", ".join(f"@{m.sym_name.data}" for m in meshes)
                )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(" [")

        def one_axis(axis: tuple[str, int]) -> None:
            printer.print_string_literal(axis[0])
            printer.print_string(f" = {axis[1]}")

        printer.print_list(self.axes.items(), one_axis)
        printer.print_string("]")
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> MeshOp:
        name = parser.parse_symbol_name().data

        def one_axis() -> tuple[str, int]:
            axis = parser.parse_str_literal()
            parser.parse_punctuation("=")
            return axis, parser.parse_integer(allow_boolean=False, allow_negative=False)

        axes = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, one_axis)
        op = cls(axes, name)
        op.attributes |= parser.parse_optional_attr_dict()
        return op


def find_mesh(op: Operation) -> MeshOp | None:
    """The mesh declared at the top level of the module enclosing `op`."""
    module: Operation | None = op
    while module is not None and not isinstance(module, ModuleOp):
        module = module.parent_op()
    if module is None:
        return None
    for top in module.body.block.ops:
        if isinstance(top, MeshOp):
            return top
    return None


# --------------------------------------------------------------------------
# Loops, slices, yield
# --------------------------------------------------------------------------


def part_type(ty: Attribute, dim: int, parts: int) -> TensorType:
    """`ty` with dimension `dim` split into `parts` (memoised: types repeat a
    lot). Looked up by the type's identity first: hashing a type hashes its
    shape and element type, Python calls each, and the importer and this
    function share equal types, so the same few objects come back."""
    key = (id(ty), dim, parts)
    found = _PARTS_BY_ID.get(key)
    if found is not None and found[0] is ty:
        return found[1]
    part = _part_type(ty, dim, parts)
    if len(_PARTS_BY_ID) >= 65536:  # a long-lived process: stay bounded
        _PARTS_BY_ID.clear()
    _PARTS_BY_ID[key] = (ty, part)  # holds `ty`: no other object takes its id meanwhile
    return part


_PARTS_BY_ID: dict[tuple[int, int, int], tuple[Attribute, TensorType]] = {}


@lru_cache(maxsize=65536)
def _part_type(ty: TensorType, dim: int, parts: int) -> TensorType:
    shape = list(ty.get_shape())
    shape[dim] //= parts
    return tensor_type(ty.element_type, shape)


@lru_cache(maxsize=256)
def _dim_attr(dim: int) -> IntegerAttr:
    return IntegerAttr(dim, i64)


@lru_cache(maxsize=256)
def range_type(size: int) -> RangeType:
    """`!partir.range<size>`, one object per size (attributes are immutable
    values, and each loop built makes one: building verifies it)."""
    return RangeType(size)


@lru_cache(maxsize=256)
def _axis_attr(axis: str) -> StringAttr:
    return StringAttr(axis)


@irdl_op_definition
class YieldOp(IRDLOperation):
    """`partir.yield %v : T`: the value one iteration of a loop contributes."""

    name = "partir.yield"
    values = var_operand_def()

    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(LoopOp), ReturnLike(), Pure()))
    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: SSAValue | Operation):
        # Operation.__init__ directly, as `create` does: this op is built often.
        Operation.__init__(self, operands=[SSAValue.get(v) for v in values])


@irdl_op_definition
class LoopOp(IRDLOperation):
    """`partir.loop "axis" [action] (%r: !partir.range<N>) {...} : T`.

    One iteration per index of the mesh axis. `#partir.tile<d>`: the result is
    the body results concatenated along d (so the result's dim d is N times the
    body's); `#partir.sum`: their sum (same shape). The body may use values
    from outside; it sees its own part of a value only through `partir.slice`.
    """

    name = "partir.loop"

    axis = prop_def(StringAttr)
    action = prop_def(LoopAction)
    body = region_def("single_block")
    result = result_def(TensorType)

    traits = traits_def(RecursiveMemoryEffect())

    def __init__(
        self,
        axis: str | StringAttr,
        action: TileAttr | SumAttr,
        body: Region,
        result_type: Attribute,
        attributes: dict[str, Attribute] | None = None,
    ):
        Operation.__init__(
            self,
            properties={
                "axis": _axis_attr(axis) if isinstance(axis, str) else axis,
                "action": action,
            },
            regions=[body],
            result_types=[result_type],
            attributes=attributes or {},
        )

    @property
    def range_arg(self) -> BlockArgument:
        return self.body.block.args[0]

    @property
    def axis_name(self) -> str:
        return self.axis.data

    @property
    def size(self) -> int:
        range_type = self.range_arg.type
        assert isinstance(range_type, RangeType)  # the verifier checks it
        return range_type.size.data

    @property
    def origin(self) -> OriginAttr | None:
        origin = self.attributes.get(ORIGIN)
        return origin if isinstance(origin, OriginAttr) else None

    @property
    def yielded(self) -> SSAValue:
        # The terminator's operand directly: IRDL's variadic accessor is slow,
        # and propagation asks this for every operand it looks at.
        term = self.body.block.last_op
        assert term is not None
        return term.operands[0]

    def enclosing_loops(self) -> Iterator[LoopOp]:
        """The loops this one is nested in, innermost first."""
        parent = self.parent_op()
        while parent is not None:
            if isinstance(parent, LoopOp):
                yield parent
            parent = parent.parent_op()

    def verify_(self) -> None:
        axis = self.axis.data
        block = self.body.block
        if len(block.args) != 1 or not isinstance(block.args[0].type, RangeType):
            raise VerifyException(
                f'loop over {quoted(axis)} must have exactly one !partir.range block argument'
            )
        size = block.args[0].type.size.data
        mesh = find_mesh(self)
        if mesh is None:
            raise VerifyException(
                f'loop over {quoted(axis)} needs a partir.mesh declaration at the top of its module'
            )
        axes = mesh.axes
        if axis not in axes:
            known = ", ".join(quoted(a) for a in axes)
            raise VerifyException(
                f'unknown mesh axis {quoted(axis)}: mesh @{mesh.sym_name.data} declares {known}'
            )
        if size != axes[axis]:
            raise VerifyException(
                f"range size {size} of loop over {quoted(axis)} differs from the axis size "
                f"{axes[axis]}"
            )
        for outer in self.enclosing_loops():
            if outer.axis.data == axis:
                raise VerifyException(
                    f'loop over {quoted(axis)} is nested inside another loop over the same axis'
                )
        term = block.last_op
        if not isinstance(term, YieldOp) or len(term.values) != 1:
            raise VerifyException(f'loop over {quoted(axis)} must end in partir.yield of one value')
        body_t, res_t = term.values[0].type, self.result.type
        if not isinstance(body_t, TensorType) or not isinstance(res_t, TensorType):
            raise VerifyException(f'loop over {quoted(axis)} must yield a tensor')
        if body_t.element_type != res_t.element_type:
            raise VerifyException(
                f"loop over {quoted(axis)} yields {body_t} but its result is {res_t}"
            )
        if isinstance(self.action, TileAttr):
            d = self.action.dim.data
            if d >= body_t.get_num_dims():
                raise VerifyException(
                    f'loop over {quoted(axis)} tiles dim {d} of the rank-{body_t.get_num_dims()} '
                    f"value {body_t}"
                )
            want = list(body_t.get_shape())
            want[d] *= size
            if list(res_t.get_shape()) != want:
                raise VerifyException(
                    f'tile<{d}> loop over {quoted(axis)} of {body_t} gives shape '
                    f"{'x'.join(map(str, want))}, but the result is {res_t}"
                )
        elif body_t != res_t:
            raise VerifyException(
                f'sum loop over {quoted(axis)} yields {body_t} but its result is {res_t}'
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_string_literal(self.axis.data)
        printer.print_string(" [")
        printer.print_attribute(self.action)
        printer.print_string("] (")
        printer.print_block_argument(self.range_arg)
        printer.print_string(") ")
        printer.print_region(self.body, print_entry_block_args=False)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> LoopOp:
        axis = parser.parse_str_literal()
        parser.parse_punctuation("[")
        pos = parser.pos
        action = parser.parse_attribute()
        if not isinstance(action, TileAttr | SumAttr):
            parser.raise_error("expected #partir.tile<d> or #partir.sum", pos, parser.pos)
        parser.parse_punctuation("]")
        parser.parse_punctuation("(")
        arg = parser.parse_argument()
        parser.parse_punctuation(")")
        body = parser.parse_region((arg,))
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        result_type = parser.parse_type()
        return cls(axis, action, body, result_type, attrs)


class _PartOp(IRDLOperation):
    """Base of the ops that take an iteration's part of a value along a dim
    (`partir.slice`, `partir.halo_slice`): one syntax, `d %x[%r] ... : T -> S`,
    and one check of the index and the split. The range size N is implied
    by the two types, so the text does not repeat it."""

    dim = prop_def(IntegerAttr[I64])
    src = operand_def(TensorType)
    index = operand_def(RangeType)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    @property
    def dim_index(self) -> int:
        return self.dim.value.data

    @property
    def low_high(self) -> tuple[int, int]:
        """The elements read before and after the part (none for a plain slice)."""
        return (0, 0)

    @property
    def _short_name(self) -> str:
        return self.name.removeprefix("partir.")

    def verify_(self) -> None:
        d, what = self.dim_index, self._short_name
        src_t, res_t, idx_t = self.src.type, self.result.type, self.index.type
        assert isinstance(src_t, TensorType) and isinstance(res_t, TensorType)
        assert isinstance(idx_t, RangeType)
        owner = self.index.owner
        loop = owner.parent_op() if isinstance(owner, Block) else None
        if not isinstance(loop, LoopOp) or not loop.is_ancestor(self):
            raise VerifyException(f"{what} index must be the range of an enclosing partir.loop")
        if not 0 <= d < src_t.get_num_dims():
            raise VerifyException(f"{what} dim {d} is out of range for {src_t}")
        n = idx_t.size.data
        if src_t.get_shape()[d] % n:
            raise VerifyException(
                f"dim {d} of {src_t} is not divisible by the size {n} of axis "
                f"{quoted(loop.axis.data)}"
            )
        lo, hi = self.low_high
        want = list(src_t.get_shape())
        want[d] = want[d] // n + lo + hi
        if list(res_t.get_shape()) != want or res_t.element_type != src_t.element_type:
            expected = TensorType(src_t.element_type, want)
            halo = f" with halo {[lo, hi]}" if lo or hi else ""
            raise VerifyException(
                f"{what} {d} of {src_t} over {n} parts{halo} gives {expected}, "
                f"but the result is {res_t}"
            )

    def _print_halo(self, printer: Printer) -> None:
        """What a subclass prints between `[%r]` and the attributes."""

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.dim_index} ")
        printer.print_operand(self.src)
        printer.print_string("[")
        printer.print_operand(self.index)
        printer.print_string("]")
        self._print_halo(printer)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.src.type)
        printer.print_string(" -> ")
        printer.print_attribute(self.result.type)

    @classmethod
    def _parse_halo(cls, parser: Parser) -> list[int]:
        """What a subclass parses between `[%r]` and the attributes."""
        return []

    @classmethod
    def parse(cls, parser: Parser) -> _PartOp:
        what = cls.name.removeprefix("partir.")
        d = parser.parse_integer(allow_boolean=False, allow_negative=False)
        src = parser.parse_unresolved_operand()
        parser.parse_punctuation("[")
        idx = parser.parse_unresolved_operand()
        parser.parse_punctuation("]")
        halo = cls._parse_halo(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        pos = parser.pos
        src_t = parser.parse_type()
        parser.parse_punctuation("->")
        res_t = parser.parse_type()
        if not isinstance(src_t, TensorType) or not isinstance(res_t, TensorType):
            parser.raise_error(f"{cls.name} takes and gives ranked tensors", pos, parser.pos)
        src_shape, res_shape = src_t.get_shape(), res_t.get_shape()
        own = res_shape[d] - sum(halo) if d < len(res_shape) else 0
        if len(src_shape) != len(res_shape) or own <= 0 or src_shape[d] % own:
            with_halo = (f" with halo {halo}", " plus its halo") if halo else ("", "")
            parser.raise_error(
                f"{what} {d} from {src_t} to {res_t}{with_halo[0]} is not an even split "
                f"of dim {d}{with_halo[1]}",
                pos,
                parser.pos,
            )
        properties: dict[str, Attribute] = {"dim": IntegerAttr(d, i64)}
        if halo:
            properties["halo"] = DenseArrayBase.from_list(i64, halo)
        return cls.create(
            operands=[
                parser.resolve_operand(src, src_t),
                parser.resolve_operand(idx, RangeType(src_shape[d] // own)),
            ],
            result_types=[res_t],
            properties=properties,
            attributes=attrs,
        )


@irdl_op_definition
class SliceOp(_PartOp):
    """`partir.slice d %x[%r] : T -> S`: part r of N equal parts of %x along dim d.

    `%r` is the range of an enclosing loop, so each iteration (device) sees its
    own part.
    """

    name = "partir.slice"

    def __init__(self, src: SSAValue | Operation, dim: int, index: SSAValue):
        src_v = SSAValue.get(src)
        src_t, idx_t = src_v.type, index.type
        assert isinstance(src_t, TensorType) and isinstance(idx_t, RangeType)
        Operation.__init__(
            self,
            operands=[src_v, index],
            result_types=[part_type(src_t, dim, idx_t.size.data)],
            properties={"dim": _dim_attr(dim)},
        )


@irdl_op_definition
class HaloSliceOp(_PartOp):
    """`partir.halo_slice d %x[%r] halo [lo, hi] : T -> S`: part r of N equal
    parts of %x along dim d, with the `lo` elements before it and the `hi`
    after it (zeros beyond %x's edges).

    What a part of a convolution over a split spatial dim reads: its own rows
    and a halo of its neighbours' (the lowering exchanges the halos with
    `spmd.collective_permute`s).
    """

    name = "partir.halo_slice"

    halo = prop_def(DenseArrayBase.constr(i64))

    def __init__(self, src: SSAValue, dim: int, index: SSAValue, halo: tuple[int, int]):
        src_t, idx_t = src.type, index.type
        assert isinstance(src_t, TensorType) and isinstance(idx_t, RangeType)
        part = part_type(src_t, dim, idx_t.size.data)
        shape = list(part.get_shape())
        shape[dim] += sum(halo)
        Operation.__init__(
            self,
            operands=[src, index],
            result_types=[tensor_type(src_t.element_type, shape)],
            properties={"dim": _dim_attr(dim), "halo": DenseArrayBase.from_list(i64, halo)},
        )

    @property
    def low_high(self) -> tuple[int, int]:
        lo, hi = (int(v) for v in self.halo.get_values())
        return lo, hi

    def verify_(self) -> None:
        if len(self.halo.get_values()) != 2 or min(self.low_high) < 0:
            raise VerifyException(f"halo_slice halo must be [lo, hi] >= 0, got {self.halo}")
        super().verify_()
        src_t, idx_t = self.src.type, self.index.type
        assert isinstance(src_t, TensorType) and isinstance(idx_t, RangeType)
        part = src_t.get_shape()[self.dim_index] // idx_t.size.data
        if max(self.low_high) > part:
            raise VerifyException(
                f"halo_slice halo {list(self.low_high)} is wider than a part "
                f"({part} elements): it would reach past a neighbour"
            )

    def _print_halo(self, printer: Printer) -> None:
        lo, hi = self.low_high
        printer.print_string(f" halo [{lo}, {hi}]")

    @classmethod
    def _parse_halo(cls, parser: Parser) -> list[int]:
        pos = parser.pos
        parser.parse_keyword("halo")
        halo = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE,
            lambda: parser.parse_integer(allow_boolean=False, allow_negative=False),
        )
        if len(halo) != 2:
            parser.raise_error("partir.halo_slice: the halo is [lo, hi]", pos, parser.pos)
        return halo


Partir = Dialect(
    "partir",
    [MeshOp, LoopOp, SliceOp, HaloSliceOp, YieldOp],
    [RangeType, TileAttr, SumAttr, OriginAttr, ConflictAttr, SelectionAttr],
)
