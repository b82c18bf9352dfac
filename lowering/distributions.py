"""Distributions of values across the mesh, and the collectives between them.

A `Distribution` (dialects/distribution.py) says, for one value, per dimension
the mesh axes it is split over and the axes it is partial over: DistPar's
properties. `Redistributor` converts between them with the cheapest collective each
change needs (DistPar's table):

    P -> B  all_reduce          P -> S(d)   reduce_scatter (never all-reduce + slice)
    S -> B  all_gather          S(i) -> S(j) all_to_all    (never gather + slice)
    B -> S  local_slice (no communication)

Conversions are made at the use that needs them and cached, so a value that
is already distributed the way a use wants costs nothing: distribute after
undistribute never appears.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from xdsl.dialects.builtin import StringAttr, TensorType
from xdsl.ir import Operation, SSAValue

from dialects.distribution import Distribution
from dialects.partir import ORIGIN, OriginAttr, part_type
from dialects.spmd import (
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    LocalSliceOp,
    ReduceScatterOp,
)

NEEDED_BY = "needed_by"
"""Collective attribute: the op whose use of a value needed the collective."""


@dataclass(frozen=True)
class Placed:
    """A core value as the devices hold it: each device's `local` part of a
    value distributed as `dist` (over the axes not iterated at its scope);
    `origins` says, per mesh axis, which action made it distributed there."""

    local: SSAValue
    dist: Distribution
    origins: tuple[tuple[str, OriginAttr], ...] = ()

    def with_origin(
        self, axis: str, origin: OriginAttr | None
    ) -> tuple[tuple[str, OriginAttr], ...]:
        """The origins, with `axis` now caused by `origin`."""
        kept = tuple((a, o) for a, o in self.origins if a != axis)
        return (*kept, (axis, origin)) if origin is not None else kept


def grow_type(ty: TensorType, dim: int, factor: int) -> TensorType:
    shape = list(ty.get_shape())
    shape[dim] *= factor
    return TensorType(ty.element_type, shape)


class Redistributor:
    """Makes the collective ops that change a value's distribution.

    `emit` inserts an op into the function being built and returns it.
    """

    def __init__(self, mesh: dict[str, int], emit: Callable[[Operation], Operation]):
        self.mesh = mesh
        self._emit = emit
        self._cache: dict[tuple[SSAValue, Distribution, str], Placed] = {}
        self.cause: tuple[str, tuple[tuple[str, OriginAttr], ...]] = ("", ())
        """What the next conversion is for: the op needing it, and per axis the
        action that made the value distributed (recorded on each collective:
        the origin of the axis it communicates over)."""

    def emit(self, op: Operation) -> Operation:
        needed_by, origins = self.cause
        if needed_by:
            op.attributes[NEEDED_BY] = StringAttr(needed_by)
        by_axis = dict(origins)
        axes = getattr(op, "axis_names", ())
        origin = next((by_axis[a] for a in axes if a in by_axis), None)
        if origin is not None:
            op.attributes[ORIGIN] = origin
        return self._emit(op)

    def _size(self, axes: tuple[str, ...]) -> int:
        n = 1
        for a in axes:
            n *= self.mesh[a]
        return n

    def _memo(self, placed: Placed, key: str, make: Callable[[], Placed]) -> Placed:
        k = (placed.local, placed.dist, key)
        if k not in self._cache:
            self._cache[k] = make()
        return self._cache[k]

    def replicate(self, placed: Placed) -> Placed:
        """The whole value on every device: all-reduce partials, gather splits."""
        if placed.dist.is_replicated:
            return placed

        def make() -> Placed:
            local, dist = placed.local, placed.dist
            if dist.partial:
                local = self.emit(AllReduceOp(local, dist.partial)).results[0]
                dist = replace(dist, partial=())
            for d, axes in enumerate(dist.dims):
                if axes:
                    ty = grow_type(local.type, d, self._size(axes))  # type: ignore[arg-type]
                    local = self.emit(AllGatherOp(local, d, axes, ty)).results[0]
                    dist = dist.with_dim(d, ())
            return Placed(local, dist, placed.origins)

        return self._memo(placed, "replicate", make)

    def reduce_partial(self, placed: Placed) -> Placed:
        """Sum the pending partials (P -> B on those axes); splits stay."""
        if not placed.dist.partial:
            return placed

        def make() -> Placed:
            op = self.emit(AllReduceOp(placed.local, placed.dist.partial))
            return Placed(op.results[0], replace(placed.dist, partial=()), placed.origins)

        return self._memo(placed, "reduce", make)

    def take_part(self, placed: Placed, dim: int, axis: str) -> Placed:
        """Each device's part along `dim` over `axis` (a `partir.slice` by the
        axis's range); `axis` is iterated afterwards, so it leaves the dist."""
        dist = placed.dist
        if dist.dims[dim][:1] == (axis,):
            return Placed(placed.local, dist.with_dim(dim, dist.dims[dim][1:]), placed.origins)
        return self._memo(
            placed, f"part:{dim}:{axis}", lambda: self._move_to_part(placed, dim, axis)
        )

    def _move_to_part(self, placed: Placed, dim: int, axis: str) -> Placed:
        local, dist = placed.local, placed.dist
        parts = self.mesh[axis]
        part = part_type(local.type, dim, parts) if not dist.dims[dim] else None  # type: ignore[arg-type]
        if part is not None and axis in dist.partial:  # P -> S: reduce-scatter
            op = self.emit(ReduceScatterOp(local, dim, (axis,), part))
            remaining = tuple(a for a in dist.partial if a != axis)
            return Placed(op.results[0], replace(dist, partial=remaining), placed.origins)
        source = dist.split_dim_of(axis)
        if part is not None and source is not None and dist.dims[source][-1] == axis:
            # S(i) -> S(j): all-to-all moves the axis from dim i to dim j.
            ty = grow_type(part, source, parts)
            op = self.emit(AllToAllOp(local, dim, source, (axis,), ty))
            return Placed(
                op.results[0], dist.with_dim(source, dist.dims[source][:-1]), placed.origins
            )
        if part is not None and source is None and axis not in dist.partial:
            op = self.emit(LocalSliceOp(local, dim, (axis,), part))  # B -> S: no communication
            return Placed(op.results[0], dist, placed.origins)
        # Anything else (the axis is a minor split, or the dim is split by
        # another axis): make the value whole, then take the part locally.
        whole = self.replicate(placed)
        ty = part_type(whole.local.type, dim, parts)  # type: ignore[arg-type]
        op = self.emit(LocalSliceOp(whole.local, dim, (axis,), ty))
        return Placed(op.results[0], whole.dist, placed.origins)
