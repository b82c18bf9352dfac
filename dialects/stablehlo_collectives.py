"""StableHLO's collectives, as JAX writes them in a nested `jax.shard_map`.

xdsl-jax 0.6 defines no collective op, so a program whose `shard_map` body
calls `jax.lax.psum`, `pmax`, `all_gather`, `psum_scatter`, `ppermute`,
`all_to_all` or `axis_index` did not parse from text (`partir-opt` said
"stablehlo.all_reduce is not registered"). These classes read and print
them in MLIR's generic form, which is how JAX prints them:

    %r = "stablehlo.all_reduce"(%x) <{channel_handle = #stablehlo.channel_handle<
           handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3]]> :
           tensor<2x2xi64>, use_global_device_ids}> ({ ^bb0(%a, %b): add }) : ...

Each names its devices by id (`replica_groups`, `source_target_pairs`:
with `use_global_device_ids`, ids row-major over JAX's mesh). An op says
which devices it combines (`device_groups`) and, for a reduction, how
(`reduction`); `dialects.manual_regions` reads a region's collectives as
partir's `spmd` ops over mesh axes, and `dialects.interpreter.device_collectives`
runs them device by device. `stablehlo.partition_id` (what `axis_index`
lowers to) is a device's id.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    AnyTensorType,
    DenseIntOrFPElementsAttr,
    IntAttr,
    IntegerAttr,
    TensorType,
    UnitAttr,
)
from xdsl.ir import Attribute, Operation, ParametrizedAttribute
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import NoMemoryEffect
from xdsl.utils.exceptions import VerifyException

from dialects.names import op_name


@irdl_attr_definition
class ChannelHandleAttr(ParametrizedAttribute):
    """`#stablehlo.channel_handle<handle = 1, type = 1>`: XLA's channel of a
    collective (partir places collectives itself, so it only keeps it)."""

    name = "stablehlo.channel_handle"
    handle: IntAttr
    channel_type: IntAttr

    def __init__(self, handle: int, channel_type: int):
        super().__init__(IntAttr(handle), IntAttr(channel_type))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        values: dict[str, int] = {}

        def field() -> None:
            key = parser.parse_identifier()
            if key not in ("handle", "type"):
                parser.raise_error(f"stablehlo.channel_handle: unknown field {key!r}")
            parser.parse_punctuation("=")
            values[key] = parser.parse_integer(allow_boolean=False)

        parser.parse_comma_separated_list(parser.Delimiter.ANGLE, field)
        return IntAttr(values.get("handle", 0)), IntAttr(values.get("type", 0))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<handle = {self.handle.data}, type = {self.channel_type.data}>")


REDUCTIONS = {"stablehlo.add": "sum", "stablehlo.maximum": "max", "stablehlo.minimum": "min"}
"""A reducer body's one op -> the reduction partir keeps (`psum`, `pmax`, `pmin`)."""


def _ids(attr: DenseIntOrFPElementsAttr) -> tuple[list[int], list[int]]:
    ty = attr.get_type()
    assert isinstance(ty, TensorType)
    return [int(v) for v in attr.get_values()], list(ty.get_shape())  # type: ignore[arg-type]


class DeviceCollectiveOp(IRDLOperation):
    """Base: a StableHLO op whose value depends on the other devices (or on
    which device runs it), so the reference interpreter runs it across the
    devices at once (`Lockstep`), never on one device's values alone."""

    def device_groups(self, devices: int) -> list[list[int]]:
        """The groups of device ids it combines (every device in one group
        when it lists none, as the spec says)."""
        attr = self.properties.get("replica_groups")
        if not isinstance(attr, DenseIntOrFPElementsAttr):
            return [list(range(devices))]
        flat, shape = _ids(attr)
        if not flat:
            return [list(range(devices))]
        width = shape[-1] if len(shape) == 2 else len(flat)
        return [[d for d in flat[i : i + width] if d >= 0] for i in range(0, len(flat), width)]

    def reduction(self) -> str | None:
        """"sum", "max" or "min" for a reducer of one such op; None for another body."""
        if not self.regions or len(self.regions[0].blocks) != 1:
            return None
        ops = [  # JAX constrains a reducer's value in a partially manual region: the identity
            op for op in self.regions[0].block.ops if op_name(op) != "sdy.sharding_constraint"
        ]
        if len(ops) != 2 or op_name(ops[1]) != "stablehlo.return":
            return None
        return REDUCTIONS.get(op_name(ops[0]))

    def int_property(self, key: str) -> int:
        found = self.properties.get(key)
        if not isinstance(found, IntegerAttr):
            raise VerifyException(f"{self.name} needs an integer {key}")
        return found.value.data


