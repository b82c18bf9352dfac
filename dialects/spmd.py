"""The partir SPMD dialect: one program every device runs, with explicit collectives.

The lowering turns core IR (loops over mesh axes) into a flat, per-device
function shaped like a `jax.shard_map` body:

    func.func @main(%x: !spmd.dtensor<16x32xf32, [{"batch"}, {}]>, ...) -> ... {
      %xl = spmd.to_local %x : !spmd.dtensor<16x32xf32, [{"batch"}, {}]> -> tensor<4x32xf32>
      %h = stablehlo.dot_general %xl, ... {dist = !spmd.dtensor<16x64xf32, [{"batch"}, {"model"}]>}
      %s = spmd.all_reduce %p over ["model"] : tensor<4x16xf32>
      ...
    }

Values inside the body are *local* tensors (what one device holds), so every
StableHLO op keeps its own verifier and maps to one `jax.lax` call. What the
local values mean globally is the distributed type `!spmd.dtensor<T, dims,
partial>`: the global type T; per dimension, the mesh axes it is split over
(major first, like a `PartitionSpec` entry); and the axes over which the
device values are pending partial sums. Function arguments and results have
distributed types (inputs arrive sharded, outputs leave sharded); every op in
the body carries its result's distributed type in a `dist` attribute, so the
inspection tools can report each value's global shape and S/B/P property.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseIntOrFPElementsAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Dialect, Operation, ParametrizedAttribute, SSAValue, TypeAttribute
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
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from dialects.distribution import Distribution
from dialects.dtypes import tensor_bytes, tensor_type
from dialects.escaping import quoted
from dialects.mesh import Mesh
from dialects.partir import MeshOp, find_mesh

DIST = "dist"
"""The attribute on every SPMD-body op holding its result's `DTensorType`."""

CARRIED = "carried"
"""The attribute on an SPMD `stablehlo.while` (or `optimization_barrier`)
holding, per carried value, its `DTensorType`: one distribution on entry, in
the body and on exit."""

VARYING = "varying"
"""The attribute on an SPMD loop or conditional naming mesh axes its results
differ over beyond their distributions (one list for all, or one per result):
a pipeline stage's values (each stage works on its own microbatch), which no
distribution describes."""

AxesAttr = ArrayAttr[StringAttr]


def _axes(names: Sequence[str]) -> ArrayAttr[StringAttr]:
    return _interned_axes(tuple(names))


@functools.lru_cache(maxsize=1 << 12)
def _interned_axes(names: tuple[str, ...]) -> ArrayAttr[StringAttr]:
    """One attribute per axis list (attributes are immutable values; a
    lowering names the same few lists on every collective it makes)."""
    return ArrayAttr([StringAttr(n) for n in names])


def _build(
    op: Operation,
    operands: Sequence[SSAValue],
    result_types: Sequence[Attribute],
    properties: dict[str, Attribute] | None = None,
) -> None:
    """Initialise an SPMD op from its fields as they are stored. Each op here
    has a fixed single operand (or none) and result, so IRDL's generic
    builder, which sizes variadic fields, has nothing to do and cost 2.5x
    what storing them does; the verifier checks the fields as before."""
    Operation.__init__(
        op, operands=operands, result_types=result_types, properties=properties or {}
    )


def _print_axis_set(printer: Printer, axes: Sequence[str]) -> None:
    printer.print_string("{")
    printer.print_list(axes, printer.print_string_literal)
    printer.print_string("}")


def _parse_axis_set(parser: AttrParser) -> list[str]:
    return parser.parse_comma_separated_list(parser.Delimiter.BRACES, parser.parse_str_literal)


