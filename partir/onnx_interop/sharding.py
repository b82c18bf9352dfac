"""The ONNX multi-device proposal's sharding formalism, both ways.

One owner of how a partir `Distribution` on a `Mesh` reads as the proposal's
protos (onnx >= 1.18, IR version 11):

- the mesh is one `DeviceConfigurationProto` (its name, `num_devices`, a
  name per device saying its coordinates, `batch=0,model=1`); its axes and
  sizes, which the proto has no field for, are the model's metadata
  (`MESH_METADATA`, JSON), so a partir-exported model re-imports on its mesh;
- a value's distribution is one `ShardingSpecProto`: a `ShardedDimProto` per
  split dim (one `SimpleShardedDimProto`, `num_shards` the product of its
  axes' sizes), and per shard, in the proposal's order (the first sharded dim
  outermost), the device holding it or, where several do (duplication over
  the other axes), a negative key into `index_to_device_group_map`.
  A partial sum has no form in the proposal: its spec describes the summed
  value, as the formalism infers a reduction's output ("replicated on the
  devices of the reduction").

Reading a spec back (`distribution_of`) finds, per sharded dim, the ordered
mesh axes whose device blocks are exactly the spec's shards; a spec the mesh
cannot realise is an `OnnxShardingError` naming the node and the tensor.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence

import onnx

from dialects.distribution import Distribution
from dialects.errors import PartirValueError
from dialects.escaping import quoted
from dialects.mesh import Mesh

IR_VERSION = 11
"""The ONNX IR version that added the multi-device protos (May 2025)."""
OPSET = 23
"""The default-domain opset exported; the newest IR 11 supports."""
MESH_METADATA = "partir.mesh"
"""Model metadata key: JSON {configuration name: {axis: size, ...}}."""


class OnnxShardingError(PartirValueError):
    """An annotation partir cannot read or realise; the message names the node."""


def device_configuration(mesh: Mesh, name: str) -> onnx.DeviceConfigurationProto:
    """The mesh as the proposal's device configuration (devices row-major)."""
    config = onnx.DeviceConfigurationProto(name=name, num_devices=mesh.size)
    config.device.extend(
        ",".join(f"{axis}={coords[axis]}" for axis in mesh.axes) for coords in mesh.devices
    )
    return config


def mesh_metadata(meshes: Mapping[str, Mesh]) -> onnx.StringStringEntryProto:
    return onnx.StringStringEntryProto(
        key=MESH_METADATA, value=json.dumps({k: dict(m.axes) for k, m in meshes.items()})
    )


def meshes_of(model: onnx.ModelProto) -> dict[str, Mesh]:
    """The meshes a partir-exported model names per configuration (none otherwise)."""
    for entry in model.metadata_props:
        if entry.key == MESH_METADATA:
            table = json.loads(entry.value)
            return {name: Mesh(dict(axes)) for name, axes in table.items()}
    return {}


def sharding_spec(
    tensor: str, distribution: Distribution, mesh: Mesh, shape: Sequence[int]
) -> onnx.ShardingSpecProto:
    """`distribution` of the value `tensor` (of `shape`) as a ShardingSpecProto."""
    spec = onnx.ShardingSpecProto(tensor_name=tensor)
    split = [d for d, axes in enumerate(distribution.dims) if axes]
    parts = distribution.parts(mesh)
    for d in split:
        dim = spec.sharded_dim.add(axis=d)
        dim.simple_sharding.add(dim_value=shape[d], num_shards=parts[d])
    holders: dict[tuple[int, ...], list[int]] = {}
    for device in range(mesh.size):
        block = distribution.block_index(mesh, device)
        holders.setdefault(tuple(block[d] for d in split), []).append(device)
    for shard in itertools.product(*(range(parts[d]) for d in split)):
        devices = holders[shard]
        if len(devices) == 1:
            spec.device.append(devices[0])
        else:
            key = -1 - len(spec.index_to_device_group_map)
            spec.device.append(key)
            spec.index_to_device_group_map.add(key=key, value=devices)
    return spec


def shard_devices(spec: onnx.ShardingSpecProto, where: str) -> list[list[int]]:
    """Per shard, in the proposal's order, the devices holding it."""
    groups = {entry.key: list(entry.value) for entry in spec.index_to_device_group_map}
    return [groups.get(d, [d]) for d in spec.device]


