"""The collectives an SPMD program performs, with bytes moved per device.

Every figure comes from the op itself (`CollectiveOp.kind`, `.communicates`,
`.bytes_per_device`), so a new collective op is counted without a table here.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp

from dialects.spmd import CollectiveOp


@dataclass(frozen=True)
class Collective:
    """One collective: kind, mesh axes, the local types and bytes per device
    (the larger of what goes in and what comes out, as XLA accounts it)."""

    kind: str
    axes: tuple[str, ...]
    operand: str
    result: str
    bytes_per_device: int
    op: CollectiveOp

    @staticmethod
    def of(op: CollectiveOp) -> Collective:
        operand, result = op.operands[0].type, op.results[0].type
        return Collective(
            op.kind, op.axis_names, str(operand), str(result), op.bytes_per_device, op
        )


def collectives(module: ModuleOp) -> list[Collective]:
    """Every op in `module` that communicates, in program order."""
    return [
        Collective.of(op)
        for op in module.walk()
        if isinstance(op, CollectiveOp) and op.communicates
    ]
