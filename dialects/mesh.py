"""The mesh value: named device axes, built from a dict or a `jax.sharding.Mesh`.

The one Python model of a mesh for every stage (exported as `partir.Mesh`);
`MeshOp` (dialects/partir.py) is its IR form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dialects.errors import PartirTypeError, PartirValueError


def _quoted(name: str) -> str:
    """An axis name as IR prints it: in double quotes, escaped (see `escaping`)."""
    from dialects.escaping import quoted

    return quoted(name)


def _names(axes: Mapping[str, int]) -> str:
    return ", ".join(_quoted(a) for a in axes)


class Mesh:
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
        for name, size in axes.items():
            if not isinstance(name, str) or not name:
                raise PartirTypeError(
                    f"mesh axis names must be non-empty strings, got {name!r}; "
                    "name each axis, e.g. {'batch': 4}"
                )
            if not isinstance(size, int) or isinstance(size, bool):
                raise PartirTypeError(
                    f"mesh axis {name!r} needs an int size, got {size!r} "
                    f"({type(size).__name__}); e.g. {{{name!r}: 4}}"
                )
            if size <= 0:
                raise PartirValueError(
                    f"mesh axis {name!r} needs a positive size, got {size}; e.g. {{{name!r}: 4}}"
                )
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
            if not isinstance(axis, str):
                raise PartirTypeError(
                    f"{who}: a mesh axis is named by a string, got {axis!r} "
                    f"({type(axis).__name__}); the mesh has {_names(self.axes)}"
                )
            raise PartirValueError(
                f"{who}: unknown mesh axis {_quoted(axis)}; the mesh has {_names(self.axes)}"
            )
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
