"""One value's distribution over the mesh: DistPar's S, B and P properties.

`Distribution` is the one Python model of "how the devices hold a value" for
every stage: the SPMD lowering, the report, the interpreters and the emitter.
Per dimension it names the mesh axes the dimension is split over (major
first: S(d)); `partial` names the axes over which devices hold partial sums
(P); an axis named nowhere is replicated (B). `DTensorType` (dialects/spmd.py)
is its IR form: `DTensorType.of(global_type, distribution)` and `.distribution`
convert between them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Distribution:
    """Per-dim split axes (major first) and partial-sum axes of one value."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    @staticmethod
    def replicated(rank: int) -> Distribution:
        return Distribution(tuple(() for _ in range(rank)))

    @property
    def is_replicated(self) -> bool:
        return not self.partial and not any(self.dims)

    @property
    def axes(self) -> tuple[str, ...]:
        """Every axis the value is split or partial over (split first, by dim)."""
        return (*(a for d in self.dims for a in d), *self.partial)

    def split_dim_of(self, axis: str) -> int | None:
        return next((d for d, axes in enumerate(self.dims) if axis in axes), None)

    def with_dim(self, dim: int, axes: tuple[str, ...]) -> Distribution:
        dims = list(self.dims)
        dims[dim] = axes
        return replace(self, dims=tuple(dims))
