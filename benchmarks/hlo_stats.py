"""Collectives and bytes per device, read from a compiled XLA program's HLO text.

Bytes per device are the larger of what a collective takes and gives (an
all-gather's result, a reduce-scatter's operand), as XLA accounts them.
Combined (tuple) collectives count each element; async pairs count once.
"""

from __future__ import annotations

import collections
import re

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_LINE = re.compile(
    r"=\s*(?P<result>.+?)\s+(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|"
    r"collective-permute)(?P<start>-start)?\("
)
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")


def _bytes(text: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * DTYPE_BYTES.get(dtype, 4)
    return total


def _group_size(line: str) -> int:
    explicit = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
    if explicit:
        return len(explicit.group(1).split(","))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
    if iota:
        return int(iota.group(2))
    return 1


def collective_stats(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count": n, "bytes": per-device bytes}} plus a "total" entry."""
    stats: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in hlo_text.splitlines():
        m = _LINE.search(line)
        if not m or "-done" in line.split("=")[0]:
            continue
        kind = m.group("kind")
        result = m.group("result")
        if m.group("start") and result.startswith("("):
            # async start ops return (operands..., results...): count the results half
            shapes = _SHAPE.findall(result)
            result = " ".join(f"{d}[{s}]" for d, s in shapes[len(shapes) // 2 :])
        size = _bytes(result)
        if kind == "reduce-scatter":
            size *= _group_size(line)
        stats[kind]["count"] += 1
        stats[kind]["bytes"] += size
        stats["total"]["count"] += 1
        stats["total"]["bytes"] += size
    return {k: dict(v) for k, v in stats.items()}


def describe(stats: dict[str, dict[str, int]]) -> str:
    short = {
        "all-reduce": "AR",
        "all-gather": "AG",
        "reduce-scatter": "RS",
        "all-to-all": "A2A",
        "collective-permute": "CP",
    }
    parts = [f"{short[k]}×{v['count']}" for k, v in sorted(stats.items()) if k != "total"]
    return " ".join(parts) or "none"
