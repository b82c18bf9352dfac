"""One value's distribution over the mesh: DistPar's S, B and P properties.

`Distribution` is the one Python model of "how the devices hold a value" for
every stage: the SPMD lowering, the report, the interpreters and the emitter.
Per dimension it names the mesh axes the dimension is split over (major
first: S(d)); `partial` names the axes over which devices hold partial sums
(P); an axis named nowhere is replicated (B). `DTensorType` (dialects/spmd.py)
is its IR form: `DTensorType.of(global_type, distribution)` and `.distribution`
convert between them. How each collective changes a distribution is the
collective op's own `result_distribution` (dialects/spmd.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dialects.mesh import Mesh

SpecEntry = str | tuple[str, ...] | None
"""One argument of a `jax.sharding.PartitionSpec`: no axis, one, or several (major first)."""


@dataclass(frozen=True)
class Distribution:
    """Per-dim split axes (major first) and partial-sum axes of one value."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    @staticmethod
    @functools.cache
    def replicated(rank: int) -> Distribution:
        return Distribution(tuple(() for _ in range(rank)))

    @property
    def is_replicated(self) -> bool:
        return not self.partial and not any(self.dims)

    @functools.cached_property
    def axes(self) -> tuple[str, ...]:
        """Every axis the value is split or partial over (split first, by dim;
        cached: the lowering and the projection ask for it per value and use)."""
        return (*(a for d in self.dims for a in d), *self.partial)

    def split_dim_of(self, axis: str) -> int | None:
        return next((d for d, axes in enumerate(self.dims) if axis in axes), None)

    # --- changes ---------------------------------------------------------------

    def with_dim(self, dim: int, axes: tuple[str, ...]) -> Distribution:
        dims = list(self.dims)
        dims[dim] = axes
        return Distribution(tuple(dims), self.partial)  # not `replace`: 3x its cost

    def split_further(self, dim: int, axes: Sequence[str]) -> Distribution:
        """`dim` also split over `axes`, as minor splits."""
        return self.with_dim(dim, (*self.dims[dim], *axes))

    def unsplit(self, dim: int, axes: Sequence[str]) -> Distribution:
        """`dim` no longer split over its `len(axes)` minor axes."""
        kept = self.dims[dim]
        return self.with_dim(dim, kept[: len(kept) - len(axes)])

    def summed(self, axes: Iterable[str]) -> Distribution:
        """No longer partial over `axes` (the partial sums over them are added)."""
        done = set(axes)
        return Distribution(self.dims, tuple(a for a in self.partial if a not in done))

    def without(self, axes: Iterable[str]) -> Distribution:
        """Neither split nor partial over `axes` (axes of one device, which
        distribute nothing: `Mesh.distributes`)."""
        gone = set(axes)
        if not gone & set(self.axes):
            return self
        return Distribution(
            tuple(tuple(a for a in d if a not in gone) for d in self.dims),
            tuple(a for a in self.partial if a not in gone),
        )

    # --- sizes -----------------------------------------------------------------

    def parts(self, mesh: Mesh) -> tuple[int, ...]:
        """Per dim, how many parts the devices split it into."""
        return tuple(mesh.size_of(axes) for axes in self.dims)

    def block_index(self, mesh: Mesh, device: int) -> tuple[int, ...]:
        """Per dim, which of its `parts` device number `device` holds."""
        coords = mesh.devices[device]
        return tuple(mesh.group_index(coords, axes) for axes in self.dims)

    # --- how it reads ----------------------------------------------------------

    def property_of(self, axis: str) -> str:
        """DistPar's property of the value on `axis`: "S(d)", "P" or "B"."""
        dim = self.split_dim_of(axis)
        if dim is not None:
            return f"S({dim})"
        return "P" if axis in self.partial else "B"

    def properties(self, axes: Iterable[str]) -> dict[str, str]:
        """`property_of` each of `axes` (a mesh's), in order."""
        return {axis: self.property_of(axis) for axis in axes}

    def describe(self, axes: Iterable[str]) -> str:
        """`batch=S(0), model=B` over the mesh `axes`; "replicated" over no axes."""
        props = self.properties(axes)
        return ", ".join(f"{a}={p}" for a, p in props.items()) if props else "replicated"

    def spec(self) -> tuple[SpecEntry, ...]:
        """The arguments of the `jax.sharding.PartitionSpec` that lays the value
        out this way: per dim None, an axis, or a tuple of axes (major first).
        Partial sums have no PartitionSpec form."""
        if self.partial:
            raise ValueError(
                f"a value partial over {list(self.partial)} has no PartitionSpec: "
                "sum it (all_reduce) first"
            )
        return tuple(None if not d else d[0] if len(d) == 1 else tuple(d) for d in self.dims)
