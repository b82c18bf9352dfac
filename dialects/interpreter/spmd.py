"""Runs an SPMD module by simulating every device of its mesh with NumPy.

Each SSA value of the per-device body is a list of arrays, one per device
(row-major over the mesh axes, as `jax.sharding.Mesh` lays devices out:
`Mesh.devices`). StableHLO ops run device by device through the reference
interpreter; the SPMD ops run on all devices at once, through the `@impl`s of
`SpmdFunctions`: a collective combines the devices of each group. Arguments are
split into device parts by their distributions, and results are put back
together from them, checking that devices which the type says hold copies
agree: a wrong replication claim is an error, never a silent answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls
from xdsl.ir import Block, Operation, SSAValue
from xdsl.traits import IsTerminator
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo

from dialects.distribution import Distribution
from dialects.dtypes import numpy_dtype
from dialects.functions import entry_function
from dialects.interpreter import _as_argument, check_implemented, make_interpreter
from dialects.interpreter.control_flow import picked_branch
from dialects.interpreter.device_collectives import DeviceCollectiveFunctions
from dialects.interpreter.group_parts import (
    GroupPart,
    PerDevice,
    by_group,
    combined,
    exchanged,
    gathered,
    own_block,
    permuted,
    scattered,
)
from dialects.manual_regions import operand_distributions, result_distributions
from dialects.mesh import Mesh
from dialects.partir import MeshOp, find_mesh
from dialects.sdy import ManualComputationOp
from dialects.spmd import (
    SPMD,
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    AxisIndexOp,
    CollectiveOp,
    CollectivePermuteOp,
    DTensorType,
    FromLocalOp,
    LocalSliceOp,
    ReduceScatterOp,
    ToLocalOp,
)
from dialects.stablehlo_collectives import DeviceCollectiveOp


def device_part(array: np.ndarray, dist: Distribution, device: int, mesh: Mesh) -> np.ndarray:
    """The part of a global array device number `device` holds under `dist`."""
    part = array
    for d, (n, k) in enumerate(zip(dist.parts(mesh), dist.block_index(mesh, device), strict=True)):
        if n > 1:
            part = np.split(part, n, axis=d)[k]
    return part


def assemble(parts: PerDevice, dtensor: DTensorType, mesh: Mesh, what: str) -> np.ndarray:
    """The global array from device parts, checking replicas agree."""
    dist = dtensor.distribution
    if dist.partial:
        raise InterpretationError(f"{what} is a pending partial sum; it has no value yet")
    shape = tuple(dtensor.global_type.get_shape())
    sizes = [n // k for n, k in zip(shape, dist.parts(mesh), strict=True)]
    out = np.empty(shape, dtype=parts[0].dtype)
    filled = np.zeros(shape, dtype=bool)
    for device, coords in enumerate(mesh.devices):
        blocks = dist.block_index(mesh, device)
        region = tuple(slice(k * n, (k + 1) * n) for k, n in zip(blocks, sizes, strict=True))
        part = parts[device]
        if filled[region].any() and not np.array_equal(out[region], part, equal_nan=True):
            raise InterpretationError(
                f"{what}: devices that should hold the same copy disagree "
                f"(device {device} at {coords}); the value is not replicated as its type says"
            )
        out[region] = part
        filled[region] = True
    return out


@register_impls
class SpmdFunctions(InterpreterFunctions):
    """The SPMD ops on per-device values (`PerDevice`) of `mesh`."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh

    def _by_group(self, op: CollectiveOp, inputs: PerDevice, part: GroupPart) -> PythonValues:
        """Each device's result: `part` of its group's inputs along the op's axes."""
        axes = op.axis_names
        placement = [
            (self.mesh.group(device, axes), self.mesh.group_index(coords, axes))
            for device, coords in enumerate(self.mesh.devices)
        ]
        return (by_group(inputs, placement, part),)

    @impl(ToLocalOp)
    def run_to_local(self, interp: Interpreter, op: ToLocalOp, args: PythonValues) -> PythonValues:
        """The parts are what the devices hold already."""
        return args

    @impl(FromLocalOp)
    def run_from_local(
        self, interp: Interpreter, op: FromLocalOp, args: PythonValues
    ) -> PythonValues:
        return args

    @impl(AllReduceOp)
    def run_all_reduce(
        self, interp: Interpreter, op: AllReduceOp, args: PythonValues
    ) -> PythonValues:
        return self._by_group(op, args[0], combined(op.combines))

    @impl(AxisIndexOp)
    def run_axis_index(
        self, interp: Interpreter, op: AxisIndexOp, args: PythonValues
    ) -> PythonValues:
        assert isinstance(op.result.type, TensorType)
        dtype = numpy_dtype(op.result.type.element_type)
        axes = op.axis_names
        return ([np.asarray(self.mesh.group_index(c, axes), dtype) for c in self.mesh.devices],)

    @impl(AllGatherOp)
    def run_all_gather(
        self, interp: Interpreter, op: AllGatherOp, args: PythonValues
    ) -> PythonValues:
        return self._by_group(op, args[0], gathered(op.dim.value.data))

    @impl(ReduceScatterOp)
    def run_reduce_scatter(
        self, interp: Interpreter, op: ReduceScatterOp, args: PythonValues
    ) -> PythonValues:
        return self._by_group(op, args[0], scattered("sum", op.dim.value.data))

    @impl(AllToAllOp)
    def run_all_to_all(
        self, interp: Interpreter, op: AllToAllOp, args: PythonValues
    ) -> PythonValues:
        split, concat = op.split_dim.value.data, op.concat_dim.value.data
        return self._by_group(op, args[0], exchanged(split, concat))

    @impl(LocalSliceOp)
    def run_local_slice(
        self, interp: Interpreter, op: LocalSliceOp, args: PythonValues
    ) -> PythonValues:
        """The device's own part of its own copy (members[me] is its input)."""
        return self._by_group(op, args[0], own_block(op.dim.value.data))

    @impl(CollectivePermuteOp)
    def run_collective_permute(
        self, interp: Interpreter, op: CollectivePermuteOp, args: PythonValues
    ) -> PythonValues:
        """Each target gets its source's value; a device no pair targets, zeros."""
        source_of = {t: s for s, t in op.source_target_pairs}
        return self._by_group(op, args[0], permuted(source_of))