@irdl_attr_definition
class DTensorType(ParametrizedAttribute, TypeAttribute):
    """`!spmd.dtensor<16x64xf32, [{"batch"}, {"model"}], partial {"x"}>`.

    The global type, the mesh axes each dimension is split over (major to
    minor), and the axes over which devices hold partial sums (omitted when
    empty). A dimension with no axes is replicated over every axis not named
    elsewhere (DistPar's B); a split dimension is S(d); a partial axis is P.
    """

    name = "spmd.dtensor"
    global_type: TensorType
    dims: ArrayAttr[ArrayAttr[StringAttr]]
    partial: ArrayAttr[StringAttr]

    def __init__(
        self,
        global_type: TensorType,
        dims: Sequence[Sequence[str]],
        partial: Sequence[str] = (),
    ):
        super().__init__(global_type, ArrayAttr([_axes(d) for d in dims]), _axes(sorted(partial)))

    @staticmethod
    def of(global_type: TensorType, distribution: Distribution) -> DTensorType:
        """The IR form of `distribution` for a value of `global_type` (interned)."""
        return _interned_dtensor(global_type, distribution)

    @property
    def distribution(self) -> Distribution:
        return Distribution(self.dim_axes, self.partial_axes)

    @property
    def dim_axes(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(a.data for a in d.data) for d in self.dims.data)

    @property
    def partial_axes(self) -> tuple[str, ...]:
        return tuple(a.data for a in self.partial.data)

    def verify(self) -> None:
        if len(self.dims.data) != self.global_type.get_num_dims():
            raise VerifyException(
                f"{self.global_type} has {self.global_type.get_num_dims()} dims, "
                f"but the distribution names {len(self.dims.data)}"
            )
        used = [a for d in self.dim_axes for a in d] + list(self.partial_axes)
        if len(used) != len(set(used)):
            raise VerifyException(f"a mesh axis is used twice in distribution {used}")

    def local_type(self, mesh: Mesh) -> TensorType:
        """The type one device holds."""
        shape = list(self.global_type.get_shape())
        for a in self.distribution.axes:
            if a not in mesh:
                raise VerifyException(f"unknown mesh axis {quoted(a)} in {self}")
        for d, axes in enumerate(self.dim_axes):
            for a in axes:
                if shape[d] % mesh[a]:
                    raise VerifyException(
                        f'dim {d} of {self.global_type} is not divisible over {quoted(a)} of size '
                        f"{mesh[a]}"
                    )
                shape[d] //= mesh[a]
        return tensor_type(self.global_type.element_type, shape)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            shape, element_type = parser.parse_ranked_shape()
            global_type = TensorType(element_type, shape)
            parser.parse_punctuation(",")
            dims = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: _parse_axis_set(parser)
            )
            partial: list[str] = []
            if parser.parse_optional_punctuation(",") is not None:
                parser.parse_keyword("partial")
                partial = _parse_axis_set(parser)
        return (global_type, ArrayAttr([_axes(d) for d in dims]), _axes(sorted(partial)))

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            for n in self.global_type.get_shape():
                printer.print_string(f"{n}x")
            printer.print_attribute(self.global_type.element_type)
            printer.print_string(", [")
            printer.print_list(self.dim_axes, lambda d: _print_axis_set(printer, d))
            printer.print_string("]")
            if self.partial_axes:
                printer.print_string(", partial ")
                _print_axis_set(printer, self.partial_axes)


def result_dtensors(op: Operation) -> list[DTensorType | None]:
    """The global type and distribution of each of `op`'s results, from its
    `DIST` (one result) or `CARRIED` (a loop's) attribute; None where neither
    says."""
    carried = op.attributes.get(CARRIED)
    if isinstance(carried, ArrayAttr) and len(carried.data) == len(op.results):
        return [d if isinstance(d, DTensorType) else None for d in carried.data]
    dist = op.attributes.get(DIST)
    if len(op.results) == 1 and isinstance(dist, DTensorType):
        return [dist]
    return [None] * len(op.results)


def mesh_of(op: Operation) -> Mesh:
    """The mesh of the module enclosing `op` (SPMD ops are typed against it)."""
    mesh = find_mesh(op)
    if not isinstance(mesh, MeshOp):
        raise VerifyException(f"{op.name} needs a partir.mesh declaration in its module")
    return mesh.mesh


def _group_size(op: Operation, axes: Sequence[str]) -> int:
    mesh = mesh_of(op)
    for a in axes:
        if a not in mesh:
            known = ", ".join(quoted(k) for k in mesh)
            raise VerifyException(
                f"{op.name}: unknown mesh axis {quoted(a)} (the mesh has {known})"
            )
    if len(set(axes)) != len(axes) or not axes:
        raise VerifyException(f"{op.name}: needs distinct mesh axes, got {list(axes)}")
    return mesh.size_of(axes)


def _shape(value: SSAValue | Attribute) -> list[int]:
    ty = value.type if isinstance(value, SSAValue) else value
    assert isinstance(ty, TensorType)
    return list(ty.get_shape())


