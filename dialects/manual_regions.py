"""Manual regions (a nested `jax.shard_map`, `sdy.manual_computation`), read
into partir's terms.

A region's body is per-device code over its manual axes, and partir's own
program is per device over every mesh axis, so a region is its body run on
each device's parts: its operands converted to the parts `in_shardings`
give, its results the parts `out_shardings` give. A region manual over some
axes only (`jax.shard_map(..., axis_names={"model"})`) has a body written
whole over the others; each device runs it on its parts along the manual
axes, whole along the rest (the work is repeated along them, as written),
and a region nested in it over the remaining axes (what `axis_index` of such
an axis lowers to) is inlined: its operands are each device's parts along
its axes (`spmd.local_slice`), its results gathered (`spmd.all_gather`).
The body's collectives come from JAX as `stablehlo.all_reduce` & co. with
device-id `replica_groups` (`dialects.stablehlo_collectives`);
`normalize_manual_regions` rewrites each as partir's `spmd` op over the mesh
axes its groups span (a `pmax` / `pmin` an all-reduce of that kind,
`partition_id` the device's `spmd.axis_index` over every axis), which the
interpreters, the SPMD lowering and the emitter already know. What partir
cannot keep is an `UnsupportedError` naming it and what to do.
"""

from __future__ import annotations

import itertools

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects import stablehlo_collectives as stablehlo
from dialects.distribution import Distribution
from dialects.errors import UnsupportedError
from dialects.escaping import quoted
from dialects.locations import source_location
from dialects.mesh import Mesh
from dialects.names import op_name
from dialects.sdy import (
    ManualComputationOp,
    MeshAttr,
    MeshOp,
    ReturnOp,
    ShardingAttr,
    ShardingConstraintOp,
)
from dialects.spmd import (
    REDUCTIONS,
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    AxisIndexOp,
    CollectivePermuteOp,
    LocalSliceOp,
    ReduceScatterOp,
)
from dialects.stablehlo_collectives import DeviceCollectiveOp

_OTHER_COLLECTIVES = frozenset(
    {
        "stablehlo.collective_broadcast",
        "stablehlo.replica_id",
    }
)
"""What a region's body may not hold (no `jax.lax` call writes them)."""


def _where(op: Operation) -> str:
    frame = source_location(op.location).frame
    return f" at {frame}" if frame else ""


def distribution(sharding: ShardingAttr) -> Distribution:
    """The distribution a region's in or out sharding gives its value."""
    return Distribution(tuple(sharding.dims))


def operand_distributions(op: ManualComputationOp) -> list[Distribution]:
    return [distribution(s) for s in op.in_shardings.shardings.data]


def result_distributions(op: ManualComputationOp) -> list[Distribution]:
    return [distribution(s) for s in op.out_shardings.shardings.data]


def region_mesh(op: ManualComputationOp, meshes: dict[str, Mesh]) -> Mesh:
    """The mesh `op`'s shardings name (by `meshes`, JAX's by name), which its
    manual axes must span: partir's program is per device over every axis,
    so only such a region is its body run per device."""
    names = {s.mesh_name.data for s in (*op.in_shardings.shardings, *op.out_shardings.shardings)}
    found = [meshes[n] for n in names if n in meshes]
    if not found:
        raise UnsupportedError(
            f"sdy.manual_computation{_where(op)}: its shardings name no mesh the program "
            "declares; give jax.shard_map the mesh partir.jit partitions over"
        )
    mesh = found[0]
    manual = set(op.manual_axes.names)
    unknown = [a for a in op.manual_axes.names if a not in mesh.axes]
    if unknown:
        raise UnsupportedError(
            f"sdy.manual_computation{_where(op)}: the nested jax.shard_map is manual over "
            f"{', '.join(map(quoted, unknown))}, which the mesh "
            f"({', '.join(map(quoted, mesh.axes))}) does not have; name the mesh's axes"
        )
    for sharding in (*op.in_shardings.shardings, *op.out_shardings.shardings):
        auto = [a for a in sharding.axes if a not in manual]
        if auto:
            raise UnsupportedError(
                f"sdy.manual_computation{_where(op)}: a spec splits over "
                f"{', '.join(map(quoted, auto))}, which the nested jax.shard_map is not manual "
                "over; partir runs its body whole over those axes: name them in axis_names, "
                "or leave them out of in_specs and out_specs"
            )
        if sharding.unreduced.data:
            raise UnsupportedError(
                f"sdy.manual_computation{_where(op)}: an unreduced out_spec; reduce inside "
                "the shard_map (jax.lax.psum) instead"
            )
    return mesh


