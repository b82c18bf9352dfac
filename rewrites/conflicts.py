"""Conflicts: two actions that want the same mesh axis in incompatible ways.

Propagation never fails on a conflict: the earlier action (in schedule order)
wins, the loser stays as it is, and the lowering redistributes it. Each
conflict is recorded so the caller and the report can say what was given up:
in a `ConflictLog` while rewriting, then on the module as typed
`#partir.conflict` attributes (`record_conflicts`), which every later pass,
the CLI and the report read back with `recorded_conflicts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.builtin import ArrayAttr, ModuleOp

from dialects.escaping import quoted
from dialects.partir import CONFLICTS, ConflictAttr, OriginAttr


def describe_origin(origin: OriginAttr | None) -> str:
    return origin.describe() if origin is not None else "an unrecorded action"


@dataclass(frozen=True)
class Conflict:
    """At `op`, `values` wanted `axis` on dims that run over different factors."""

    op: str
    values: tuple[str, ...]
    axis: str
    winner: str
    loser: str
    detail: str

    def __str__(self) -> str:
        return (
            f'{self.op} on axis {quoted(self.axis)}: {self.winner} wins over {self.loser} '
            f"({', '.join(self.values)}): {self.detail}"
        )

    def to_attr(self) -> ConflictAttr:
        return ConflictAttr(self.op, self.axis, self.values, self.winner, self.loser, self.detail)

    @staticmethod
    def of(attr: ConflictAttr) -> Conflict:
        return Conflict(
            attr.op.data,
            tuple(v.data for v in attr.values.data),
            attr.axis.data,
            attr.winner.data,
            attr.loser.data,
            attr.detail.data,
        )


@dataclass
class ConflictLog:
    """Conflicts in the order found, without repeats."""

    conflicts: list[Conflict] = field(default_factory=list)

    @staticmethod
    def value_of(origin: OriginAttr | None, fallback: str) -> str:
        """The name of the value an action tiled (else `fallback`)."""
        return origin.value.data if origin is not None and origin.value.data else fallback

    def record(self, conflict: Conflict) -> None:
        if conflict not in self.conflicts:
            self.conflicts.append(conflict)


def record_conflicts(module: ModuleOp, conflicts: list[Conflict]) -> None:
    """Append `conflicts` to the module's `partir.conflicts`, without repeats."""
    old = module.attributes.get(CONFLICTS)
    entries = list(old.data) if isinstance(old, ArrayAttr) else []
    for conflict in conflicts:
        attr = conflict.to_attr()
        if attr not in entries:
            entries.append(attr)
    if entries:
        module.attributes[CONFLICTS] = ArrayAttr(entries)


def recorded_conflicts(module: ModuleOp) -> list[Conflict]:
    """The conflicts recorded on `module`, in the order found."""
    attr = module.attributes.get(CONFLICTS)
    if not isinstance(attr, ArrayAttr):
        return []
    return [Conflict.of(entry) for entry in attr.data if isinstance(entry, ConflictAttr)]
