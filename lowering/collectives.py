"""The collectives an SPMD program performs, with bytes moved per device."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation

from dialects.spmd import AllGatherOp, AllReduceOp, AllToAllOp, ReduceScatterOp

KINDS = {
    AllReduceOp: "all_reduce",
    AllGatherOp: "all_gather",
    ReduceScatterOp: "reduce_scatter",
    AllToAllOp: "all_to_all",
}


def tensor_bytes(ty: object) -> int:
    assert isinstance(ty, TensorType)
    width = ty.element_type.bitwidth if hasattr(ty.element_type, "bitwidth") else 32
    count = 1
    for n in ty.get_shape():
        count *= n
    return count * max(width, 8) // 8


@dataclass(frozen=True)
class Collective:
    """One collective: kind, mesh axes, the local shapes and bytes per device
    (the larger of what goes in and what comes out, as XLA accounts it)."""

    kind: str
    axes: tuple[str, ...]
    operand: str
    result: str
    bytes_per_device: int
    op: Operation

    def row(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "axes": list(self.axes),
            "operand": self.operand,
            "result": self.result,
            "bytes_per_device": self.bytes_per_device,
        }


def collectives(module: ModuleOp) -> list[Collective]:
    """Every communication op in `module`, in program order."""
    found = []
    for op in module.walk():
        kind = KINDS.get(type(op))
        if kind is None:
            continue
        operand, result = op.operands[0].type, op.results[0].type
        found.append(
            Collective(
                kind,
                op.axis_names,
                str(operand),
                str(result),  # type: ignore[attr-defined]
                max(tensor_bytes(operand), tensor_bytes(result)),
                op,
            )
        )
    return found