def across_devices(module: ModuleOp, mesh: Mesh) -> Interpreter:
    """The interpreter of the ops that run on every device at once: the SPMD
    dialect's, and StableHLO's collectives as JAX writes them in a nested
    shard_map (`dialects.interpreter.device_collectives`)."""
    spmd = Interpreter(module)
    spmd.register_implementations(SpmdFunctions(mesh))
    spmd.register_implementations(DeviceCollectiveFunctions(mesh.size))
    return spmd


def run_spmd(module: ModuleOp, args: Sequence[Any]) -> list[np.ndarray]:
    """Run the SPMD module's entry function on global `args`; global results."""
    mesh_op = find_mesh(module)
    if not isinstance(mesh_op, MeshOp):
        raise InterpretationError("the SPMD module declares no partir.mesh")
    mesh = mesh_op.mesh
    entry = entry_function(module)
    check_implemented(entry)
    per_device = make_interpreter(module)
    spmd = across_devices(module, mesh)
    inputs = entry.function_type.inputs.data
    if len(args) != len(inputs):
        raise InterpretationError(f"@main takes {len(inputs)} arguments, {len(args)} were given")
    values: dict[SSAValue, PerDevice] = {}
    for i, (arg, value, ty) in enumerate(zip(entry.body.block.args, args, inputs, strict=True)):
        if not isinstance(ty, DTensorType):
            raise InterpretationError(f"argument {i} has type {ty}, not a distributed type")
        array = _as_argument(i, value, ty.global_type)
        dist = ty.distribution
        values[arg] = [device_part(array, dist, d, mesh) for d in range(len(mesh.devices))]
    returned, ret = Lockstep(mesh, per_device, spmd, values).run(entry.body.block)
    if not isinstance(ret, func.ReturnOp):
        raise InterpretationError("the entry function has no func.return")
    arrays = []
    for i, (v, parts) in enumerate(zip(ret.arguments, returned, strict=True)):
        assert isinstance(v.type, DTensorType)  # the entry returns from_local results
        arrays.append(assemble(parts, v.type, mesh, f"result {i}"))
    return arrays


