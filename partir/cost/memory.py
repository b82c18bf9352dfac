"""Memory per device by liveness over the flat SPMD body (`estimate_memory`):
the report's figure, and, with XLA's fusion as the cost model sees it, the
cost model's peak (`fused_peak_bytes`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Attribute, Operation, SSAValue

from dialects.dtypes import tensor_bytes
from dialects.functions import entry_function
from dialects.mesh import Mesh
from dialects.names import op_name
from dialects.partir import find_mesh
from dialects.spmd import DTensorType, FromLocalOp, ToLocalOp


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device: the arguments, and a peak estimate by liveness.

    The peak is the arguments plus the largest sum, over program order of the
    flat SPMD body, of the intermediates live at one point. A value is live
    from the op defining it to its last use; values returned stay live to the
    end; `spmd.to_local`/`spmd.from_local` only rename a buffer and add
    nothing. Every op result is counted as materialised.

    XLA's number differs: it fuses elementwise chains (most intermediates of
    a layernorm or softmax never exist in memory), reuses buffers whose
    lifetimes do not overlap in its own schedule, and may alias outputs to
    inputs. So this is an upper-bound-style figure for comparing schedules
    and tactics against each other, not a prediction of XLA's allocation;
    `partir.report.XlaMemory` holds XLA's own figures when a compiled program
    is at hand.
    """

    arguments: int
    peak_intermediates: int
    peak_at: str

    @property
    def peak(self) -> int:
        return self.arguments + self.peak_intermediates

    def to_json(self) -> dict[str, Any]:
        return {
            "arguments_bytes_per_device": self.arguments,
            "peak_intermediates_bytes_per_device": self.peak_intermediates,
            "peak_bytes_per_device": self.peak,
            "peak_at": self.peak_at,
        }


def estimate_memory(
    entry: func.FuncOp,
    bytes_of: Mapping[SSAValue, int],
    names: dict[SSAValue, str],
    materialised: Callable[[Operation], bool] | None = None,
) -> MemoryEstimate:
    """See `MemoryEstimate`: liveness over the flat SPMD body. With
    `materialised`, an op it rejects holds no buffer and its operands stay
    live until its users run (the cost model's view of XLA's fusion:
    `partir.cost.op_costs.fused`). `bytes_of` holds each value's bytes per
    device (a value it lacks holds none: not a tensor)."""
    ops = list(entry.body.block.ops)
    end = len(ops)
    position = {op: i for i, op in enumerate(ops)}
    read_at = _Reads(position, end, materialised)
    for op in reversed(ops):  # users before producers: each lookup is one level deep
        read_at(op)
    arguments = sum(bytes_of.get(a, 0) for a in entry.body.block.args)
    delta = [0] * (end + 1)
    for i, op in enumerate(ops):
        if isinstance(op, ToLocalOp | FromLocalOp):
            continue
        if materialised is not None and not materialised(op):
            continue
        for r in op.results:
            size = bytes_of.get(r)
            if size is None:
                continue
            last = max((read_at(u.operation) for u in r.uses), default=i)
            delta[i] += size
            delta[last + 1] -= size
    live, peak, peak_at = 0, 0, "no intermediates"
    for i, op in enumerate(ops):
        live += delta[i]
        if live > peak:
            peak, peak_at = live, _op_label(op, names)
    return MemoryEstimate(arguments, peak, peak_at)


class _Reads:
    """Where an op reads its operands. A fused op (one `materialised`
    rejects) runs inside its users' kernels, so it reads its operands where
    they run: a value feeding an elementwise chain that the backward pass
    recomputes stays live until then."""

    def __init__(
        self,
        position: dict[Operation, int],
        end: int,
        materialised: Callable[[Operation], bool] | None,
    ) -> None:
        self.position, self.end, self.materialised = position, end, materialised
        self.fused_reads: dict[Operation, int] = {}

    def __call__(self, user: Operation) -> int:
        if self.materialised is None or user not in self.position or self.materialised(user):
            return _last_use(user, self.position, self.end)
        found = self.fused_reads.get(user)
        if found is None:
            found = self.fused_reads[user] = max(
                (self(use.operation) for r in user.results for use in r.uses),
                default=self.position[user],
            )
        return found


def _last_use(user: Operation, position: dict[Operation, int], end: int) -> int:
    """Where a use ends: at its top-level op; a result (`from_local`) at the end."""
    while user not in position and (parent := user.parent_op()) is not None:
        user = parent
    if isinstance(user, FromLocalOp | func.ReturnOp):
        return end - 1
    return position.get(user, end - 1)


def _op_label(op: Operation, names: dict[SSAValue, str]) -> str:
    return f"{names.get(op.results[0], '?')} ({op_name(op)})" if op.results else op_name(op)


def fused_peak_bytes(module: ModuleOp, is_fused: Callable[[Operation], bool]) -> int:
    """The cost model's liveness peak of the SPMD `module`: with XLA's fusion
    as the cost model sees it, an op `is_fused` accepts holds no buffer
    (`partir.cost.op_costs.fused`, memoised by the caller). The values go
    unnamed: printing the module for its names costs more than the rest of
    an estimate (`partir.search` estimates many candidates)."""
    entry = entry_function(module)
    mesh_op = find_mesh(entry)
    mesh = mesh_op.mesh if mesh_op is not None else Mesh.single_device()
    return estimate_memory(entry, _sizes(entry, mesh), {}, lambda op: not is_fused(op)).peak


def _sizes(entry: func.FuncOp, mesh: Mesh) -> dict[SSAValue, int]:
    """Bytes per device of what the report describes (the arguments and the
    top-level results that are tensors), without describing them: one local
    type per distinct type."""

    @functools.cache
    def size(ty: Attribute) -> int | None:
        local = local_type(ty, mesh)
        return tensor_bytes(local) if isinstance(local, TensorType) else None

    values = (*entry.body.block.args, *(r for op in entry.body.block.ops for r in op.results))
    return {v: n for v in values if (n := size(v.type)) is not None}


def local_type(ty: Attribute, mesh: Mesh) -> Attribute:
    """What one device holds of a value of type `ty`."""
    return ty.local_type(mesh) if isinstance(ty, DTensorType) else ty
