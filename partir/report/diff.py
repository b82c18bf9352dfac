"""Comparing two reports: each argument's and result's sharding before and after."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from partir.report.render import Table, render_plain

if TYPE_CHECKING:
    from partir.report.model import Report


@dataclass(frozen=True)
class ShardingChange:
    """One argument or result (by `partir.name`) in two reports."""

    kind: str
    name: str
    before: str
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "before": self.before,
            "after": self.after,
            "changed": self.changed,
        }


@dataclass(frozen=True)
class Diff:
    """How the arguments' and results' shardings differ between two reports."""

    before: str
    after: str
    rows: list[ShardingChange]

    @property
    def changed(self) -> list[ShardingChange]:
        return [r for r in self.rows if r.changed]

    def table(self) -> Table:
        return Table(
            f"shardings: {self.before} -> {self.after}",
            ("", "kind", "partir.name", self.before, self.after),
            [("*" if r.changed else "", r.kind, r.name, r.before, r.after) for r in self.rows],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "before": self.before,
            "after": self.after,
            "rows": [r.to_json() for r in self.rows],
        }

    @property
    def footer(self) -> str:
        return f"{len(self.changed)} of {len(self.rows)} changed"

    def to_text(self) -> str:
        return render_plain([self.table()]) + self.footer + "\n"


ABSENT = "absent"


def diff(a: Report, b: Report, labels: tuple[str, str] | None = None) -> Diff:
    """Per argument and result, matched by `partir.name`, the sharding in each."""
    rows = []
    for kind, left, right in (
        ("argument", a.arguments, b.arguments),
        ("result", a.results, b.results),
    ):
        lmap = {v.partir_name or v.name: v.sharding for v in left}
        rmap = {v.partir_name or v.name: v.sharding for v in right}
        for name in dict.fromkeys([*lmap, *rmap]):
            rows.append(ShardingChange(kind, name, lmap.get(name, ABSENT), rmap.get(name, ABSENT)))
    before, after = labels or (a.stage, b.stage)
    return Diff(before, after, rows)