class CollectiveOp(IRDLOperation):
    """Base: a communication (or local-slice) op over a group of mesh axes.

    A collective owns its meaning: `result_distribution` (how it changes its
    operand's distribution), `kind`, `communicates` and `bytes_per_device` (its
    accounting). Its NumPy meaning is an `@impl` of `SpmdFunctions`
    (dialects/interpreter/spmd.py), its JAX form one entry of
    `lowering.jax_collectives.EMITTERS`; tests/test_spmd_coverage.py checks
    that every SPMD op has all of them.
    """

    axes = prop_def(ArrayAttr[StringAttr])

    GIVES_A_DISTRIBUTED_VALUE: ClassVar[bool] = True
    """Whether the result is a distributed value (annotated with the global
    type and distribution it has); a permutation's is not: its devices hold
    other devices' parts."""

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.data for a in self.axes.data)

    @property
    def kind(self) -> str:
        """The collective's name without the dialect: "all_reduce", ..."""
        return self.name.removeprefix("spmd.")

    @property
    def communicates(self) -> bool:
        """Whether devices exchange data (a local slice does not)."""
        return True

    @property
    def bytes_per_device(self) -> int:
        """What one device moves: the larger of its part going in and coming
        out, as XLA accounts it."""
        operand, result = self.operands[0].type, self.results[0].type
        assert isinstance(operand, TensorType) and isinstance(result, TensorType)
        return max(tensor_bytes(operand), tensor_bytes(result))

    def result_distribution(self, before: Distribution) -> Distribution:
        """The distribution of the result, given the operand's."""
        raise NotImplementedError(f"{self.name} does not say how it changes a distribution")

    def _check(self, src: SSAValue, res: SSAValue, grow: int | None, shrink: int | None) -> None:
        """Result shape = source shape with dim `grow` multiplied by the group
        size and dim `shrink` divided by it (either may be None)."""
        n = _group_size(self, self.axis_names)
        want = _shape(src)
        src_t, res_t = src.type, res.type
        assert isinstance(src_t, TensorType) and isinstance(res_t, TensorType)  # by the fields
        if src_t.element_type != res_t.element_type:
            raise VerifyException(f"{self.name}: element types differ: {src.type} -> {res.type}")
        for d in (grow, shrink):
            if d is not None and not 0 <= d < len(want):
                raise VerifyException(f"{self.name}: dim {d} is out of range for {src.type}")
        if shrink is not None:
            if want[shrink] % n:
                raise VerifyException(
                    f"{self.name}: dim {shrink} of {src.type} is not divisible by the "
                    f"{n} devices of {list(self.axis_names)}"
                )
            want[shrink] //= n
        if grow is not None:
            want[grow] *= n
        if _shape(res) != want:
            expected = TensorType(src_t.element_type, want)
            raise VerifyException(
                f"{self.name} over {list(self.axis_names)}: {src.type} gives {expected}, "
                f"but the result is {res.type}"
            )


@functools.lru_cache(maxsize=256)
def _dim(d: int) -> IntegerAttr:
    return IntegerAttr(d, i64)


@functools.lru_cache(maxsize=1 << 16)
def _interned_dtensor(global_type: TensorType, distribution: Distribution) -> DTensorType:
    """One `DTensorType` per (type, distribution): attributes are immutable
    values, and building one runs xDSL's parameter checks (29% of the SPMD
    lowering's time when every op built its own)."""
    return DTensorType(global_type, distribution.dims, distribution.partial)


REDUCTIONS = ("sum", "max", "min")
"""How an all-reduce combines the group's values: `psum`, `pmax`, `pmin`."""


@irdl_op_definition
class AllReduceOp(CollectiveOp):
    """`spmd.all_reduce %v over ["model"] : T`: sum over the group (P -> B).
    `reduction "max"` (or "min") combines by maximum (minimum) instead,
    as a nested shard_map's `pmax` (`pmin`) does; partir's own partitioning
    only ever sums."""

    name = "spmd.all_reduce"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    reduction = opt_prop_def(StringAttr)
    traits = traits_def(Pure())
    assembly_format = (
        "$input `over` $axes (`reduction` $reduction^)? attr-dict `:` type($input) "
        "`->` type($result)"
    )

    def __init__(self, value: SSAValue, axes: Sequence[str], reduction: str = "sum"):
        props: dict[str, Attribute] = {"axes": _axes(axes)}
        if reduction != "sum":
            props["reduction"] = StringAttr(reduction)
        _build(self, [value], [value.type], props)

    @property
    def combines(self) -> str:
        """"sum", "max" or "min"."""
        return self.reduction.data if self.reduction is not None else "sum"

    def verify_(self) -> None:
        if self.combines not in REDUCTIONS:
            raise VerifyException(
                f"{self.name}: reduction {self.combines!r} is none of {list(REDUCTIONS)}"
            )
        self._check(self.input, self.result, None, None)

    def result_distribution(self, before: Distribution) -> Distribution:
        """The partial sums over the axes are added."""
        return before.summed(self.axis_names)