def distribution_of(
    spec: onnx.ShardingSpecProto, shape: Sequence[int], mesh: Mesh, where: str
) -> Distribution:
    """The distribution over `mesh` that lays a value of `shape` out as `spec`
    says; `where` names the node and tensor in errors."""
    rank = len(shape)
    dims: list[tuple[int, int]] = []  # (dim, shards)
    for sharded in spec.sharded_dim:
        dim = sharded.axis + rank if sharded.axis < 0 else sharded.axis
        if not 0 <= dim < rank:
            raise OnnxShardingError(
                f"{where}: sharded axis {sharded.axis} is out of range for a tensor of "
                f"shape {list(shape)}"
            )
        shards = 1
        for simple in sharded.simple_sharding:
            shards *= simple.num_shards
        if shards < 1:
            raise OnnxShardingError(f"{where}: axis {dim} has {shards} shards; give at least 1")
        if shards > shape[dim]:
            raise OnnxShardingError(
                f"{where}: axis {dim} has size {shape[dim]} but {shards} shards: more shards "
                "than elements; shard a longer axis or use fewer shards"
            )
        if any(d == dim for d, _ in dims):
            raise OnnxShardingError(f"{where}: axis {dim} is sharded twice")
        dims.append((dim, shards))
    holders = shard_devices(spec, where)
    expected = 1
    for _, shards in dims:
        expected *= shards
    if len(holders) != expected:
        raise OnnxShardingError(
            f"{where}: {expected} shards but {len(holders)} device entries; list one device "
            "(or device group) per shard"
        )
    shard_of: dict[int, tuple[int, ...]] = {}
    order = itertools.product(*(range(s) for _, s in dims))
    for shard, devices in zip(order, holders, strict=True):
        for device in devices:
            if not 0 <= device < mesh.size:
                raise OnnxShardingError(
                    f"{where}: device {device} is not in the configuration's "
                    f"{mesh.size} devices"
                )
            if device in shard_of:
                raise OnnxShardingError(f"{where}: device {device} holds two shards")
            shard_of[device] = shard
    if len(shard_of) != mesh.size:
        missing = sorted(set(range(mesh.size)) - set(shard_of))
        raise OnnxShardingError(
            f"{where}: devices {missing} hold no shard; partir runs every node on every "
            "device of the mesh: list them (a shard's group may duplicate it)"
        )
    found = _realise(dims, shard_of, mesh, rank)
    if found is None:
        described = ", ".join(f"axis {d} in {s} shards" for d, s in dims) or "no split"
        raise OnnxShardingError(
            f"{where}: {described} on these devices cannot be realised on the mesh "
            f"{_mesh_text(mesh)} (devices row-major): the shard counts must be products of "
            "mesh axis sizes and each shard's devices one block of the mesh"
        )
    return found


def _realise(
    dims: list[tuple[int, int]], shard_of: dict[int, tuple[int, ...]], mesh: Mesh, rank: int
) -> Distribution | None:
    """The distribution whose device blocks are `shard_of`, trying each ordered
    choice of distinct mesh axes per sharded dim whose sizes multiply to its
    shard count (meshes have a few axes)."""
    choices = [[c for c in _axis_orders(mesh) if mesh.size_of(c) == s] for _, s in dims]
    for pick in itertools.product(*choices):
        used = [a for axes in pick for a in axes]
        if len(used) != len(set(used)):
            continue
        layout: list[tuple[str, ...]] = [() for _ in range(rank)]
        for (dim, _), axes in zip(dims, pick, strict=True):
            layout[dim] = tuple(axes)
        candidate = Distribution(tuple(layout))
        if all(
            tuple(candidate.block_index(mesh, device)[d] for d, _ in dims) == shard
            for device, shard in shard_of.items()
        ):
            return candidate
    return None


def _axis_orders(mesh: Mesh) -> list[tuple[str, ...]]:
    axes = list(mesh.axes)
    return [p for n in range(1, len(axes) + 1) for p in itertools.permutations(axes, n)]


def _mesh_text(mesh: Mesh) -> str:
    return "{" + ", ".join(f"{quoted(a)}: {n}" for a, n in mesh.axes.items()) + "}"
