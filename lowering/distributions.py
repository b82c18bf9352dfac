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
undistribute never appears. A partial sum is summed once, whichever uses
read it: a use that wants it split after another summed it whole takes its
part of the sum (no reduce-scatter), and a use that wants it whole after
another reduce-scattered it all-gathers the parts (no second all-reduce);
a loss-scaled step's gradients, read whole by the `isfinite` check and split
by ZeRO's update, move what plain data parallelism moves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, StringAttr, TensorType, i64
from xdsl.ir import Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects.distribution import Distribution
from dialects.dtypes import tensor_bytes, tensor_type
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
from rewrites.padding import splat

NEEDED_BY = "needed_by"
"""Collective attribute: the op whose use of a value needed the collective."""


class Placed(NamedTuple):
    """A core value as the devices hold it: each device's `local` part of a
    value distributed as `dist` (over the axes not iterated at its scope);
    `origins` says, per mesh axis, which action made it distributed there.
    (A named tuple: the lowering makes one per value, and a frozen
    dataclass's `__init__` was a tenth of its own work.)"""

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


_SEARCH_DEPTH = 32

Remake = Callable[[list[SSAValue]], SSAValue]
"""Emits a carried linear op again on the given (whole) operands."""


def _bytes(value: SSAValue) -> int:
    ty = value.type
    assert isinstance(ty, TensorType)  # a device's part is a tensor
    return tensor_bytes(ty)


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
        self._sums: dict[tuple[SSAValue, tuple[str, ...]], SSAValue] = {}
        """Each device's values summed over axes, per local value: a loop's
        result and the parts its users slice share one local value, so they
        share its all-reduce, however their dims are described."""
        self._linear: dict[SSAValue, tuple[list[Placed], Remake]] = {}
        """Partial sums computed by a linear op from partial sums (`carried`)."""
        self._scattered: dict[tuple[SSAValue, tuple[str, ...]], tuple[Placed, int]] = {}
        """Partial sums over one axis a reduce-scatter summed, per local value:
        the scattered parts and their dim (a whole use all-gathers them)."""
        self._sliced_from: dict[tuple[SSAValue, Distribution], Placed] = {}
        """Per device's part a local slice took (its local value and
        distribution: one local value may stand for several values, a
        reshape's operand and result), the value it took it from (a part
        gathered back is that value: `_unsliced`)."""
        self.emitted: list[CollectiveOp] = []
        """Every collective emitted, in order (the lowering annotates them)."""
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
        self.emitted.append(op)
        return op

    def _apply(self, placed: Placed, op: CollectiveOp) -> Placed:
        """Emit `op` on `placed`; its result, distributed as the op says."""
        self.emit(op)
        result = Placed(op.results[0], op.result_distribution(placed.dist), placed.origins)
        if isinstance(op, LocalSliceOp):
            self._sliced_from[result.local, result.dist] = placed
        return result

    def _unsliced(self, placed: Placed, target: Distribution) -> Placed:
        """The value `placed`'s local slices were taken from, where that is
        distributed as `target` (a loop body that slices a carried value and
        carries it whole again gathers nothing), else `placed`."""
        source = placed
        while source.dist != target and (
            up := self._sliced_from.get((source.local, source.dist))
        ) is not None:
            source = up
        return source if source.dist == target else placed

    def _memo(self, placed: Placed, key: str, make: Callable[[], Placed]) -> Placed:
        k = (placed.local, placed.dist, key)
        if k not in self._cache:
            self._cache[k] = make()
        return self._cache[k]

    def has_whole(self, placed: Placed) -> bool:
        """Whether `placed`'s partial sums were already added (its all-reduce is paid)."""
        return (placed.local, placed.dist.partial) in self._sums

    def carried(self, local: SSAValue, operands: list[Placed], remake: Remake) -> None:
        """Record that the partial sum `local` is a linear op on `operands`,
        some of them partial sums over the same axes: `remake` emits that op
        again on whole operands. Summing `local` may then sum those instead
        and remake the op (`_all_reduce`), where that moves fewer bytes."""
        self._linear[local] = (operands, remake)

    def _all_reduce(self, placed: Placed) -> Placed:
        """P -> B on every pending axis, once per local value: an all-reduce
        of it, or, for a partial sum a linear op carried (`carried`), the op
        remade on its operands' sums when those cost no more bytes (some may
        be paid already: a gradient summed once for every update that scales
        it); ties go to the operands, whose sums others may share."""
        key = (placed.local, placed.dist.partial)
        if key not in self._sums:
            self._sums[key] = self._summed(placed)
        return Placed(self._sums[key], placed.dist.summed(placed.dist.partial), placed.origins)

    def _summed(self, placed: Placed) -> SSAValue:
        scattered = self._scattered.get((placed.local, placed.dist.partial))
        if scattered is not None:  # summed already, in parts: gather them
            split, dim = scattered
            ty = placed.local.type
            assert isinstance(ty, TensorType)  # a device's part is a tensor
            gather = AllGatherOp(split.local, dim, split.dist.dims[dim], ty)
            return self._apply(split, gather).local
        linear = self._remakeable(placed)
        if linear is not None:
            operands, remake = linear
            axes = next(p.dist.partial for p in operands if p.dist.partial)
            rest = tuple(a for a in placed.dist.partial if a not in axes)
            own = _bytes(placed.local)
            if self._sum_bytes(placed, {}, 0) + (own if rest else 0) <= own:
                local = remake(
                    [self._all_reduce(p).local if p.dist.partial else p.local for p in operands]
                )
                if rest:  # a sum loop around the op: its axes are summed after
                    local = self.emit(AllReduceOp(local, rest)).results[0]
                return local
        return self.emit(AllReduceOp(placed.local, placed.dist.partial)).results[0]

    def _remakeable(self, placed: Placed) -> tuple[list[Placed], Remake] | None:
        """How `placed` was carried, if its operands were partial over some of
        its pending axes (a sum loop around the op adds its own)."""
        linear = self._linear.get(placed.local)
        if linear is None:
            return None
        operands, _ = linear
        if any(not set(p.dist.partial) <= set(placed.dist.partial) for p in operands):
            return None
        return linear

    def _sum_paid(self, placed: Placed) -> bool:
        """Whether summing `placed` whole moves nothing more: it was summed
        already, or it is a linear op remade for free on operands that were."""
        if self.has_whole(placed):
            return True
        linear = self._remakeable(placed)
        return (
            linear is not None
            and set(placed.dist.partial) <= {a for p in linear[0] for a in p.dist.partial}
            and self._sum_bytes(placed, {}, 0) == 0
        )

    def _scatter(
        self, placed: Placed, dim: int, axes: tuple[str, ...], ty: TensorType
    ) -> Placed:
        """P -> S(dim) by a reduce-scatter, remembered so that a later whole
        use gathers these parts instead of summing the value again."""
        split = self._apply(placed, ReduceScatterOp(placed.local, dim, axes, ty))
        if tuple(axes) == placed.dist.partial:
            self._scattered[(placed.local, placed.dist.partial)] = (split, dim)
        return split

    def _sum_bytes(self, placed: Placed, memo: dict[SSAValue, int], depth: int) -> int:
        """The bytes per device of summing what `placed` is made of, by the
        cheapest mix of all-reduces and remade linear ops (nothing for a sum
        already paid); the search stops `_SEARCH_DEPTH` linear ops back."""
        total = 0
        operands, _ = self._linear[placed.local]
        for p in operands:
            if not p.dist.partial or (p.local, p.dist.partial) in self._sums:
                continue
            if p.local not in memo:
                own = _bytes(p.local)
                if self._remakeable(p) is not None and depth < _SEARCH_DEPTH:
                    own = min(own, self._sum_bytes(p, memo, depth + 1))
                memo[p.local] = own
            total += memo[p.local]
        return total

    def replicate(self, placed: Placed) -> Placed:
        """The whole value on every device: all-reduce partials, gather splits."""
        if placed.dist.is_replicated:
            return placed
        unsliced = self._unsliced(placed, Distribution.replicated(len(placed.dist.dims)))
        if unsliced is not placed:
            return unsliced

        def make() -> Placed:
            whole = placed
            if whole.dist.partial:
                whole = self._all_reduce(whole)
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

        return self._all_reduce(placed)

    def convert(self, placed: Placed, target: Distribution) -> Placed:
        """`placed` distributed as `target` (splits only: a loop-carried value):
        a local slice where `target` only splits further, a reduce-scatter
        where it splits a dim over the axes `placed` is partial over, else
        partial sums added, gathered where the splits differ, then the
        device's part."""
        placed = self._unsliced(placed, target)
        if placed.dist == target:
            return placed

        def make() -> Placed:
            current = placed
            dist = current.dist
            if dist.partial and not dist.axes and len(target.axes) == len(dist.partial):
                split = [d for d, axes in enumerate(target.dims) if axes]
                if (
                    len(split) == 1
                    and set(target.dims[split[0]]) == set(dist.partial)
                    and not self._sum_paid(current)
                ):
                    d, axes = split[0], target.dims[split[0]]
                    ty = part_type(current.local.type, d, self.mesh.size_of(axes))
                    return self._scatter(current, d, axes, ty)
            if dist.partial:  # P -> B first: the splits stay
                current = self._all_reduce(current)
                dist = current.dist
            further = all(
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
        saved, sums = dict(self._cache), dict(self._sums)  # (carried ops dominate)
        scattered = dict(self._scattered)
        try:
            yield
        finally:
            self._cache, self._sums, self._scattered = saved, sums, scattered

    def take_part(self, placed: Placed, dim: int, axis: str) -> Placed:
        """Each device's part along `dim` over `axis` (a `partir.slice` by the
        axis's range); `axis` is iterated afterwards, so it leaves the dist."""
        dist = placed.dist
        if not self.mesh.distributes(axis):  # the one device's part is the value
            return placed
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
                pieces.insert(0, self._permuted(rows, axis, down))
            if hi:  # the next part's first rows: each device sends its own up
                up = [(i + 1, i) for i in range(last)]
                rows = self._rows(local, dim, 0, hi)
                pieces.append(self._permuted(rows, axis, up))
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

    def _permuted(self, value: SSAValue, axis: str, pairs: list[tuple[int, int]]) -> SSAValue:
        """`value` sent along `pairs` over `axis`: zeros where no pair
        targets a device, so on an axis of one device (no pairs) a constant
        zero, not a collective over nothing."""
        if pairs:
            return self.emit(CollectivePermuteOp(value, (axis,), pairs)).results[0]
        ty = value.type
        assert isinstance(ty, TensorType)
        return self._emit(splat(ty, 0)).results[0]

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
        if axis in dist.partial and self._sum_paid(placed):  # the sum's part
            return self.take_part(self._all_reduce(placed), dim, axis)
        if part is not None and axis in dist.partial:  # P -> S: reduce-scatter
            split = self._scatter(placed, dim, (axis,), part)
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
