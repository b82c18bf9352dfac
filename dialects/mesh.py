"""The mesh value: named device axes, built from a dict or a `jax.sharding.Mesh`.

The one Python model of a mesh for every stage (exported as `partir.Mesh`);
`MeshOp` (dialects/partir.py) is its IR form (`MeshOp.mesh`, `Mesh.to_op()`).
A `Mesh` reads as the ordered mapping {axis name: size} it is, so
`mesh["batch"]` is an axis's size; what is computed from the axes (device
counts of axis groups, device coordinates, a device's place in its group)
is a method here, not recomputed where it is needed.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property
from typing import Any

import numpy as np

from dialects.errors import PartirTypeError, PartirValueError


def _quoted(name: str) -> str:
    """An axis name as IR prints it: in double quotes, escaped (see `escaping`)."""
    from dialects.escaping import quoted

    return quoted(name)


def _names(axes: Mapping[str, int]) -> str:
    return ", ".join(_quoted(a) for a in axes)

Coords = dict[str, int]
"""One device's position on each mesh axis."""


class Mesh(Mapping[str, int]):
    """A logical device mesh: ordered axis names and sizes, e.g. {"batch": 4, "model": 2}.

    Tactics and loops name these axes; the lowering maps them onto a JAX mesh
    of the same shape. A `jax.sharding.Mesh` is accepted as is.
    """

    def __init__(self, axes: Mapping[str, int] | Any):
        if hasattr(axes, "axis_names") and hasattr(axes, "shape"):
            axes = {name: int(axes.shape[name]) for name in axes.axis_names}
        if not isinstance(axes, Mapping) or not axes:
            raise PartirTypeError(
                f"Mesh takes a non-empty {{axis name: size}} dict (or a jax.sharding.Mesh), "
                f"got {axes!r}; e.g. partir.Mesh({{'batch': 4, 'model': 2}})"
            )
        sizes: dict[str, int] = {}
        for name, size in axes.items():
            if not isinstance(name, str) or not name:
                raise PartirTypeError(
                    f"mesh axis names must be non-empty strings, got {name!r}; "
                    "name each axis, e.g. {'batch': 4}"
                )
            if not isinstance(size, numbers.Integral) or isinstance(size, bool | np.bool_):
                raise PartirTypeError(
                    f"mesh axis {name!r} needs an int size, got {size!r} "
                    f"({type(size).__name__}); e.g. {{{name!r}: 4}}"
                )
            if size <= 0:
                raise PartirValueError(
                    f"mesh axis {name!r} needs a positive size, got {size}; e.g. {{{name!r}: 4}}"
                )
            sizes[name] = int(size)  # a NumPy integer too (np.int64 from a shape)
        self.axes: dict[str, int] = sizes

    @classmethod
    def single_device(cls) -> Mesh:
        """The mesh with no axes: one device. Not a partitioning target (so
        `Mesh({})` is refused); it is what an unpartitioned program runs on
        (`partir.mesh @mesh []`, as the report lowers plain StableHLO)."""
        mesh = cls.__new__(cls)
        mesh.axes = {}
        return mesh

    # --- the mapping {axis: size} ----------------------------------------------

    def __getitem__(self, axis: str) -> int:
        return self.axes[axis]

    def __iter__(self) -> Iterator[str]:
        return iter(self.axes)

    def __len__(self) -> int:
        return len(self.axes)

    # --- sizes -----------------------------------------------------------------

    @property
    def size(self) -> int:
        """The number of devices."""
        return self.size_of(self.axes)

    def size_of(self, axes: Iterable[str]) -> int:
        """The number of devices in a group spanning `axes` (the product of their sizes)."""
        total = 1
        for axis in axes:
            total *= self.check_axis(axis, "Mesh.size_of")
        return total

    def distributes(self, axis: str) -> bool:
        """Whether splitting or summing over `axis` involves more than one
        device: an axis of size 1 holds everything on each device, so a
        value split or partial over it is whole there, and no collective
        over it is ever made (the SPMD lowering leaves it out of every
        distribution)."""
        return self[axis] > 1

    def check_axis(self, axis: str, who: str) -> int:
        """The size of `axis`, or a clear error naming `who` asked for it."""
        if axis not in self.axes:
            if not isinstance(axis, str):
                raise PartirTypeError(
                    f"{who}: a mesh axis is named by a string, got {axis!r} "
                    f"({type(axis).__name__}); the mesh has {_names(self.axes)}"
                )
            raise PartirValueError(
                f"{who}: unknown mesh axis {_quoted(axis)}; the mesh has {_names(self.axes)}"
            )
        return self.axes[axis]

    # --- devices ---------------------------------------------------------------

    @cached_property
    def devices(self) -> tuple[Coords, ...]:
        """Every device's coordinates, row-major over the axes (as
        `jax.sharding.Mesh` lays devices out): device i is `devices[i]`."""
        names = list(self.axes)
        ranges = (range(self.axes[a]) for a in names)
        return tuple(dict(zip(names, c, strict=True)) for c in itertools.product(*ranges))

    def group_index(self, coords: Coords, axes: Iterable[str]) -> int:
        """A device's position in its group along `axes`, major first (what
        `lax.axis_index(axes)` returns on it)."""
        index = 0
        for axis in axes:
            index = index * self.axes[axis] + coords[axis]
        return index

    def group(self, device: int, axes: Iterable[str]) -> list[int]:
        """The devices that differ from `device` only along `axes`, in group order."""
        axes = tuple(axes)
        me = self.devices[device]
        members = [
            i
            for i, c in enumerate(self.devices)
            if all(c[a] == me[a] for a in self.axes if a not in axes)
        ]
        return sorted(members, key=lambda i: self.group_index(self.devices[i], axes))

    # --- IR form and identity --------------------------------------------------

    def to_op(self):  # -> dialects.partir.MeshOp (imported late: partir.py imports this module)
        from dialects.partir import MeshOp

        return MeshOp(self)

    def __repr__(self) -> str:
        return f"Mesh({self.axes!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and list(self.axes.items()) == list(other.axes.items())

    def __hash__(self) -> int:
        return hash(tuple(self.axes.items()))