def _group_axes(op: DeviceCollectiveOp, mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes whose devices `op`'s `replica_groups` gather (device ids
    row-major over the mesh, as JAX numbers a shard_map's devices)."""
    groups = {frozenset(g) for g in op.device_groups(mesh.size)}
    names = list(mesh.axes)
    for n in range(len(names) + 1):
        for axes in itertools.combinations(names, n):
            spanned = {frozenset(mesh.group(d, axes)) for d in range(mesh.size)}
            if spanned == groups:
                return axes
    raise UnsupportedError(
        f"{op_name(op)}{_where(op)} in a shard_map combines device groups that are no set of "
        f"mesh axes ({sorted(map(sorted, groups))}); name mesh axes in the jax.lax collective"
    )


def _permute_axes(
    op: stablehlo.CollectivePermuteOp, mesh: Mesh
) -> tuple[tuple[str, ...], list[tuple[int, int]]]:
    """The mesh axes a `ppermute`'s device pairs move along, and the pairs as
    positions in each group along them (the same in every group)."""
    pairs = op.pairs()
    devices = mesh.devices
    moved = {a for s, t in pairs for a in mesh.axes if devices[s][a] != devices[t][a]}
    axes = tuple(a for a in mesh.axes if a in moved)
    by_group: dict[tuple[int, ...], set[tuple[int, int]]] = {}
    for s, t in pairs:
        key = tuple(devices[s][a] for a in mesh.axes if a not in moved)
        by_group.setdefault(key, set()).add(
            (mesh.group_index(devices[s], axes), mesh.group_index(devices[t], axes))
        )
    shapes = {frozenset(v) for v in by_group.values()}
    groups = mesh.size // mesh.size_of(axes)
    if len(shapes) != 1 or len(by_group) != groups:
        raise UnsupportedError(
            f"{op_name(op)}{_where(op)} in a shard_map moves values between devices in a way "
            "that differs between groups; write the permutation over named mesh axes "
            "(jax.lax.ppermute(x, axis_name, perm))"
        )
    return axes, sorted(shapes.pop())


def _reduction(op: DeviceCollectiveOp, allowed: tuple[str, ...], what: str) -> str:
    kind = op.reduction()
    if kind not in allowed:
        raise UnsupportedError(
            f"{op_name(op)}{_where(op)} in a shard_map combines values with a body partir does "
            f"not know; partir keeps {what}: write the collective with one of them"
        )
    return kind


def _kept(op: DeviceCollectiveOp, mesh: Mesh) -> list[Operation]:
    """The `spmd` ops doing what JAX's collective `op` does: one per value it
    takes (`jax.lax.psum` of a pytree is one op over several)."""
    if isinstance(op, stablehlo.PartitionIdOp):
        index_type = op.result.type
        assert isinstance(index_type, TensorType)
        return [AxisIndexOp(tuple(mesh.axes), index_type)]  # the device's id, row-major
    if isinstance(op, stablehlo.CollectivePermuteOp):
        axes, pairs = _permute_axes(op, mesh)
        return [CollectivePermuteOp(v, axes, pairs) for v in op.operands]
    axes = _group_axes(op, mesh)
    if not axes:  # groups of one device: each keeps its own value
        return []
    kept: list[Operation] = []
    for value, result in zip(op.operands, op.results, strict=True):
        ty = result.type
        assert isinstance(ty, TensorType)
        if isinstance(op, stablehlo.AllGatherOp):
            kept.append(AllGatherOp(value, op.int_property("all_gather_dim"), axes, ty))
        elif isinstance(op, stablehlo.AllToAllOp):
            split, concat = op.int_property("split_dimension"), op.int_property("concat_dimension")
            if split == concat:  # the blocks trade places along one dim
                raise UnsupportedError(
                    f"{op_name(op)}{_where(op)} in a shard_map splits and concatenates dim "
                    f"{split}; partir keeps an all_to_all between two dims: write "
                    "jax.lax.all_to_all with split_axis != concat_axis"
                )
            kept.append(AllToAllOp(value, split, concat, axes, ty))
        elif isinstance(op, stablehlo.ReduceScatterOp):
            _reduction(op, ("sum",), "jax.lax.psum_scatter (a sum)")
            kept.append(ReduceScatterOp(value, op.int_property("scatter_dimension"), axes, ty))
        else:
            kind = _reduction(op, REDUCTIONS, "jax.lax.psum, pmax and pmin")
            kept.append(AllReduceOp(value, axes, kind))
    return kept


def _insert_before(op: Operation, at: Operation) -> None:
    block = at.parent_block()
    assert block is not None
    block.insert_op_before(op, at)


def _respread(
    value: SSAValue, dist: Distribution, at: ManualComputationOp, mesh: Mesh, *, gather: bool
) -> SSAValue:
    """`value` cut to this device's parts along each dim's axes in `dist`
    (`spmd.local_slice`), or the parts put together along them (`spmd.all_gather`)."""
    for dim, split in enumerate(dist.dims):
        if not split:
            continue
        ty = value.type
        assert isinstance(ty, TensorType)
        shape = list(ty.get_shape())
        n = mesh.size_of(split)
        shape[dim] = shape[dim] * n if gather else shape[dim] // n
        part = TensorType(ty.element_type, shape)
        kind = AllGatherOp if gather else LocalSliceOp
        op = kind(value, dim, split, part)
        op.location = at.location
        _insert_before(op, at)
        value = op.results[0]
    return value


def _inline_nested(inner: ManualComputationOp, outer: set[str], mesh: Mesh) -> None:
    """Replace a region nested in another by its body: its operands cut to
    each device's parts along its manual axes, its results gathered along
    them (`out_shardings`). Its axes and the outer region's make every axis
    of `mesh` manual, or some axis would be neither."""
    axes = set(inner.manual_axes.names)
    if (axes | outer) != set(mesh.axes) or axes & outer:
        raise UnsupportedError(
            f"sdy.manual_computation{_where(inner)}: a jax.shard_map nested in one manual "
            f"over {', '.join(map(quoted, sorted(outer)))} is manual over "
            f"{', '.join(map(quoted, sorted(axes)))}; partir inlines one over the remaining "
            "mesh axes (as axis_index writes it): write the kernel as one shard_map"
        )
    block = inner.body.block
    ins, outs = operand_distributions(inner), result_distributions(inner)
    for arg, value, dist in zip(block.args, inner.tensors, ins, strict=True):
        arg.replace_all_uses_with(_respread(value, dist, inner, mesh, gather=False))
    returned = block.last_op
    assert isinstance(returned, ReturnOp)
    outputs = list(returned.operands)
    for op in list(block.ops):
        if op is returned:
            break
        op.detach()
        _insert_before(op, inner)
    for result, value, dist in zip(inner.results, outputs, outs, strict=True):
        result.replace_all_uses_with(_respread(value, dist, inner, mesh, gather=True))
    inner.detach()
    inner.erase()


def _drop_trivial_constraints(region: ManualComputationOp) -> None:
    """JAX constrains the values of a body manual over some axes to be open
    over the others (`<@mesh, [{?}, {?}]>`, in its reducers too); partir runs
    the body whole over them, which such a constraint allows, so it goes. A
    constraint splitting over an axis there is refused: the body is not split."""
    for op in list(region.body.walk()):
        if isinstance(op, ShardingConstraintOp):
            if any(op.sharding.dims):
                raise UnsupportedError(
                    f"sdy.sharding_constraint{_where(op)} in a nested jax.shard_map splits over "
                    f"{', '.join(map(quoted, op.sharding.axes))}; partir runs the body whole "
                    "over the axes it is not manual over: move the constraint outside the "
                    "shard_map, or make the shard_map manual over that axis"
                )
            op.result.replace_all_uses_with(op.input)
            op.detach()
            op.erase()


def _scalar(value: SSAValue) -> int | None:
    owner = value.owner
    if not isinstance(owner, shlo.ConstantOp):
        return None
    found = [int(v) for v in owner.value.get_values()]
    return found[0] if len(set(found)) == 1 else None


def _axis_indices(pid: stablehlo.PartitionIdOp, mesh: Mesh) -> None:
    """`axis_index(a)` as JAX writes it, `partition_id / stride(a) % size(a)`
    (device ids row-major), becomes `spmd.axis_index over [a]`: a value the
    emitted program knows varies only along `a`."""
    strides = {a: mesh.size_of(list(mesh.axes)[i + 1 :]) for i, a in enumerate(mesh.axes)}
    for use in list(pid.result.uses):
        divide = use.operation
        if not (isinstance(divide, shlo.DivideOp) and use.index == 0):
            continue
        for inner in list(divide.result.uses):
            rem = inner.operation
            if not (isinstance(rem, shlo.RemainderOp) and inner.index == 0):
                continue
            stride, size = _scalar(divide.operands[1]), _scalar(rem.operands[1])
            axis = next(
                (a for a in mesh.axes if strides[a] == stride and mesh[a] == size), None
            )
            if axis is None:
                continue
            ty = rem.results[0].type
            assert isinstance(ty, TensorType)
            index = AxisIndexOp([axis], ty)
            index.location = rem.location
            _insert_before(index, rem)
            rem.results[0].replace_all_uses_with(index.result)
            rem.detach()
            rem.erase()
        if not divide.result.uses:
            divide.detach()
            divide.erase()


def _normalize_body(region: ManualComputationOp, mesh: Mesh) -> None:
    _drop_trivial_constraints(region)
    nested = [op for op in region.body.walk() if isinstance(op, ManualComputationOp)]
    for inner in reversed(nested):  # innermost first
        _inline_nested(inner, set(region.manual_axes.names), mesh)
    for pid in [op for op in region.body.walk() if isinstance(op, stablehlo.PartitionIdOp)]:
        _axis_indices(pid, mesh)
        if not pid.result.uses:
            pid.detach()
            pid.erase()
    for op in list(region.body.walk()):
        name = op_name(op)
        if isinstance(op, DeviceCollectiveOp):
            new = _kept(op, mesh)
            assert op.parent is not None
            for made in new:
                made.location = op.location
                op.parent.insert_op_before(made, op)
            values = [made.results[0] for made in new] if new else list(op.operands)
            for result, value in zip(op.results, values, strict=True):
                result.replace_all_uses_with(value)
            op.detach()
            op.erase()
        elif name in _OTHER_COLLECTIVES:
            raise UnsupportedError(
                f"{name}{_where(op)} in a nested jax.shard_map: partir keeps a shard_map "
                "whose collectives are psum, pmax, pmin, psum_scatter, all_gather, all_to_all, "
                "ppermute and axis_index; move this one outside the shard_map (partir inserts "
                "the collectives its partitioning needs)"
            )


def jax_meshes(module: ModuleOp) -> dict[str, Mesh]:
    """JAX's meshes the module declares (`sdy.mesh`), by name."""
    found: dict[str, Mesh] = {}
    for op in module.body.block.ops:
        if isinstance(op, MeshOp):
            ids = [i.data for i in op.mesh.device_ids.data]
            if ids and ids != sorted(ids):
                raise UnsupportedError(
                    f"JAX's mesh @{op.sym_name.data} orders its devices {ids}; partir lays a "
                    "mesh's devices out in order: use jax.make_mesh's default device order"
                )
            found[op.sym_name.data] = Mesh(op.mesh.axes) if op.mesh.axes else Mesh.single_device()
    return found


def manual_regions(module: Operation) -> list[ManualComputationOp]:
    return [op for op in module.walk() if isinstance(op, ManualComputationOp)]


MANUAL_COLLECTIVE = "the nested jax.shard_map (as written)"
"""What the report says a manual region's own collective is needed by."""

REGION_MESH = "mesh"
"""A normalised region's attribute: its mesh (`#sdy.mesh<[...]>`), which it
keeps when JAX's mesh declarations are gone (`partir.annotations`)."""


def mesh_of(op: ManualComputationOp) -> Mesh:
    """The mesh a region runs over: a normalised one's (`normalize_manual_regions`),
    else the JAX mesh its shardings name, declared in its module (`partir-opt`
    reading JAX's text, before any pass)."""
    found = op.attributes.get(REGION_MESH)
    module = op.get_toplevel_object()
    if not isinstance(found, MeshAttr) and isinstance(module, ModuleOp):
        meshes = jax_meshes(module)
        if meshes:
            return region_mesh(op, meshes)
    if not isinstance(found, MeshAttr):
        raise UnsupportedError(
            f"sdy.manual_computation{_where(op)} carries no mesh; partir reads nested "
            "shard_maps from JAX's import (partir.jit), which records it"
        )
    return Mesh(found.axes)


def _outermost(region: ManualComputationOp) -> bool:
    parent = region.parent_op()
    while parent is not None:
        if isinstance(parent, ManualComputationOp):
            return False
        parent = parent.parent_op()
    return True


def normalize_manual_regions(module: ModuleOp) -> None:
    """Check each manual region is one partir keeps, record its mesh on it
    and rewrite its body's collectives as partir's (the module docstring);
    regions done before are left as they are."""
    regions = [
        r for r in manual_regions(module)
        if REGION_MESH not in r.attributes and _outermost(r)
    ]
    if not regions:
        return
    meshes = jax_meshes(module)
    for region in regions:
        mesh = region_mesh(region, meshes)
        _normalize_body(region, mesh)
        region.attributes[REGION_MESH] = MeshAttr(mesh.axes)
