"""Collectives and bytes per device, read from a compiled XLA program's HLO text.

Bytes per device are the larger of what a collective takes and gives (an
all-gather's result, a reduce-scatter's operand), as XLA accounts them.
Combined (tuple) collectives count each element; async pairs count once.
A collective inside a `while` counts once per iteration when XLA knows the
trip count (`known_trip_count`, as for `lax.scan` and `fori_loop`): the
stats are what one run of the program moves, not how often a collective is
written.
"""

from __future__ import annotations

import collections
import dataclasses
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


_COMPUTATION = re.compile(r"^(?P<entry>ENTRY )?%(?P<name>[\w.\-]+) ")
_CALLEE = re.compile(r"\b(?:body|condition|to_apply|calls)=%(?P<name>[\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"\}')


def runs_per_step(hlo_text: str) -> dict[str, int]:
    """How often each computation runs per run of the program: the entry
    once, a while's body and condition `known_trip_count` times per run of
    the computation holding the while (once when XLA does not know it)."""
    calls: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    entry = None
    current = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group("name")
            entry = current if header.group("entry") else entry
            continue
        if current is None:
            continue
        callees = _CALLEE.findall(line)
        if callees:
            trips = _TRIP_COUNT.search(line)
            times = int(trips.group("n")) if trips and " while(" in line else 1
            calls[current].extend((callee, times) for callee in callees)
    runs: dict[str, int] = collections.Counter()
    if entry is None:
        return runs

    def visit(name: str, times: int) -> None:
        runs[name] += times
        for callee, factor in calls.get(name, ()):
            visit(callee, times * factor)

    visit(entry, 1)
    return runs


def collective_stats(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count": n, "bytes": per-device bytes}} plus a "total" entry,
    per run of the program (`runs_per_step`)."""
    stats: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for c in collective_ops(hlo_text):
        for key in (c.kind, "total"):
            stats[key]["count"] += c.times
            stats[key]["bytes"] += c.bytes * c.times
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


_GROUPS = re.compile(
    r"(?:replica_groups|source_target_pairs)=\{(?P<groups>\{[\d,]*\}(?:,\{[\d,]*\})*)\}"
)


@dataclasses.dataclass(frozen=True)
class HloCollective:
    """One collective of a compiled program: its kind, per-device bytes, how
    often a run executes it, and its device groups (a collective permute's
    (source, target) pairs)."""

    kind: str
    bytes: int
    times: int
    groups: tuple[tuple[int, ...], ...]


def collective_ops(hlo_text: str) -> list[HloCollective]:
    """Every collective of `hlo_text` with its per-device bytes (the larger of
    what it takes and gives), how often a run executes it, and its explicit
    device groups; `collective_stats` sums these."""
    runs = runs_per_step(hlo_text)
    found = []
    times = 1
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            times = runs.get(header.group("name"), 1)
            continue
        m = _LINE.search(line)
        if not m or "-done" in line.split("=")[0]:
            continue
        result = m.group("result")
        if m.group("start") and result.startswith("("):
            shapes = _SHAPE.findall(result)
            result = " ".join(f"{d}[{s}]" for d, s in shapes[len(shapes) // 2 :])
        kind = m.group("kind")
        size = _bytes(result)
        if kind == "reduce-scatter":  # the larger side: its operand
            size *= _group_size(line)
        groups = _GROUPS.search(line)
        parsed = tuple(
            tuple(int(d) for d in g.split(",") if d)
            for g in re.findall(r"\{([\d,]*)\}", groups.group("groups"))
        ) if groups else ()
        found.append(HloCollective(kind, size, times, parsed))
    return found


CENSUS_OPS = ("fusion", "transpose", "copy", *KINDS)
"""The instructions `op_census` counts: kernels (fusions), the layout changes
XLA could not fold away (transposes, copies), and the collectives."""

_OPCODE = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*.+?\s(?P<op>[a-z][\w\-]*)\(")


def op_census(hlo_text: str) -> dict[str, int]:
    """How many of each of `CENSUS_OPS` a compiled program's HLO writes (in
    every computation, fused ones included; a `-start`/`-done` pair counts
    once, as its collective)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in hlo_text.splitlines():
        m = _OPCODE.match(line)
        if m is None:
            continue
        op = m.group("op").removesuffix("-start")
        if op in CENSUS_OPS:
            counts[op] += 1
    return {op: counts[op] for op in CENSUS_OPS}


def describe_census(census: dict[str, int]) -> str:
    """`F 133 T 20 C 22 AR 0`: fusions, transposes, copies, collectives."""
    collectives = sum(census[k] for k in KINDS)
    return (
        f"F {census['fusion']} T {census['transpose']} C {census['copy']} coll {collectives}"
    )
