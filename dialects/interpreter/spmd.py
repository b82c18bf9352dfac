"""Runs an SPMD module by simulating every device of its mesh with NumPy.

Each SSA value of the per-device body is a list of arrays, one per device
(row-major over the mesh axes, as `jax.sharding.Mesh` lays devices out).
StableHLO ops run device by device through the reference interpreter;
collectives combine the devices of each group. Arguments are split into
device parts by their distributed types, and results are put back together
from them, checking that devices which the type says hold copies agree: a
wrong replication claim is an error, never a silent answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import InterpretationError

from dialects.functions import entry_function
from dialects.interpreter import _as_argument, check_implemented, make_interpreter
from dialects.partir import MeshOp, find_mesh
from dialects.spmd import (
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    DTensorType,
    FromLocalOp,
    LocalSliceOp,
    ReduceScatterOp,
    ToLocalOp,
)

Coords = dict[str, int]


class Mesh:
    """Device coordinates of a mesh, row-major over its axes."""

    def __init__(self, axes: dict[str, int]):
        self.axes = axes
        names = list(axes)
        self.devices: list[Coords] = [
            dict(zip(names, c, strict=True))
            for c in itertools.product(*(range(axes[a]) for a in names))
        ]

    def group_index(self, coords: Coords, axes: Sequence[str]) -> int:
        """This device's position in its group along `axes` (major first)."""
        index = 0
        for a in axes:
            index = index * self.axes[a] + coords[a]
        return index

    def group(self, device: int, axes: Sequence[str]) -> list[int]:
        """The devices that differ from `device` only along `axes`, in group order."""
        me = self.devices[device]
        members = [
            i
            for i, c in enumerate(self.devices)
            if all(c[a] == me[a] for a in self.axes if a not in axes)
        ]
        return sorted(members, key=lambda i: self.group_index(self.devices[i], axes))


def device_part(array: np.ndarray, dtensor: DTensorType, coords: Coords, mesh: Mesh) -> np.ndarray:
    """The part of a global array one device holds under `dtensor`."""
    part = array
    for d, axes in enumerate(dtensor.dim_axes):
        if axes:
            n = 1
            for a in axes:
                n *= mesh.axes[a]
            part = np.split(part, n, axis=d)[mesh.group_index(coords, axes)]
    return part


def assemble(parts: list[np.ndarray], dtensor: DTensorType, mesh: Mesh, what: str) -> np.ndarray:
    """The global array from device parts, checking replicas agree."""
    if dtensor.partial_axes:
        raise InterpretationError(f"{what} is a pending partial sum; it has no value yet")
    shape = tuple(dtensor.global_type.get_shape())
    out = np.empty(shape, dtype=parts[0].dtype)
    filled = np.zeros(shape, dtype=bool)
    for device, coords in enumerate(mesh.devices):
        index = []
        for d, axes in enumerate(dtensor.dim_axes):
            n = 1
            for a in axes:
                n *= mesh.axes[a]
            size = shape[d] // n
            k = mesh.group_index(coords, axes) if axes else 0
            index.append(slice(k * size, (k + 1) * size))
        region = tuple(index)
        part = parts[device]
        if filled[region].any() and not np.array_equal(out[region], part, equal_nan=True):
            raise InterpretationError(
                f"{what}: devices that should hold the same copy disagree "
                f"(device {device} at {coords}); the value is not replicated as its type says"
            )
        out[region] = part
        filled[region] = True
    return out


def _collective(op: Operation, inputs: list[np.ndarray], mesh: Mesh) -> list[np.ndarray]:
    axes = op.axis_names  # type: ignore[attr-defined]
    out = []
    for device, coords in enumerate(mesh.devices):
        members = [inputs[i] for i in mesh.group(device, axes)]
        me = mesh.group_index(coords, axes)
        n = len(members)
        if isinstance(op, AllReduceOp):
            total = members[0]
            for m in members[1:]:
                total = total + m
            out.append(np.asarray(total, dtype=members[0].dtype))
        elif isinstance(op, AllGatherOp):
            out.append(np.concatenate(members, axis=op.dim.value.data))
        elif isinstance(op, ReduceScatterOp):
            total = members[0]
            for m in members[1:]:
                total = total + m
            out.append(np.split(np.asarray(total, members[0].dtype), n, axis=op.dim.value.data)[me])
        elif isinstance(op, AllToAllOp):
            split, concat = op.split_dim.value.data, op.concat_dim.value.data
            chunks = [np.split(m, n, axis=split)[me] for m in members]
            out.append(np.concatenate(chunks, axis=concat))
        elif isinstance(op, LocalSliceOp):
            out.append(np.split(inputs[device], n, axis=op.dim.value.data)[me])
        else:
            raise InterpretationError(f"no SPMD implementation for {op.name}")
    return out


COLLECTIVE_OPS = (AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, LocalSliceOp)


def run_spmd(module: ModuleOp, args: Sequence[Any]) -> list[np.ndarray]:
    """Run the SPMD module's entry function on global `args`; global results."""
    mesh_op = find_mesh(module)
    if not isinstance(mesh_op, MeshOp):
        raise InterpretationError("the SPMD module declares no partir.mesh")
    mesh = Mesh(mesh_op.axes)
    entry = entry_function(module)
    check_implemented(entry)
    interp = make_interpreter(module)
    inputs = entry.function_type.inputs.data
    if len(args) != len(inputs):
        raise InterpretationError(f"@main takes {len(inputs)} arguments, {len(args)} were given")
    values: dict[SSAValue, list[Any]] = {}
    for i, (arg, value, ty) in enumerate(zip(entry.body.block.args, args, inputs, strict=True)):
        if not isinstance(ty, DTensorType):
            raise InterpretationError(f"argument {i} has type {ty}, not a distributed type")
        array = _as_argument(i, value, ty.global_type)
        values[arg] = [device_part(array, ty, c, mesh) for c in mesh.devices]
    for op in entry.body.block.ops:
        if isinstance(op, func.ReturnOp):
            return [
                assemble(values[v], v.type, mesh, f"result {i}")  # type: ignore[arg-type]
                for i, v in enumerate(op.arguments)
            ]
        operands = [values[v] for v in op.operands]
        if isinstance(op, ToLocalOp | FromLocalOp):
            values[op.results[0]] = operands[0]
        elif isinstance(op, COLLECTIVE_OPS):
            values[op.results[0]] = _collective(op, operands[0], mesh)
        else:
            per_device = [
                interp.run_op(op, tuple(o[d] for o in operands)) for d in range(len(mesh.devices))
            ]
            for k, result in enumerate(op.results):
                values[result] = [np.asarray(r[k]) for r in per_device]
    raise InterpretationError("the entry function has no func.return")
