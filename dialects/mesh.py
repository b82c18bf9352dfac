"""The mesh value: named device axes, built from a dict or a `jax.sharding.Mesh`.

The one Python model of a mesh for every stage (exported as `partir.Mesh`);
`MeshOp` (dialects/partir.py) is its IR form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Mesh:
    """A logical device mesh: ordered axis names and sizes, e.g. {"batch": 4, "model": 2}.

    Tactics and loops name these axes; the lowering maps them onto a JAX mesh
    of the same shape. A `jax.sharding.Mesh` is accepted as is.
    """

    def __init__(self, axes: Mapping[str, int] | Any):
        if hasattr(axes, "axis_names") and hasattr(axes, "shape"):
            axes = {name: int(axes.shape[name]) for name in axes.axis_names}
        if not isinstance(axes, Mapping) or not axes:
            raise TypeError(f"Mesh takes a non-empty {{axis name: size}} dict, got {axes!r}")
        for name, size in axes.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"mesh axis names must be non-empty strings, got {name!r}")
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise ValueError(f'mesh axis "{name}" needs a positive integer size, got {size!r}')
        self.axes: dict[str, int] = dict(axes)

    @property
    def size(self) -> int:
        total = 1
        for n in self.axes.values():
            total *= n
        return total

    def check_axis(self, axis: str, who: str) -> int:
        """The size of `axis`, or a clear error naming `who` asked for it."""
        if axis not in self.axes:
            known = ", ".join(f'"{a}"' for a in self.axes)
            raise ValueError(f'{who}: unknown mesh axis "{axis}"; the mesh has {known}')
        return self.axes[axis]

    def to_op(self):  # -> dialects.partir.MeshOp (imported late: partir.py imports this module)
        from dialects.partir import MeshOp

        return MeshOp(self.axes)

    def __repr__(self) -> str:
        return f"Mesh({self.axes!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and list(self.axes.items()) == list(other.axes.items())

    def __hash__(self) -> int:
        return hash(tuple(self.axes.items()))