class _DimCollectiveOp(CollectiveOp):
    """Base of the collectives that act along one dimension `dim`."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    traits = traits_def(Pure())
    assembly_format = "$input `dim` $dim `over` $axes attr-dict `:` type($input) `->` type($result)"

    def __init__(self, value: SSAValue, dim: int, axes: Sequence[str], result_type: TensorType):
        _build(self, [value], [result_type], {"axes": _axes(axes), "dim": _dim(dim)})


@irdl_op_definition
class AllGatherOp(_DimCollectiveOp):
    """`spmd.all_gather %v dim 1 over ["model"]`: concatenate the parts (S(d) -> B)."""

    name = "spmd.all_gather"

    def verify_(self) -> None:
        self._check(self.input, self.result, self.dim.value.data, None)

    def result_distribution(self, before: Distribution) -> Distribution:
        """The dim is no longer split over the axes (its minor splits)."""
        return before.unsplit(self.dim.value.data, self.axis_names)


@irdl_op_definition
class ReduceScatterOp(_DimCollectiveOp):
    """`spmd.reduce_scatter %v dim 0 over ["batch"]`: sum, keep own part (P -> S(d))."""

    name = "spmd.reduce_scatter"

    def verify_(self) -> None:
        self._check(self.input, self.result, None, self.dim.value.data)

    def result_distribution(self, before: Distribution) -> Distribution:
        """The partials over the axes are added, and the dim split over them (minor)."""
        return before.summed(self.axis_names).split_further(self.dim.value.data, self.axis_names)


@irdl_op_definition
class AllToAllOp(CollectiveOp):
    """`spmd.all_to_all %v split 0 concat 1 over ["model"]` (S(concat) -> S(split))."""

    name = "spmd.all_to_all"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    split_dim = prop_def(IntegerAttr[I64])
    concat_dim = prop_def(IntegerAttr[I64])
    traits = traits_def(Pure())
    assembly_format = (
        "$input `split` $split_dim `concat` $concat_dim `over` $axes attr-dict "
        "`:` type($input) `->` type($result)"
    )

    def __init__(
        self,
        value: SSAValue,
        split_dim: int,
        concat_dim: int,
        axes: Sequence[str],
        result_type: TensorType,
    ):
        _build(
            self,
            [value],
            [result_type],
            {"axes": _axes(axes), "split_dim": _dim(split_dim), "concat_dim": _dim(concat_dim)},
        )

    def verify_(self) -> None:
        split, concat = self.split_dim.value.data, self.concat_dim.value.data
        if split == concat:
            raise VerifyException(f"{self.name}: split and concat dims are both {split}")
        self._check(self.input, self.result, concat, split)

    def result_distribution(self, before: Distribution) -> Distribution:
        """The axes move from the concat dim (its minor splits) to the split dim (minor)."""
        concat, split = self.concat_dim.value.data, self.split_dim.value.data
        return before.unsplit(concat, self.axis_names).split_further(split, self.axis_names)


@irdl_op_definition
class LocalSliceOp(_DimCollectiveOp):
    """`spmd.local_slice %v dim 0 over ["batch"]`: the device's own part, by its
    axis index; no communication (B -> S(d))."""

    name = "spmd.local_slice"

    @property
    def communicates(self) -> bool:
        return False

    def verify_(self) -> None:
        self._check(self.input, self.result, None, self.dim.value.data)

    def result_distribution(self, before: Distribution) -> Distribution:
        """The dim is split over the axes too (minor)."""
        return before.split_further(self.dim.value.data, self.axis_names)


@irdl_op_definition
class CollectivePermuteOp(CollectiveOp):
    """`spmd.collective_permute %v over ["model"] pairs dense<[[0, 1]]> : T -> T`:
    each (source, target) pair of positions in the group sends the source's
    value to the target; a device no pair targets receives zeros (as
    `lax.ppermute`). The halos of a convolution split along a spatial dim
    move this way (`partir.halo_slice`: one shift each way), as would a
    pipeline's activations."""

    name = "spmd.collective_permute"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    pairs = prop_def(DenseIntOrFPElementsAttr)
    traits = traits_def(Pure())
    assembly_format = (
        "$input `over` $axes `pairs` $pairs attr-dict `:` type($input) `->` type($result)"
    )
    GIVES_A_DISTRIBUTED_VALUE: ClassVar[bool] = False

    def __init__(self, value: SSAValue, axes: Sequence[str], pairs: Sequence[tuple[int, int]]):
        flat = [int(i) for pair in pairs for i in pair]
        super().__init__(
            operands=[value],
            result_types=[value.type],
            properties={
                "axes": _axes(axes),
                "pairs": DenseIntOrFPElementsAttr.from_list(
                    TensorType(i64, [len(pairs), 2]), flat
                ),
            },
        )

    @property
    def source_target_pairs(self) -> list[tuple[int, int]]:
        flat = [int(v) for v in self.pairs.get_values()]
        return list(zip(flat[::2], flat[1::2], strict=True))

    def verify_(self) -> None:
        n = _group_size(self, self.axis_names)
        shape = _shape(self.pairs.get_type())
        if len(shape) != 2 or shape[1] != 2:
            raise VerifyException(f"{self.name}: pairs are an Nx2 tensor, got {self.pairs}")
        pairs = self.source_target_pairs
        if any(not 0 <= i < n for pair in pairs for i in pair):
            raise VerifyException(
                f"{self.name}: pairs {pairs} name positions outside the group of {n} devices "
                f"of {list(self.axis_names)}"
            )
        for side, ends in (("source", [s for s, _ in pairs]), ("target", [t for _, t in pairs])):
            if len(set(ends)) != len(ends):
                raise VerifyException(f"{self.name}: a {side} appears twice in {pairs}")
        if self.input.type != self.result.type:
            raise VerifyException(
                f"{self.name}: {self.input.type} is permuted, but the result is {self.result.type}"
            )

    def result_distribution(self, before: Distribution) -> Distribution:
        """Laid out like the operand; each device holds its source's part."""
        return before