class GroupCollectiveOp(DeviceCollectiveOp):
    """Base (as xDSL's arith shares its binary ops' fields): a collective
    over groups of devices (`replica_groups`), one result per operand."""

    inputs = var_operand_def(AnyTensorType)
    results_ = var_result_def(AnyTensorType)
    replica_groups = prop_def(DenseIntOrFPElementsAttr)
    channel_handle = opt_prop_def(ChannelHandleAttr)
    traits = traits_def(NoMemoryEffect())

    def verify_(self) -> None:
        if len(self.operands) != len(self.results):
            raise VerifyException(f"{self.name}: one result per operand")


class GlobalIdsCollectiveOp(GroupCollectiveOp):
    """Base: a group collective whose groups may name global device ids
    (`use_global_device_ids`, as JAX writes them)."""

    use_global_device_ids = opt_prop_def(UnitAttr)


@irdl_op_definition
class AllReduceOp(GlobalIdsCollectiveOp):
    """`stablehlo.all_reduce`: each device gets its group's values combined
    by the reducer body (`psum`: add, `pmax`: maximum, `pmin`: minimum)."""

    name = "stablehlo.all_reduce"
    computation = region_def("single_block")


@irdl_op_definition
class ReduceScatterOp(GlobalIdsCollectiveOp):
    """`stablehlo.reduce_scatter` (`psum_scatter`): the group's values
    combined, each device keeping its block of `scatter_dimension`."""

    name = "stablehlo.reduce_scatter"
    scatter_dimension = prop_def(IntegerAttr)
    computation = region_def("single_block")


@irdl_op_definition
class AllGatherOp(GlobalIdsCollectiveOp):
    """`stablehlo.all_gather`: the group's values concatenated along `all_gather_dim`."""

    name = "stablehlo.all_gather"
    all_gather_dim = prop_def(IntegerAttr)


@irdl_op_definition
class AllToAllOp(GroupCollectiveOp):
    """`stablehlo.all_to_all`: each device splits its value into `split_count`
    blocks along `split_dimension`, sends block i to the group's i-th device,
    and concatenates what it receives along `concat_dimension`."""

    name = "stablehlo.all_to_all"
    split_dimension = prop_def(IntegerAttr)
    concat_dimension = prop_def(IntegerAttr)
    split_count = prop_def(IntegerAttr)


@irdl_op_definition
class CollectivePermuteOp(DeviceCollectiveOp):
    """`stablehlo.collective_permute` (`ppermute`): each (source, target)
    pair of device ids sends the source's value to the target; a device no
    pair targets gets zeros."""

    name = "stablehlo.collective_permute"
    operand = var_operand_def(AnyTensorType)
    result = result_def(AnyTensorType)
    source_target_pairs = prop_def(DenseIntOrFPElementsAttr)
    channel_handle = opt_prop_def(ChannelHandleAttr)
    traits = traits_def(NoMemoryEffect())

    def pairs(self) -> list[tuple[int, int]]:
        flat, _ = _ids(self.source_target_pairs)
        return list(zip(flat[::2], flat[1::2], strict=True))

    def verify_(self) -> None:
        if len(self.operand) != 1:
            raise VerifyException(f"{self.name} permutes one value")


@irdl_op_definition
class PartitionIdOp(DeviceCollectiveOp):
    """`stablehlo.partition_id`: the id of the device running it (JAX's
    `axis_index` is arithmetic on it)."""

    name = "stablehlo.partition_id"
    result = result_def(TensorType)
    traits = traits_def(NoMemoryEffect())
    assembly_format = "attr-dict `:` type($result)"


COLLECTIVE_OPS: tuple[type[Operation], ...] = (
    AllReduceOp, ReduceScatterOp, AllGatherOp, AllToAllOp, CollectivePermuteOp, PartitionIdOp,
)
"""The ops of this module, which `dialects.stablehlo_ext` adds to StableHLO."""
