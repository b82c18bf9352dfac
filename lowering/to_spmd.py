"""`partir-lower-spmd`: core IR (loops over mesh axes) -> one per-device program.

Each device runs the loops' bodies for its own index along every axis, so the
loops disappear: their bodies are emitted inline into one flat function (the
`shard_map` body), and what remains of the loop structure is each value's
distribution:

- a `tile<d>` loop over `a` yields a value split on dim d over `a` (S(d)),
  major to whatever its body's value is split by; a `sum` loop a partial sum
  over `a` (P);
- `partir.slice d v[r]` is the device's own part of `v`: free when `v` is
  already split that way, else the cheapest collective (`distributions.py`);
- any other op computes on whole values at its scope, so its operands are
  made whole (all-reduce / all-gather) where they are not.

Arguments take the distribution their uses slice them by (inputs arrive
sharded); results keep theirs (outputs stay sharded), except that pending
partial sums are all-reduced, since a partial sum is not a value, and a
result marked whole over some axes (`dialects.functions.WHOLE_OVER`) is
gathered over them.

Every op the lowering inserts (a collective, a local slice, an op remade on
the devices' parts) takes the location of the op being lowered, the one that
needed it (`dialects.locations`); ops moved into the body keep their own.

Each op moved into the body is annotated with its result's global type and
distribution (`DIST`), from its relation to the loops it was in: as
`rewrites.build_core` built it (`rewrites.projection.BuiltRelations`, kept
with a function `partir.partition` built while the function is as built),
else derived from the core IR (`LoopRelations`: core IR parsed, edited or
cloned since).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from operator import is_not
from typing import Any, cast

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    UNKNOWN_LOC,
    ArrayAttr,
    LocationAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    UnknownLoc,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import IRDLOperation
from xdsl.passes import ModulePass
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.xdsl_extras.traits import Elementwise

from dialects.carried import BRANCHING_OPS
from dialects.distribution import Distribution
from dialects.dtypes import tensor_type
from dialects.errors import UnsupportedError
from dialects.functions import entry_function, whole_over
from dialects.heap import paused_gc
from dialects.locations import is_unknown
from dialects.manual_regions import (
    MANUAL_COLLECTIVE,
    mesh_of,
    operand_distributions,
    result_distributions,
)
from dialects.mesh import Mesh
from dialects.names import op_name
from dialects.op_kinds import per_op_kind
from dialects.partir import (
    HaloSliceOp,
    LoopOp,
    MeshOp,
    OriginAttr,
    SliceOp,
    SumAttr,
    TileAttr,
    YieldOp,
    find_mesh,
)
from dialects.sdy import ManualComputationOp, ShardingConstraintOp
from dialects.sdy import ReturnOp as SdyReturnOp
from dialects.spmd import (
    CARRIED,
    DIST,
    CollectiveOp,
    DTensorType,
    FromLocalOp,
    LocalSliceOp,
    ToLocalOp,
)
from lowering.distributions import NEEDED_BY, Placed, Redistributor, Remake
from rewrites.projection import (
    LoopRelation,
    LoopRelations,
    built_relations,
    enclosing_axes,
    range_axis,
    range_loop,
)
from rewrites.registry import linear_operands

_SCALAR = Distribution(())
"""The distribution of a value that is not a tensor (a token)."""


class LoweringError(ValueError):
    """Core IR the SPMD lowering cannot handle, with the op that caused it."""


def input_slices(value: SSAValue) -> list[tuple[int, str]]:
    """The (dim, axis) slices every use of `value` takes, outermost first.
    Slices of different dims commute (a use slicing dim 1 over "batch" and
    then dim 2 over "model" reads the part another use slicing them the
    other way round reads); on one dim their order is the nesting."""
    chains: list[list[tuple[int, str]]] = []
    for use in value.uses:
        op = use.operation
        kind = type(op)  # not `isinstance` (an ABC check) nor IRDL's accessors: per use
        if kind is SliceOp and use.index == 0:
            _, index = op.operands
            axis = range_axis(index)
            assert axis is not None
            (result,) = op.results
            chains.append([(op.dim_index, axis), *input_slices(result)])
        elif kind is HaloSliceOp and use.index == 0:
            _, index = op.operands
            axis = range_axis(index)
            assert axis is not None
            chains.append([(op.dim_index, axis)])  # its halo comes from the neighbours
        else:
            return []
    if not chains:
        return []
    if len(chains) == 1 or all(chain == chains[0] for chain in chains[1:]):
        return chains[0]
    common = _per_dim(chains[0])
    for chain in chains[1:]:
        other = _per_dim(chain)
        for d, axes in common.items():
            theirs = other.get(d, [])
            n = 0
            while n < min(len(axes), len(theirs)) and axes[n] == theirs[n]:
                n += 1
            common[d] = axes[:n]
    kept = {d: len(axes) for d, axes in common.items()}
    found = []
    for d, axis in chains[0]:  # the first use's order, as far as every use agrees
        if kept[d]:
            kept[d] -= 1
            found.append((d, axis))
    return found


def _per_dim(chain: list[tuple[int, str]]) -> dict[int, list[str]]:
    """A slice chain's axes per dim, outermost first."""
    found: dict[int, list[str]] = {}
    for d, axis in chain:
        found.setdefault(d, []).append(axis)
    return found


