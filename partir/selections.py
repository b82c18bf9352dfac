"""What each tactic selected, and why: recorded on the module, summarised per tactic.

A tactic's plan says, for every leaf it looked at, whether it splits it (the
dim and the mesh axis) or leaves it as it is, what it took the leaf for (its
role: "data", "state", "column weight", "optimizer state", ...) and why
("not returned updated; shares leading dim 8 with y"). The tactic passes
append these to the module's `partir.selections` (typed `#partir.selection`
attributes, `dialects.partir.SelectionAttr`, one per decision and reason
with the leaves it covers), which every later stage keeps,
so the report and `partir-inspect` read them from the IR text alone, as they
read the conflicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, ModuleOp

from dialects.partir import SELECTIONS, SelectionAttr


@dataclass(frozen=True)
class Selection:
    """One tactic's decision about one leaf: split `dim` over `axis`, or (dim
    None) left as it is, or (dim None, an `axis`) a result returned whole
    over `axis` (`partir.plan.ReturnedWhole`); `role` is what the tactic
    took the leaf for."""

    tactic: str
    """The tactic's label, e.g. "BatchParallel(batch)", "ZeRO-3(batch)"."""
    leaf: str
    dim: int | None
    axis: str
    role: str
    reason: str

    @property
    def split(self) -> str:
        if self.dim is None:
            return f"returned whole over {self.axis}" if self.axis else "not split"
        return f"dim {self.dim} over {self.axis}"

    def to_json(self) -> dict[str, Any]:
        return {
            "tactic": self.tactic,
            "leaf": self.leaf,
            "dim": self.dim,
            "axis": self.axis,
            "role": self.role,
            "reason": self.reason,
        }


def record_selections(module: ModuleOp, selections: Iterable[Selection]) -> None:
    """Append `selections` to the module's `partir.selections`: one attribute
    per decision and reason, naming the leaves it covers (a tactic gives one
    reason to many leaves, and an attribute costs as much to make as a page
    of names)."""
    groups: dict[tuple[str, str, int | None, str, str], list[str]] = {}
    for s in selections:
        groups.setdefault((s.tactic, s.role, s.dim, s.axis, s.reason), []).append(s.leaf)
    old = module.attributes.get(SELECTIONS)
    entries = list(old.data) if isinstance(old, ArrayAttr) else []
    entries += [SelectionAttr(*key, leaves) for key, leaves in groups.items()]
    if entries:
        module.attributes[SELECTIONS] = ArrayAttr(entries)


def recorded_selections(module: ModuleOp) -> list[Selection]:
    """The selections recorded on `module`, one per leaf: in schedule order,
    each tactic's grouped by decision and reason."""
    attr = module.attributes.get(SELECTIONS)
    if not isinstance(attr, ArrayAttr):
        return []
    return [
        Selection(
            entry.tactic.data, leaf.data, entry.split_dim, entry.axis.data, entry.role.data,
            entry.reason.data,
        )
        for entry in attr.data
        if isinstance(entry, SelectionAttr)
        for leaf in entry.leaves.data
    ]


def tactic_summaries(selections: Sequence[Selection]) -> list[tuple[str, str]]:
    """(tactic, one line) per tactic, in schedule order: how many leaves of
    each role (alphabetically) it split and on which dims, then how many it
    left as they are,
    e.g. ("BatchParallel(batch)", "2 data leaves on dim 0, 12 state leaves not split")."""
    runs: list[tuple[str, list[Selection]]] = []
    for s in selections:
        if not runs or runs[-1][0] != s.tactic:
            runs.append((s.tactic, []))
        runs[-1][1].append(s)
    return [(tactic, _summary(chosen)) for tactic, chosen in runs]


def _summary(selections: Sequence[Selection]) -> str:
    split: dict[str, list[Selection]] = {}
    whole: dict[str, list[Selection]] = {}
    for s in selections:
        (whole if s.dim is None else split).setdefault(s.role, []).append(s)
    parts = []
    for role, chosen in sorted(split.items()):
        leaves = {s.leaf for s in chosen}
        dims = sorted({s.dim for s in chosen if s.dim is not None})
        axes = sorted({s.axis for s in chosen})
        on = f"dim {dims[0]}" if len(dims) == 1 else "dims " + ", ".join(map(str, dims))
        over = f" over {', '.join(axes)}" if len(axes) > 1 else ""
        parts.append(f"{_count(len(leaves), role)} on {on}{over}")
    for role, chosen in sorted(whole.items()):
        kept = [s for s in chosen if s.axis]  # returned whole over an axis
        if kept:
            parts.append(f"{_count(len(kept), role)} returned whole")
        if len(kept) < len(chosen):
            parts.append(f"{_count(len(chosen) - len(kept), role)} not split")
    return ", ".join(parts)


def _count(n: int, role: str) -> str:
    return f"{n} {role} {'leaf' if n == 1 else 'leaves'}"
