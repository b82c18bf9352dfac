"""Rendering a report: tables as aligned plain text, rows and reports as JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rewrites.conflicts import Conflict

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Table:
    """A titled table of strings: what text renderers (plain or rich) draw."""

    title: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


class JsonReady(Protocol):
    """What `dumps` writes: a report or a diff."""

    def to_json(self) -> dict[str, Any]: ...


def render_plain(tables: Iterable[Table]) -> str:
    """Tables as aligned columns (what `partir-inspect` prints when piped)."""
    parts = []
    for t in tables:
        rows = [t.headers, *t.rows] if any(t.headers) else list(t.rows)
        widths = [max(len(r[c]) for r in rows) for c in range(len(t.headers))]
        lines = [f"== {t.title} =="]
        for k, row in enumerate(rows):
            lines.append(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
            if k == 0 and any(t.headers):
                lines.append("  ".join("-" * w for w in widths))
        if not t.rows:
            lines.append("(none)")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def dumps(data: JsonReady) -> str:
    return json.dumps(data.to_json(), indent=2)


def _counts(items: Iterable[str]) -> str:
    counts = Counter(items)
    return f" ({', '.join(f'{n} {k}' for k, n in counts.items())})" if counts else ""


def _list(items: Sequence[Any] | None) -> list[Any] | None:
    return None if items is None else list(items)


def _type_text(shape: Sequence[int] | None, dtype: str) -> str:
    if shape is None:
        return UNKNOWN
    return "x".join([*map(str, shape), dtype])


def _conflict_json(c: Conflict) -> dict[str, Any]:
    return {
        "op": c.op,
        "axis": c.axis,
        "values": list(c.values),
        "winner": c.winner,
        "loser": c.loser,
        "detail": c.detail,
    }