class Lockstep:
    """Runs a block on every device, op by op, so that a collective finds
    every device's operand; a `stablehlo.while` runs its regions the same way
    (collectives inside the loop), iterating while the devices' condition,
    which must agree, holds; a `case` / `if` runs the branch they agree on."""

    def __init__(
        self,
        mesh: Mesh,
        per_device: Interpreter,
        spmd: Interpreter,
        values: dict[SSAValue, PerDevice],
    ):
        self.mesh, self.per_device, self.spmd, self.values = mesh, per_device, spmd, values

    def run(self, block: Block) -> tuple[list[PerDevice], Operation]:
        """Run `block` up to its terminator; its operands' values, and it."""
        devices = range(len(self.mesh.devices))
        for op in block.ops:
            if op.has_trait(IsTerminator):
                return [self.values[v] for v in op.operands], op
            operands = tuple(self.values[v] for v in op.operands)
            if isinstance(op, shlo.WhileOp):
                results = tuple(self._while(op, list(operands)))
            elif isinstance(op, ManualComputationOp):
                results = tuple(self._nested_region(op, list(operands)))
            elif isinstance(op, shlo.CaseOp | shlo.IfOp):
                results = tuple(self._branch(op, operands[0]))
            elif op.dialect_name() == SPMD.name or isinstance(op, DeviceCollectiveOp):
                results = self.spmd.run_op(op, operands)
            else:
                each = [self.per_device.run_op(op, tuple(o[d] for o in operands)) for d in devices]
                results = tuple([np.asarray(r[k]) for r in each] for k in range(len(op.results)))
            for result, value in zip(op.results, results, strict=True):
                self.values[result] = value
        raise InterpretationError(f"a block of {block.parent_op()} has no terminator")

    def _nested_region(self, op: ManualComputationOp, args: list[PerDevice]) -> list[PerDevice]:
        """A shard_map nested in one manual over the other axes (JAX's text,
        before `dialects.manual_regions` inlines it): each device's value cut
        to its part along the region's axes, the body run, each result put
        together along them from the devices' parts."""
        parts = [
            [device_part(value, dist, d, self.mesh) for d, value in enumerate(values)]
            for values, dist in zip(args, operand_distributions(op), strict=True)
        ]
        returned = self._region(op.body.block, parts)
        results = []
        for values, dist in zip(returned, result_distributions(op), strict=True):
            for dim, axes in enumerate(dist.dims):
                if axes:
                    values = [
                        np.concatenate([values[m] for m in self.mesh.group(d, axes)], axis=dim)
                        for d in range(len(values))
                    ]
            results.append(values)
        return results

    def _region(self, block: Block, args: list[PerDevice]) -> list[PerDevice]:
        for arg, value in zip(block.args, args, strict=True):
            self.values[arg] = value
        return self.run(block)[0]

    def _branch(self, op: shlo.CaseOp | shlo.IfOp, index: PerDevice) -> list[PerDevice]:
        """The branch each device's index (or predicate) picks
        (`control_flow.picked_branch`). Devices may pick different ones (a
        pipeline stage runs its own action): each branch picked runs on every
        device, and a device keeps its own branch's results. A collective in a
        branch then groups devices that took it, as it does on the machine, so
        long as its groups do not straddle branches."""
        picked = [int(np.asarray(i)) for i in index]
        ran = {i: self.run(picked_branch(op, i).block)[0] for i in sorted(set(picked))}
        if len(ran) == 1:
            return ran[picked[0]]
        return [
            [ran[picked[d]][r][d] for d in range(len(picked))]
            for r in range(len(op.results))
        ]

    def _while(self, op: shlo.WhileOp, carried: list[PerDevice]) -> list[PerDevice]:
        while True:
            (flags,) = self._region(op.cond.block, carried)
            go = {bool(np.asarray(f)) for f in flags}
            if len(go) != 1:
                raise InterpretationError(
                    f"{op.name}: the devices disagree on the loop condition"
                )
            if not go.pop():
                return carried
            carried = self._region(op.body.block, carried)


