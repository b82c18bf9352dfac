"""What each device of a collective computes from its group's values.

Two interpreters run collectives across the devices at once: partir's `spmd`
ops, whose groups run along mesh axes (`dialects.interpreter.spmd`), and
StableHLO's as JAX writes them in a nested `shard_map`, whose groups are
lists of device ids (`dialects.interpreter.device_collectives`). They differ
in how a device finds its group; what it then computes is the same, and is
here: a `GroupPart` takes the group's values (in group order) and the
device's place in the group, and `by_group` applies one to every device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

PerDevice = list[np.ndarray]
"""One value on every device, indexed by device number (`Mesh.devices`)."""

GroupPart = Callable[[list[np.ndarray], int], np.ndarray]
"""What one device computes from its group's arrays (in group order) and its place in the group."""

Placement = Sequence[tuple[Sequence[int], int]]
"""Per device: the device numbers of its group, in group order, and its place in it."""

REDUCERS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add,
    "max": np.maximum,
    "min": np.minimum,
}
"""The reductions a collective combines by (`psum`, `pmax`, `pmin`)."""


def by_group(values: PerDevice, placement: Placement, part: GroupPart) -> PerDevice:
    """Each device's result: `part` of its group's values and its place."""
    return [part([values[m] for m in group], me) for group, me in placement]


def reduced(kind: str, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays combined by `kind` left to right, in the first one's dtype."""
    total = arrays[0]
    for a in arrays[1:]:
        total = REDUCERS[kind](total, a)
    return np.asarray(total, dtype=arrays[0].dtype)


def combined(kind: str) -> GroupPart:
    """All-reduce: the group's values combined."""
    return lambda members, me: reduced(kind, members)


def scattered(kind: str, dim: int) -> GroupPart:
    """Reduce-scatter: the device's block along `dim` of the combined values."""
    return lambda members, me: np.split(reduced(kind, members), len(members), axis=dim)[me]


def gathered(dim: int) -> GroupPart:
    """All-gather: the group's values concatenated along `dim`."""
    return lambda members, me: np.concatenate(members, axis=dim)


def exchanged(split: int, concat: int) -> GroupPart:
    """All-to-all: block `me` along `split` of every member, concatenated along `concat`."""

    def part(members: list[np.ndarray], me: int) -> np.ndarray:
        return np.concatenate([np.split(m, len(members), axis=split)[me] for m in members],
                              axis=concat)

    return part


def own_block(dim: int) -> GroupPart:
    """A local slice: the device's block along `dim` of its own value."""
    return lambda members, me: np.split(members[me], len(members), axis=dim)[me]


def permuted(source_of: Mapping[int, int]) -> GroupPart:
    """Collective permute: each place gets its source's value; a place no pair targets, zeros."""

    def part(members: list[np.ndarray], me: int) -> np.ndarray:
        return members[source_of[me]] if me in source_of else np.zeros_like(members[me])

    return part