def slicing_origins(value: SSAValue) -> tuple[tuple[str, OriginAttr], ...]:
    """Per axis, the origin of the first loop slicing `value` over it
    (why it arrives split), following slices of slices."""
    found: dict[str, OriginAttr] = {}
    stack = [value]
    while stack:
        for use in stack.pop().uses:
            op = use.operation
            if type(op) is SliceOp or type(op) is HaloSliceOp:
                _, index = op.operands
                loop = range_loop(index)
                if loop is not None and loop.origin is not None:
                    found.setdefault(loop.axis_name, loop.origin)
                (result,) = op.results
                stack.append(result)
    return tuple(found.items())


def input_dist(value: SSAValue, mesh: Mesh) -> Distribution:
    assert isinstance(value.type, TensorType)
    dims: list[tuple[str, ...]] = [() for _ in value.type.get_shape()]
    shape = list(value.type.get_shape())
    for d, axis in input_slices(value):
        if not mesh.distributes(axis):
            continue  # one device: the value is whole there
        if shape[d] % mesh[axis]:
            break
        shape[d] //= mesh[axis]
        dims[d] = (*dims[d], axis)
    return Distribution(tuple(dims))


@dataclass
class _Insertion:
    """Where lowered ops go, and the location they take when they have none.

    Its own object, shared by the lowering and its `Redistributor`: a bound
    method of the lowering given to the redistributor made a reference cycle,
    which left every memo of the lowering (about 7 objects per op) for the
    cyclic collector to walk instead of freeing it on return."""

    block: Block
    location: LocationAttr = UNKNOWN_LOC

    def emit(self, op: Operation) -> Operation:
        if is_unknown(op.location):
            op.location = self.location
        self.block.add_op(op)
        return op


