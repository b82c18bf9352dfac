"""Distributions of values across the mesh, and the collectives between them.

A `Distribution` (dialects/distribution.py) says, for one value, per dimension
the mesh axes it is split over and the axes it is partial over: DistPar's
properties. `Redistributor` converts between them with the cheapest collective each
change needs (DistPar's table):

    P -> B  all_reduce          P -> S(d)   reduce_scatter (never all-reduce + slice)
    S -> B  all_gather          S(i) -> S(j) all_to_all    (never gather + slice)
    B -> S  local_slice (no communication)

A part with a halo (`partir.halo_slice`) takes its neighbours' edge rows by
two `collective_permute`s, one shift each way.

Conversions are made at the use that needs them and cached, so a value that
is already distributed the way a use wants costs nothing: distribute after
undistribute never appears.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, StringAttr, TensorType, i64
from xdsl.ir import Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects.distribution import Distribution
from dialects.dtypes import tensor_type
from dialects.mesh import Mesh
from dialects.partir import ORIGIN, OriginAttr, part_type
from dialects.spmd import (
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    CollectiveOp,
    CollectivePermuteOp,
    LocalSliceOp,
    ReduceScatterOp,
)
from dialects.stablehlo_ext import SliceOp

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


def _shape(value: SSAValue) -> list[int]:
    ty = value.type
    assert isinstance(ty, TensorType)  # a device's part is a tensor
    return list(ty.get_shape())


def grow_type(ty: TensorType, dim: int, factor: int) -> TensorType:
    shape = list(ty.get_shape())
    shape[dim] *= factor
    return tensor_type(ty.element_type, shape)


class Redistributor:
    """Makes the collective ops that change a value's distribution.

    `emit` inserts an op into the function being built and returns it.
    """

    def __init__(self, mesh: Mesh, emit: Callable[[Operation], Operation]):
        self.mesh = mesh
        self._emit = emit
        self._cache: dict[tuple[SSAValue, Distribution, str], Placed] = {}
        self.cause: tuple[str, tuple[tuple[str, OriginAttr], ...]] = ("", ())
        """What the next conversion is for: the op needing it, and per axis the
        action that made the value distributed (recorded on each collective:
        the origin of the axis it communicates over)."""

    def emit(self, op: CollectiveOp) -> CollectiveOp:
        needed_by, origins = self.cause
        if needed_by:
            op.attributes[NEEDED_BY] = StringAttr(needed_by)
        by_axis = dict(origins)
        origin = next((by_axis[a] for a in op.axis_names if a in by_axis), None)
        if origin is not None:
            op.attributes[ORIGIN] = origin
        self._emit(op)
        return op

    def _apply(self, placed: Placed, op: CollectiveOp) -> Placed:
        """Emit `op` on `placed`; its result, distributed as the op says."""
        self.emit(op)
        return Placed(op.results[0], op.result_distribution(placed.dist), placed.origins)

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
            whole = placed
            if whole.dist.partial:
                whole = self._apply(whole, AllReduceOp(whole.local, whole.dist.partial))
            for d, axes in enumerate(whole.dist.dims):
                if axes:
                    local_t = whole.local.type
                    assert isinstance(local_t, TensorType)  # a device's part is a tensor
                    ty = grow_type(local_t, d, self.mesh.size_of(axes))
                    whole = self._apply(whole, AllGatherOp(whole.local, d, axes, ty))
            return whole

        return self._memo(placed, "replicate", make)

    def reduce_partial(self, placed: Placed) -> Placed:
        """Sum the pending partials (P -> B on those axes); splits stay."""
        if not placed.dist.partial:
            return placed

        def make() -> Placed:
            return self._apply(placed, AllReduceOp(placed.local, placed.dist.partial))

        return self._memo(placed, "reduce", make)

    def convert(self, placed: Placed, target: Distribution) -> Placed:
        """`placed` distributed as `target` (splits only: a loop-carried value):
        a local slice where `target` only splits further, a reduce-scatter
        where it splits a dim over the axes `placed` is partial over, else
        whole first, then the device's part."""
        if placed.dist == target:
            return placed

        def make() -> Placed:
            current = placed
            dist = current.dist
            if dist.partial and not dist.axes and len(target.axes) == len(dist.partial):
                split = [d for d, axes in enumerate(target.dims) if axes]
                if len(split) == 1 and set(target.dims[split[0]]) == set(dist.partial):
                    d, axes = split[0], target.dims[split[0]]
                    ty = part_type(current.local.type, d, self.mesh.size_of(axes))
                    return self._apply(current, ReduceScatterOp(current.local, d, axes, ty))
            further = not dist.partial and all(
                want[: len(have)] == have for have, want in zip(dist.dims, target.dims, strict=True)
            )
            if not further:
                current = self.replicate(current)
            for d, want in enumerate(target.dims):
                more = want[len(current.dist.dims[d]) :]
                if more:
                    ty = part_type(current.local.type, d, self.mesh.size_of(more))
                    current = self._apply(current, LocalSliceOp(current.local, d, more, ty))
            return current

        return self._memo(placed, f"convert:{target}", make)

    @contextmanager
    def nested(self) -> Iterator[None]:
        """Conversions made inside a region are not reused after it (they do
        not dominate the ops that follow the region's op)."""
        saved = dict(self._cache)
        try:
            yield
        finally:
            self._cache = saved

    def take_part(self, placed: Placed, dim: int, axis: str) -> Placed:
        """Each device's part along `dim` over `axis` (a `partir.slice` by the
        axis's range); `axis` is iterated afterwards, so it leaves the dist."""
        dist = placed.dist
        if dist.dims[dim][:1] == (axis,):
            return Placed(placed.local, dist.with_dim(dim, dist.dims[dim][1:]), placed.origins)
        return self._memo(
            placed, f"part:{dim}:{axis}", lambda: self._move_to_part(placed, dim, axis)
        )

    def take_part_with_halo(
        self, placed: Placed, dim: int, axis: str, halo: tuple[int, int]
    ) -> Placed:
        """Each device's part along `dim` over `axis` with the last `lo`
        elements of the previous part before it and the first `hi` of the
        next after it, zeros past the ends (a `partir.halo_slice`): only the
        halos move, by a `collective_permute` each way."""
        part = self.take_part(placed, dim, axis)
        if part.dist.dims[dim]:  # split further: the neighbouring rows are elsewhere
            part = self.convert(part, part.dist.with_dim(dim, ()))

        def make() -> Placed:
            lo, hi = halo
            local = part.local
            n = _shape(local)[dim]
            last = self.mesh[axis] - 1
            pieces = [local]
            if lo:  # the previous part's last rows: each device sends its own down
                down = [(i, i + 1) for i in range(last)]
                rows = self._rows(local, dim, n - lo, n)
                pieces.insert(0, self.emit(CollectivePermuteOp(rows, (axis,), down)).results[0])
            if hi:  # the next part's first rows: each device sends its own up
                up = [(i + 1, i) for i in range(last)]
                rows = self._rows(local, dim, 0, hi)
                pieces.append(self.emit(CollectivePermuteOp(rows, (axis,), up)).results[0])
            shape = _shape(local)
            shape[dim] += lo + hi
            local_t = local.type
            assert isinstance(local_t, TensorType)
            concat = shlo.ConcatenateOp.create(
                operands=pieces,
                result_types=[tensor_type(local_t.element_type, shape)],
                properties={"dimension": IntegerAttr(dim, i64)},
            )
            self._emit(concat)
            return Placed(concat.results[0], part.dist, part.origins)

        return self._memo(part, f"halo:{dim}:{axis}:{halo}", make)

    def _rows(self, value: SSAValue, dim: int, start: int, stop: int) -> SSAValue:
        """Elements [start, stop) of `value` along `dim` (a stablehlo.slice)."""
        shape = _shape(value)
        starts, limits = [0] * len(shape), list(shape)
        starts[dim], limits[dim] = start, stop
        shape[dim] = stop - start
        ty = value.type
        assert isinstance(ty, TensorType)
        op = SliceOp.create(
            operands=[value],
            result_types=[tensor_type(ty.element_type, shape)],
            properties={
                "start_indices": DenseArrayBase.from_list(i64, starts),
                "limit_indices": DenseArrayBase.from_list(i64, limits),
                "strides": DenseArrayBase.from_list(i64, [1] * len(shape)),
            },
        )
        self._emit(op)
        return op.results[0]

    def _move_to_part(self, placed: Placed, dim: int, axis: str) -> Placed:
        """The collective that splits `dim` over `axis` (minor: the dim is not
        split yet), then the part as `take_part` gives it (the axis leaves)."""
        local, dist = placed.local, placed.dist
        parts = self.mesh[axis]
        part = part_type(local.type, dim, parts) if not dist.dims[dim] else None
        source = dist.split_dim_of(axis)
        if part is not None and axis in dist.partial:  # P -> S: reduce-scatter
            split = self._apply(placed, ReduceScatterOp(local, dim, (axis,), part))
        elif part is not None and source is not None and dist.dims[source][-1] == axis:
            # S(i) -> S(j): all-to-all moves the axis from dim i to dim j.
            ty = grow_type(part, source, parts)
            split = self._apply(placed, AllToAllOp(local, dim, source, (axis,), ty))
        elif part is not None and source is None:  # B -> S: no communication
            split = self._apply(placed, LocalSliceOp(local, dim, (axis,), part))
        else:
            # Anything else (the axis is a minor split, or the dim is split by
            # another axis): make the value whole, then take the part locally.
            whole = self.replicate(placed)
            ty = part_type(whole.local.type, dim, parts)
            split = self._apply(whole, LocalSliceOp(whole.local, dim, (axis,), ty))
        return self.take_part(split, dim, axis)
