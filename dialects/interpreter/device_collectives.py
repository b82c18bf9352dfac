"""StableHLO's collectives on NumPy arrays, every device at once.

A nested `jax.shard_map`'s body, as JAX wrote it (`partir-opt` reads it so
before `dialects.manual_regions` makes its collectives partir's `spmd` ops),
names devices by id: each group of `replica_groups` combines its members'
values, each pair of `source_target_pairs` moves one, and
`stablehlo.partition_id` is the device's own id. `Lockstep`
(`dialects.interpreter.spmd`) runs these ops through this table, with one
value per device, row-major over the mesh, as JAX numbers them.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import TensorType
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls
from xdsl.utils.exceptions import InterpretationError

from dialects.dtypes import numpy_dtype
from dialects.interpreter.group_parts import (
    GroupPart,
    Placement,
    by_group,
    combined,
    exchanged,
    gathered,
    permuted,
    scattered,
)
from dialects.stablehlo_collectives import (
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    CollectivePermuteOp,
    DeviceCollectiveOp,
    PartitionIdOp,
    ReduceScatterOp,
)


def _reduction(op: DeviceCollectiveOp) -> str:
    kind = op.reduction()
    if kind is None:
        raise InterpretationError(
            f"{op.name}: the reference interpreter combines by add, maximum or minimum, "
            "not by this body"
        )
    return kind


@register_impls
class DeviceCollectiveFunctions(InterpreterFunctions):
    """The ops of `dialects.stablehlo_collectives` on per-device values of
    `devices` devices (`dialects.interpreter.group_parts`)."""

    def __init__(self, devices: int):
        self.devices = devices

    def _placement(self, op: DeviceCollectiveOp) -> Placement:
        """Each device's group of `replica_groups` and its place in it."""
        groups = op.device_groups(self.devices)
        place = {d: (g, i) for g in groups for i, d in enumerate(g)}
        missing = [d for d in range(self.devices) if d not in place]
        if missing:
            raise InterpretationError(f"{op.name}: devices {missing} are in no replica group")
        return [place[d] for d in range(self.devices)]

    def _by_group(
        self, op: DeviceCollectiveOp, args: PythonValues, part: GroupPart
    ) -> PythonValues:
        placement = self._placement(op)
        return tuple(by_group(values, placement, part) for values in args)

    @impl(AllReduceOp)
    def run_all_reduce(
        self, interp: Interpreter, op: AllReduceOp, args: PythonValues
    ) -> PythonValues:
        return self._by_group(op, args, combined(_reduction(op)))

    @impl(ReduceScatterOp)
    def run_reduce_scatter(
        self, interp: Interpreter, op: ReduceScatterOp, args: PythonValues
    ) -> PythonValues:
        dim = op.int_property("scatter_dimension")
        return self._by_group(op, args, scattered(_reduction(op), dim))

    @impl(AllGatherOp)
    def run_all_gather(
        self, interp: Interpreter, op: AllGatherOp, args: PythonValues
    ) -> PythonValues:
        return self._by_group(op, args, gathered(op.int_property("all_gather_dim")))

    @impl(AllToAllOp)
    def run_all_to_all(
        self, interp: Interpreter, op: AllToAllOp, args: PythonValues
    ) -> PythonValues:
        split, concat = op.int_property("split_dimension"), op.int_property("concat_dimension")
        return self._by_group(op, args, exchanged(split, concat))

    @impl(CollectivePermuteOp)
    def run_collective_permute(
        self, interp: Interpreter, op: CollectivePermuteOp, args: PythonValues
    ) -> PythonValues:
        """Pairs of device ids: one group of every device, each in its own place."""
        everyone = list(range(self.devices))
        (values,) = args
        source_of = {t: s for s, t in op.pairs()}
        return (by_group(values, [(everyone, d) for d in everyone], permuted(source_of)),)

    @impl(PartitionIdOp)
    def run_partition_id(
        self, interp: Interpreter, op: PartitionIdOp, args: PythonValues
    ) -> PythonValues:
        assert isinstance(op.result.type, TensorType)
        dtype = numpy_dtype(op.result.type.element_type)
        return ([np.asarray(d, dtype) for d in range(self.devices)],)