class SpmdLowering:
    """Lowers one entry function; see the module docstring."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.at = _Insertion(Block())
        self.env: dict[SSAValue, Placed] = {}
        self.relations: Callable[[SSAValue], LoopRelation] = LoopRelations()
        """Each value's relation to the loops around it, for the annotations:
        as `rewrites.build_core` built them where the function is as built,
        else derived from the IR."""
        self.redistribute = Redistributor(mesh, self.at.emit)
        self.computed: list[Operation] = []
        """The ops moved into the SPMD body, for the annotations."""
        self.partial: dict[Operation, tuple[str, ...]] = {}
        """Computed ops whose result stays a partial sum over these axes."""
        self.remade: dict[Operation, Operation] = {}
        """Carried ops emitted again on summed operands, and the originals."""
        self.single_axes = tuple(a for a in mesh if not mesh.distributes(a))
        """The mesh axes of one device, which no distribution names."""
        self.looped: dict[
            tuple[int, str, int], tuple[Distribution, Attribute, Distribution]
        ] = {}
        """A loop's result distribution per its body's (by id: kept in the
        value), axis and action (by id): the layers repeat a few."""

    def lower(self, entry: func.FuncOp) -> func.FuncOp:
        args = entry.body.block.args
        arg_types = []
        for arg in args:
            dist = input_dist(arg, self.mesh)
            assert isinstance(arg.type, TensorType)  # input_dist checked it
            dtensor = DTensorType.of(arg.type, dist)
            arg_types.append(dtensor)
        self.at.block = Block(arg_types=arg_types)
        self.relations = built_relations(entry) or LoopRelations.of(entry.body.block)
        for arg, new_arg, dtensor in zip(args, self.at.block.args, arg_types, strict=True):
            new_arg.name_hint = arg.name_hint
            to_local = self.at.emit(ToLocalOp(new_arg, dtensor.local_type(self.mesh)))
            to_local.attributes[DIST] = dtensor
            local = to_local.results[0]
            local.name_hint = arg.name_hint
            self.env[arg] = Placed(local, dtensor.distribution, slicing_origins(arg))
        for op in _ops(entry.body.block):  # compute ops move out as they lower
            if isinstance(op, func.ReturnOp):
                return self._finish(entry, op)
            self._lower_op(op)
        raise LoweringError("the entry function has no func.return")

    def _finish(self, entry: func.FuncOp, ret: func.ReturnOp) -> func.FuncOp:
        self.at.location = ret.location
        results, types = [], []
        for index, value in enumerate(ret.arguments):
            placed = self.env[value]
            if placed.dist.partial:
                self.redistribute.cause = ("func.return", placed.origins)
                placed = self.redistribute.reduce_partial(placed)
            whole = whole_over(entry, index)
            if any(a in whole for a in placed.dist.axes):  # returned as it came
                self.redistribute.cause = ("func.return", placed.origins)
                dims = tuple(tuple(a for a in d if a not in whole) for d in placed.dist.dims)
                placed = self.redistribute.convert(placed, Distribution(dims))
            assert isinstance(value.type, TensorType)  # it was placed, so it is a tensor
            dtensor = DTensorType.of(value.type, placed.dist)
            from_local = self.at.emit(FromLocalOp(placed.local, dtensor))
            from_local.attributes[DIST] = dtensor
            results.append(from_local.results[0])
            types.append(dtensor)
        self.at.emit(func.ReturnOp(*results))
        self._drop_unused_slices()
        self._drop_unused_partials()
        self._annotate_computed()
        annotate_collectives(self.at.block, self.redistribute.emitted)
        lowered = func.FuncOp(
            entry.sym_name.data,
            (list(self.at.block.arg_types), types),
            Region(self.at.block),
            entry.sym_visibility.data if entry.sym_visibility else None,
            arg_attrs=entry.arg_attrs,
            res_attrs=entry.res_attrs,
        )
        return lowered

    # --- ops -------------------------------------------------------------------

    def _lower_op(self, op: Operation) -> None:
        try:  # `_lowerer_for`, without its call: this runs per op
            lowerer = _LOWERERS[type(op)]
        except KeyError:
            lowerer = _LOWERERS[type(op)] = _lowerer_for(op)
        location = op.location
        if type(location) is UnknownLoc:  # (`is_unknown`) it takes the location around it
            lowerer(self, op)
            return
        at = self.at
        outer, at.location = at.location, location
        try:
            lowerer(self, op)
        finally:
            at.location = outer

    def _lower_branching(self, op: Operation) -> None:
        """A conditional on the devices' parts: the index (or predicate) is
        made whole, so every device takes the same branch; each result has
        the distribution its users slice it by (`rewrites.control_flow` tiles
        it there), and each branch's returned values are converted to it."""
        dists = [self._carried_dist(r) for r in op.results]
        self.redistribute.cause = (f"{op_name(op)} index", self.env[op.operands[0]].origins)
        index = self.redistribute.replicate(self.env[op.operands[0]]).local

        def converted(ret: Operation) -> list[SSAValue]:
            return self._convert_all(ret.operands, dists, f"{op_name(op)} branch")

        regions = [Region(self._lower_region(r.block, [], [], converted)) for r in op.regions]
        self._emit_carrier(op, [index], dists, regions)

    def _lower_barrier(self, op: shlo.OptimizationBarrierOp) -> None:
        """A barrier on the devices' parts: each value passes through with the
        distribution it arrives with (`rewrites.control_flow` tiles its result
        as its operand), so the fence needs no collective."""
        placed = [self.env[v] for v in op.operands]
        self._emit_carrier(op, [p.local for p in placed], [p.dist for p in placed], [])
        for old, p in zip(op.results, placed, strict=True):
            self.env[old] = self.env[old]._replace(origins=p.origins)

    def _lower_while(self, op: shlo.WhileOp) -> None:
        """A loop on the devices' parts: each carried value keeps the
        distribution its body argument is sliced by (`rewrites.control_flow`
        tiles it there), on entry, in both regions and on exit; the body's
        returned values are converted to it, the condition's made whole."""
        body, cond = op.body.block, op.cond.block
        dists = [self._carried_dist(arg) for arg in body.args]
        operands = self._convert_all(op.operands, dists, op_name(op))
        local_types = [v.type for v in operands]

        def whole(ret: Operation) -> list[SSAValue]:
            self.redistribute.cause = (f"{op_name(op)} cond", ())
            return [self.redistribute.replicate(self.env[ret.operands[0]]).local]

        def carried(ret: Operation) -> list[SSAValue]:
            return self._convert_all(ret.operands, dists, f"{op_name(op)} body")

        regions = [
            Region(self._lower_region(cond, dists, local_types, whole)),
            Region(self._lower_region(body, dists, local_types, carried)),
        ]
        self._emit_carrier(op, operands, dists, regions)

    def _lower_manual(self, op: ManualComputationOp) -> None:
        """A nested shard_map on the devices' parts: each operand is converted
        to the parts its `in_shardings` give (`dialects.manual_regions`), the
        body (per-device code, its collectives partir's already) runs inline
        on them, and its results are the parts `out_shardings` give."""
        if tuple(mesh_of(op).axes.items()) != tuple(self.mesh.axes.items()):
            raise UnsupportedError(
                f"{op_name(op)}: the nested jax.shard_map runs on the mesh "
                f"{dict(mesh_of(op).axes)}, partir partitions over {dict(self.mesh.axes)}; "
                "give partir.jit the mesh the shard_map uses"
            )
        operands = self._convert_all(
            op.tensors, operand_distributions(op), f"{op_name(op)} in_specs"
        )
        block = op.body.block
        mapping: dict[SSAValue, SSAValue] = dict(zip(block.args, operands, strict=True))
        for inner in block.ops:
            if isinstance(inner, SdyReturnOp):
                returned = [mapping.get(v, v) for v in inner.operands]
                break
            clone = inner.clone(value_mapper=mapping)
            self.at.emit(clone)
            if isinstance(clone, CollectiveOp):  # the user's own, as written
                clone.attributes[NEEDED_BY] = StringAttr(MANUAL_COLLECTIVE)
                self.redistribute.emitted.append(clone)
            for old, new in zip(inner.results, clone.results, strict=True):
                mapping[old] = new
        else:
            raise LoweringError(f"{op_name(op)}: its body has no sdy.return")
        emitted = set(mapping.values())
        for old, local, dist in zip(op.results, returned, result_distributions(op), strict=True):
            self.env[old] = Placed(local, dist)
            owner = local.owner
            if local in emitted and isinstance(owner, Operation) and len(owner.results) == 1:
                assert isinstance(old.type, TensorType)
                owner.attributes[DIST] = DTensorType.of(old.type, dist)

    def _carried_dist(self, value: SSAValue) -> Distribution:
        """What `value`'s users slice it by (a carried value's distribution)."""
        if isinstance(value.type, TensorType):
            return input_dist(value, self.mesh)
        return Distribution(())

    def _convert_all(
        self, values: Sequence[SSAValue], dists: list[Distribution], cause: str
    ) -> list[SSAValue]:
        """Each value converted to its distribution, as the devices' parts."""
        out = []
        for value, dist in zip(values, dists, strict=True):
            self.redistribute.cause = (cause, self.env[value].origins)
            out.append(self.redistribute.convert(self.env[value], dist).local)
        return out

    def _emit_carrier(
        self, op: Operation, operands: list[SSAValue], dists: list[Distribution],
        regions: list[Region],
    ) -> None:
        """`op` remade on the devices' parts (its regions already lowered):
        its results are `dists`' parts, recorded per value in `CARRIED`."""
        results = list(op.results)
        new = type(op).create(
            operands=operands,
            result_types=[
                DTensorType.of(r.type, d).local_type(self.mesh)
                if isinstance(r.type, TensorType) else r.type
                for r, d in zip(results, dists, strict=True)
            ],
            properties=dict(op.properties),
            attributes=dict(op.attributes),
            regions=regions,
        )
        if all(isinstance(r.type, TensorType) for r in results):
            new.attributes[CARRIED] = ArrayAttr(
                [DTensorType.of(cast(TensorType, r.type), d)
                 for r, d in zip(results, dists, strict=True)]
            )
        self.at.emit(new)
        for old, result, dist in zip(results, new.results, dists, strict=True):
            result.name_hint = old.name_hint
            self.env[old] = Placed(result, dist)

    def _lower_region(
        self,
        block: Block,
        dists: list[Distribution],
        local_types: list[Attribute],
        returns: Callable[[Operation], list[SSAValue]],
    ) -> Block:
        """`block` (ending in `stablehlo.return`) lowered into a new block whose
        arguments are the parts `dists` give; `returns` makes its results."""
        outer = self.at.block
        self.at.block = Block(arg_types=local_types)
        try:
            with self.redistribute.nested():
                for arg, new_arg, dist in zip(block.args, self.at.block.args, dists, strict=True):
                    new_arg.name_hint = arg.name_hint
                    self.env[arg] = Placed(new_arg, dist)
                *ops, ret = _ops(block)
                if not isinstance(ret, shlo.ReturnOp):
                    owner = block.parent_op()
                    where = op_name(owner) if owner is not None else "a region"
                    raise LoweringError(f"{ret.name} ends a region of {where}")
                for inner in ops:
                    self._lower_op(inner)
                self.at.emit(shlo.ReturnOp(returns(ret)))
            return self.at.block
        finally:
            self.at.block = outer

    def _lower_slice(self, op: SliceOp) -> None:
        dim = op.dim_index
        axis, source = self._sliced(op, dim)
        self.env[op.results[0]] = self.redistribute.take_part(source, dim, axis)

    def _lower_halo_slice(self, op: HaloSliceOp) -> None:
        """The device's part with its neighbours' halos (`Redistributor`)."""
        dim = op.dim_index
        axis, source = self._sliced(op, dim)
        self.env[op.results[0]] = self.redistribute.take_part_with_halo(
            source, dim, axis, op.low_high
        )

    def _sliced(self, op: SliceOp | HaloSliceOp, dim: int) -> tuple[str, Placed]:
        """The axis a slice's range runs over, and its source; the collectives
        it needs are caused by the slicing loop (its origin, on that axis)."""
        src, index = op.operands  # not IRDL's accessors: one read, per slice
        loop = range_loop(index)
        if loop is None:
            raise LoweringError(f"{op.name} of {src} is not indexed by a loop range")
        axis, origin = loop.axis_name, loop.origin
        source = self.env[src]
        origins = source.with_origin(axis, origin) if origin else source.origins
        self.redistribute.cause = (f'{op.name} {dim} over "{axis}"', origins)
        return axis, source

    def _lower_reshard(self, op: ShardingConstraintOp) -> None:
        """A reshard the program states (`dialects.sdy.RESHARD`): its result
        is its operand, which each use converts to the part it needs (a
        whole use gathers it, a slice on another dim moves the split by an
        all-to-all: the collective jax.jit emits for the reshard). Returned
        from the entry, it leaves distributed as the reshard says."""
        placed = self.env[op.input]
        returned = isinstance(op.parent_op(), func.FuncOp) and any(
            isinstance(use.operation, func.ReturnOp) for use in op.result.uses
        )
        if returned:
            dims = tuple(
                tuple(a for a in axes if self.mesh.distributes(a)) for axes in op.sharding.dims
            )
            self.redistribute.cause = (op_name(op), placed.origins)
            placed = self.redistribute.convert(placed, Distribution(dims))
        self.env[op.result] = placed

    def _lower_loop(self, op: LoopOp) -> None:
        for body_op in _ops(op.body.block):  # compute ops move out as they lower
            self._lower_op(body_op)
        yielded = self.env[op.yielded]
        axis, action, result = op.axis_name, op.action, op.results[0]
        if not self.mesh.distributes(axis):  # one device runs the only iteration
            self.env[result] = yielded
            return
        inner = yielded.dist
        key = (id(inner), axis, id(action))
        found = self.looped.get(key)
        if found is not None:
            dist = found[2]
        elif isinstance(action, TileAttr):
            d = action.dim.data
            dist = inner.with_dim(d, (axis, *inner.dims[d]))
        else:
            assert isinstance(action, SumAttr)
            dist = replace(inner, partial=tuple(sorted((*inner.partial, axis))))
        if found is None:
            self.looped[key] = (inner, action, dist)
        self.env[result] = Placed(yielded.local, dist, yielded.with_origin(axis, op.origin))

    def _lower_branch(self, op: Operation) -> None:
        """An op of a class that may branch to successors (a CFG's)."""
        if op.successors:
            raise LoweringError(f"{op.name}: ops with successors are not supported")
        self._lower_compute(op)

    def _lower_compute(self, op: Operation) -> None:
        env = self.env
        values = op.operands  # xDSL builds this tuple per read
        try:
            placed_operands = [env[value] for value in values]
        except KeyError:
            unseen = next(value for value in values if value not in env)
            raise LoweringError(
                f"{op.name} uses a value the lowering has not seen: {unseen}"
            ) from None
        keeps = None
        for placed in placed_operands:
            if placed.dist.partial:
                keeps = self._keeps_partial(op, placed_operands)
                break
        operands = [placed.local for placed in placed_operands]
        if keeps is None:
            for i, placed in enumerate(placed_operands):
                if not placed.dist.is_replicated:
                    self.redistribute.cause = (op_name(op), placed.origins)
                    operands[i] = self.redistribute.replicate(placed).local
        # The op itself moves into the SPMD body (the core function is erased
        # afterwards): cloning each op cost more than the rest of the lowering.
        # Its operands change where a device holds another value (a part, a
        # collective's result); most stay, and setting them redoes every use.
        op.detach()
        if any(map(is_not, operands, values)):
            op.operands = operands
        self.at.emit(op)
        results = op.results
        if keeps is not None:  # the result is the devices' partial sums (and parts)
            dist, origins = keeps
            result = results[0]
            env[result] = Placed(result, dist, origins)
            self.computed.append(op)
            self.partial[op] = dist.partial
            self.redistribute.carried(result, placed_operands, self._remake(op))
            return
        if len(results) == 1:  # most ops: their result replicated at their scope
            (result,) = results
            ty = result.type
            if isinstance(ty, TensorType):
                env[result] = Placed(result, Distribution.replicated(ty.get_num_dims()))
                self.computed.append(op)
            else:
                env[result] = Placed(result, _SCALAR)
            return
        for result in results:  # several: not annotated
            ty = result.type
            if isinstance(ty, TensorType):
                env[result] = Placed(result, Distribution.replicated(ty.get_num_dims()))
            else:
                env[result] = Placed(result, _SCALAR)

    def _keeps_partial(
        self, op: Operation, placed: list[Placed]
    ) -> tuple[Distribution, tuple[tuple[str, OriginAttr], ...]] | None:
        """The distribution `op`'s result keeps when partial sums pass through
        it instead of being all-reduced first (DistPar's P through a linear
        op; Shardy's unreduced axes): the op is linear in exactly its partial
        operands (`rewrites.registry.LINEAR`), which are partial over the same
        axes and not summed yet, and its result is not cut into halo parts.
        Split dims pass through an elementwise op whose operands are all split
        alike; otherwise nothing is split. Whether to sum the result or its
        operands is decided where a sum is needed (`Redistributor`).
        `placed`: the operands as the devices hold them."""
        partial = frozenset(i for i, p in enumerate(placed) if p.dist.partial)
        if not partial or partial not in linear_operands(op):
            return None
        dists = {placed[i].dist for i in partial}
        if len(dists) != 1:
            return None
        (dist,) = dists
        if any(self.redistribute.has_whole(placed[i]) for i in partial):
            return None
        if enclosing_axes(op) & set(dist.partial):  # each device runs its own part
            return None
        if any(any(p.dist.dims) for p in placed) and not (
            op.has_trait(Elementwise) and all(p.dist.dims == dist.dims for p in placed)
        ):
            return None
        result = op.results[0]
        if not isinstance(result.type, TensorType) or _cut_with_halos(result):
            return None
        kept = Distribution(
            dist.dims if any(dist.dims)
            else Distribution.replicated(result.type.get_num_dims()).dims,
            dist.partial,
        )
        return kept, placed[min(partial)].origins

    def _remake(self, op: Operation) -> Remake:
        """Emits `op` again on whole operands (`Redistributor.carried`)."""

        emit, remade = self.at.emit, self.remade  # not `self`: no cycle through it

        def remake(operands: list[SSAValue]) -> SSAValue:
            clone = op.clone()
            clone.operands = operands
            emit(clone)
            remade[clone] = op
            return clone.results[0]

        return remake

    def _drop_unused_slices(self) -> None:
        """Erase the local slices no op reads (a part a loop body took of a
        carried value and carries whole again: `Redistributor._unsliced`)."""
        emitted = self.redistribute.emitted
        dropped = set()
        for op in reversed(emitted):  # last first: a slice may read another
            if isinstance(op, LocalSliceOp) and not op.results[0].uses:
                op.detach()
                op.erase()
                dropped.add(op)
        if dropped:
            emitted[:] = [c for c in emitted if c not in dropped]

    def _drop_unused_partials(self) -> None:
        """Erase the carried ops whose partial results every use took summed
        by remaking them (last first: an op may feed another)."""
        for op in reversed(list(self.partial)):
            if not op.results[0].uses:
                op.detach()
                op.erase()
                del self.partial[op]

    # --- annotations ------------------------------------------------------------

    def _annotate_computed(self) -> None:
        """Annotate each computed op with its result's global type and
        distribution over the loops around it (`rewrites.projection`); a value
        whose relation to some loop is unknown is left unannotated."""
        annotations: dict[tuple[Attribute, tuple[int, ...], Distribution], DTensorType] = {}
        by_objects: dict[
            tuple[int, int, tuple[str, ...] | None],
            tuple[Attribute, LoopRelation, DTensorType | None],
        ] = {}
        """The annotation per local type and relation objects (and the axes
        summed later): most ops share a few of each, and hashing them walks
        their fields (both are kept in the value, so their ids stay their own)."""
        relation_of, partial = self.relations, self.partial
        remade = [(clone, original) for clone, original in self.remade.items()]
        computed = [(op, op) for op in self.computed if op.parent is not None]
        for op, original in computed + remade:
            result, *_ = original.results  # not `results[0]`: xDSL's indexing is Python
            relation = relation_of(result)
            if op is not original:
                result, *_ = op.results
            local = result.type
            summed_later = partial.get(op)
            key = (id(local), id(relation), summed_later)
            found = by_objects.get(key)
            if found is None:
                dtensor = self._annotation(local, relation, summed_later, annotations)
                found = by_objects[key] = (local, relation, dtensor)
            if found[2] is not None:
                op.attributes[DIST] = found[2]

    def _annotation(
        self,
        local: Attribute,
        relation: LoopRelation,
        summed_later: tuple[str, ...] | None,
        annotations: dict[tuple[Attribute, tuple[int, ...], Distribution], DTensorType],
    ) -> DTensorType | None:
        """The annotation of a value of type `local` related so to the loops
        around it (`summed_later`: the axes its partial sums are summed over
        after), one object per type and distribution; None where the
        relation to some loop is unknown."""
        if relation.unknown or not isinstance(local, TensorType):
            return None
        single_axes = self.single_axes
        dist = relation.dist.without(single_axes) if single_axes else relation.dist
        if summed_later is not None:
            dist = replace(dist, partial=tuple(sorted({*dist.partial, *summed_later})))
        key = (local.element_type, local.get_shape(), dist)
        dtensor = annotations.get(key)
        if dtensor is None:
            global_type = self._global_type(local, dist)
            dtensor = annotations[key] = DTensorType.of(global_type, dist)
        return dtensor

    def _global_type(self, local: TensorType, dist: Distribution) -> TensorType:
        parts = dist.parts(self.mesh)
        shape = [n * k for n, k in zip(local.get_shape(), parts, strict=True)]
        return tensor_type(local.element_type, shape)