class _BoundaryOp(IRDLOperation):
    """Base of the ops between a distributed value and its device part."""

    input = operand_def()
    result = result_def()
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def _dtensor_and_local(self) -> tuple[DTensorType, TensorType]:
        raise NotImplementedError

    def verify_(self) -> None:
        dtensor, local = self._dtensor_and_local()
        if not isinstance(dtensor, DTensorType) or not isinstance(local, TensorType):
            raise VerifyException(f"{self.name} converts between !spmd.dtensor and tensor")
        want = dtensor.local_type(mesh_of(self))
        if want != local:
            raise VerifyException(
                f"{self.name}: the device part of {dtensor} is {want}, not {local}"
            )


@irdl_op_definition
class ToLocalOp(_BoundaryOp):
    """`spmd.to_local %x : !spmd.dtensor<..> -> tensor<..>`: this device's part."""

    name = "spmd.to_local"

    def __init__(self, value: SSAValue, local: TensorType):
        _build(self, [value], [local])

    def _dtensor_and_local(self):
        return self.input.type, self.result.type


@irdl_op_definition
class FromLocalOp(_BoundaryOp):
    """`spmd.from_local %y : tensor<..> -> !spmd.dtensor<..>`: the parts, as one value."""

    name = "spmd.from_local"

    def __init__(self, value: SSAValue, dtensor: DTensorType):
        _build(self, [value], [dtensor])

    def _dtensor_and_local(self):
        return self.result.type, self.input.type


@irdl_op_definition
class AxisIndexOp(IRDLOperation):
    """`spmd.axis_index over ["batch", "model"] : tensor<ui32>`: this device's
    position in its group along the axes (major first), as `lax.axis_index`
    gives it; over every mesh axis, the device's id (what a nested
    shard_map's `stablehlo.partition_id` is)."""

    name = "spmd.axis_index"
    axes = prop_def(ArrayAttr[StringAttr])
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "`over` $axes attr-dict `:` type($result)"

    def __init__(self, axes: Sequence[str], result_type: TensorType):
        _build(self, [], [result_type], {"axes": _axes(axes)})

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.data for a in self.axes.data)

    def verify_(self) -> None:
        _group_size(self, self.axis_names)
        if _shape(self.result):
            raise VerifyException(f"{self.name}: the index is a scalar, not {self.result.type}")


SPMD = Dialect(
    "spmd",
    [
        AllReduceOp,
        AllGatherOp,
        ReduceScatterOp,
        AllToAllOp,
        LocalSliceOp,
        CollectivePermuteOp,
        ToLocalOp,
        FromLocalOp,
        AxisIndexOp,
    ],
    [DTensorType],
)

