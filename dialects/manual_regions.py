"""Manual regions (a nested `jax.shard_map`, `sdy.manual_computation`), read
into partir's terms.

A region's body is per-device code, and partir's own program is per device
over every mesh axis, so a region whose manual axes are all of the mesh is
its body run on each device's parts: its operands converted to the parts
`in_shardings` give, its results the parts `out_shardings` give. The body's
collectives come from JAX as `stablehlo.all_reduce` with device-id
`replica_groups`; `normalize_manual_regions` rewrites each as partir's
`spmd.all_reduce` over the mesh axes its groups span (`psum_scatter`,
`all_gather` and `ppermute` their `spmd` ops too), which the interpreters,
the SPMD lowering and the emitter already know. What partir cannot keep (a
region over some of the axes, a collective other than a sum) is an
`UnsupportedError` naming it and what to do.
"""

from __future__ import annotations

import itertools

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation

from dialects import stablehlo_collectives as stablehlo
from dialects.distribution import Distribution
from dialects.errors import UnsupportedError
from dialects.escaping import quoted
from dialects.locations import source_location
from dialects.mesh import Mesh
from dialects.names import op_name
from dialects.sdy import ManualComputationOp, MeshAttr, MeshOp, ShardingAttr
from dialects.spmd import (
    REDUCTIONS,
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    AxisIndexOp,
    CollectivePermuteOp,
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
    manual = op.manual_axes.names
    if set(manual) != set(mesh.axes):
        raise UnsupportedError(
            f"sdy.manual_computation{_where(op)}: the nested jax.shard_map is manual over "
            f"{', '.join(map(quoted, manual)) or 'no axes'} but the mesh has "
            f"{', '.join(map(quoted, mesh.axes))}; partir keeps a shard_map that is manual "
            "over every mesh axis: leave axis_names out of jax.shard_map (or name all axes)"
        )
    for sharding in (*op.in_shardings.shardings, *op.out_shardings.shardings):
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


def _normalize_body(region: ManualComputationOp, mesh: Mesh) -> None:
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
        elif name in _OTHER_COLLECTIVES or (
            isinstance(op, ManualComputationOp) and op is not region
        ):
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


def normalize_manual_regions(module: ModuleOp) -> None:
    """Check each manual region is one partir keeps, record its mesh on it
    and rewrite its body's collectives as partir's (the module docstring);
    regions done before are left as they are."""
    regions = [r for r in manual_regions(module) if REGION_MESH not in r.attributes]
    if not regions:
        return
    meshes = jax_meshes(module)
    for region in regions:
        mesh = region_mesh(region, meshes)
        _normalize_body(region, mesh)
        region.attributes[REGION_MESH] = MeshAttr(mesh.axes)