def _ops(block: Block) -> list[Operation]:
    """`block`'s ops, as a list (not `list(block.ops)`: that walks them
    twice, once to count them)."""
    return list(iter(block.ops))


def _cut_with_halos(value: SSAValue) -> bool:
    """Whether some view of `value` is a halo part (`partir.halo_slice`),
    which takes its neighbours' edges: a partial sum's edges would need a
    sum of their own. The views: `value`, what it is a `partir.slice` of,
    and every slice and loop result made of those (a loop's result and its
    users' parts are the same values). (Classes compared exactly, not by
    `isinstance`, an ABC check: this runs per partial sum, on every use.)"""
    root = value
    while type(root.owner) is SliceOp:
        root = root.owner.operands[0]
    pending, seen = [root], {id(root)}
    while pending:
        for use in pending.pop().uses:
            user = use.operation
            kind = type(user)
            if kind is HaloSliceOp:
                return True
            if kind is SliceOp:
                (view,) = user.results
            elif kind is YieldOp and type(loop := user.parent_op()) is LoopOp:
                (view,) = loop.results
            else:
                continue
            if id(view) not in seen:
                seen.add(id(view))
                pending.append(view)
    return False


def annotate_collectives(block: Block, collectives: Iterable[CollectiveOp]) -> None:
    """Give each collective of `block`'s, in order (of `collectives`, all
    those emitted), the `dist` its operand's implies."""
    for op in collectives:
        if op.parent is block and _gives_a_distributed_value(op) and DIST not in op.attributes:
            assert isinstance(op, CollectiveOp)
            source = op.operands[0].owner
            before = source.attributes.get(DIST) if isinstance(source, Operation) else None
            if isinstance(before, DTensorType):
                after = op.result_distribution(before.distribution)
                op.attributes[DIST] = DTensorType.of(before.global_type, after)


