"""Conflicts: two actions that want the same mesh axis in incompatible ways.

Propagation never fails on a conflict: the earlier action (in schedule order)
wins, the loser stays as it is, and the lowering redistributes it. Each
conflict is recorded so the caller and the report can say what was given up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dialects.escaping import quoted
from dialects.partir import OriginAttr


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
