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

from collections.abc import Callable

import numpy as np
from xdsl.dialects.builtin import TensorType
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls
from xdsl.utils.exceptions import InterpretationError

from dialects.dtypes import numpy_dtype
from dialects.stablehlo_collectives import (
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    CollectivePermuteOp,
    DeviceCollectiveOp,
    PartitionIdOp,
    ReduceScatterOp,
)

PerDevice = list[np.ndarray]
Combine = Callable[[list[np.ndarray], int], np.ndarray]
"""A device's result from its group's values (in group order) and its place in the group."""

_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _combined(op: DeviceCollectiveOp, members: list[np.ndarray]) -> np.ndarray:
    kind = op.reduction()
    if kind is None:
        raise InterpretationError(
            f"{op.name}: the reference interpreter combines by add, maximum or minimum, "
            "not by this body"
        )
    total = members[0]
    for m in members[1:]:
        total = _REDUCE[kind](total, m)
    return np.asarray(total, dtype=members[0].dtype)


@register_impls
class DeviceCollectiveFunctions(InterpreterFunctions):
    """The ops of `dialects.stablehlo_collectives` on per-device values of
    `devices` devices."""

    def __init__(self, devices: int):
        self.devices = devices

    def _by_group(self, op: DeviceCollectiveOp, args: PythonValues, part: Combine) -> PythonValues:
        groups = op.device_groups(self.devices)
        place = {d: (g, i) for g in groups for i, d in enumerate(g)}
        missing = [d for d in range(self.devices) if d not in place]
        if missing:
            raise InterpretationError(f"{op.name}: devices {missing} are in no replica group")
        results = []
        for values in args:
            results.append(
                [part([values[m] for m in place[d][0]], place[d][1]) for d in range(self.devices)]
            )
        return tuple(results)

    @impl(AllReduceOp)
    def run_all_reduce(
        self, interp: Interpreter, op: AllReduceOp, args: PythonValues
    ) -> PythonValues:
        return self._by_group(op, args, lambda members, me: _combined(op, members))

    @impl(ReduceScatterOp)
    def run_reduce_scatter(
        self, interp: Interpreter, op: ReduceScatterOp, args: PythonValues
    ) -> PythonValues:
        dim = op.int_property("scatter_dimension")

        def part(members: list[np.ndarray], me: int) -> np.ndarray:
            return np.split(_combined(op, members), len(members), axis=dim)[me]

        return self._by_group(op, args, part)

    @impl(AllGatherOp)
    def run_all_gather(
        self, interp: Interpreter, op: AllGatherOp, args: PythonValues
    ) -> PythonValues:
        dim = op.int_property("all_gather_dim")
        return self._by_group(op, args, lambda members, me: np.concatenate(members, axis=dim))

    @impl(AllToAllOp)
    def run_all_to_all(
        self, interp: Interpreter, op: AllToAllOp, args: PythonValues
    ) -> PythonValues:
        split, concat = op.int_property("split_dimension"), op.int_property("concat_dimension")

        def part(members: list[np.ndarray], me: int) -> np.ndarray:
            blocks = [np.split(m, len(members), axis=split)[me] for m in members]
            return np.concatenate(blocks, axis=concat)

        return self._by_group(op, args, part)

    @impl(CollectivePermuteOp)
    def run_collective_permute(
        self, interp: Interpreter, op: CollectivePermuteOp, args: PythonValues
    ) -> PythonValues:
        source_of = {t: s for s, t in op.pairs()}
        (values,) = args
        return (
            [
                values[source_of[d]] if d in source_of else np.zeros_like(values[d])
                for d in range(self.devices)
            ],
        )

    @impl(PartitionIdOp)
    def run_partition_id(
        self, interp: Interpreter, op: PartitionIdOp, args: PythonValues
    ) -> PythonValues:
        assert isinstance(op.result.type, TensorType)
        dtype = numpy_dtype(op.result.type.element_type)
        return ([np.asarray(d, dtype) for d in range(self.devices)],)