@per_op_kind
def _gives_a_distributed_value(op: Operation) -> bool:
    """Whether `op` is a collective whose result is a distributed value."""
    return isinstance(op, CollectiveOp) and op.GIVES_A_DISTRIBUTED_VALUE


def lower_to_spmd(module: ModuleOp) -> None:
    """Replace the module's public function by its SPMD form (in place)."""
    mesh_op = find_mesh(module)
    if mesh_op is None:
        raise LoweringError("the module declares no partir.mesh; partition it first")
    entry = entry_function(module)
    with paused_gc():
        lowered = SpmdLowering(mesh_op.mesh).lower(entry)
        module.body.block.insert_op_before(lowered, entry)
        module.body.block.erase_op(entry)


@dataclass(frozen=True)
class LowerToSpmdPass(ModulePass):
    """Lower partir core IR (loops over mesh axes) to the SPMD dialect."""

    name = "partir-lower-spmd"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lower_to_spmd(op)


Lowerer = Callable[[SpmdLowering, Any], None]


_LOWERERS: dict[type[Operation], Lowerer] = {}
"""`_lowerer_for` per op class met so far."""


def _lowerer_for(op: Operation) -> Lowerer:
    """How `SpmdLowering` lowers ops of `op`'s kind."""
    if isinstance(op, SliceOp):
        return SpmdLowering._lower_slice
    if isinstance(op, HaloSliceOp):
        return SpmdLowering._lower_halo_slice
    if isinstance(op, LoopOp):
        return SpmdLowering._lower_loop
    if isinstance(op, YieldOp | MeshOp):
        return _nothing
    if isinstance(op, shlo.WhileOp):
        return SpmdLowering._lower_while
    if isinstance(op, shlo.OptimizationBarrierOp):
        return SpmdLowering._lower_barrier
    if isinstance(op, BRANCHING_OPS):
        return SpmdLowering._lower_branching
    if isinstance(op, ManualComputationOp):
        return SpmdLowering._lower_manual
    if isinstance(op, ShardingConstraintOp) and op.is_reshard:
        return SpmdLowering._lower_reshard
    if not isinstance(op, IRDLOperation) or type(op).get_irdl_definition().successors:
        return SpmdLowering._lower_branch  # (an IRDL op's successors are its class's)
    return SpmdLowering._lower_compute


def _nothing(lowering: SpmdLowering, op: Operation) -> None:
    """A yield (its loop reads it) or the mesh: nothing to lower."""

