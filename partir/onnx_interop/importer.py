"""Import an ONNX model, annotated or not, as a program partir partitions.

`partir.from_onnx(model_or_path)` converts the graph to a JAX function
(`from_onnx_ops`) of two dicts, the graph's inputs and its weight
initializers (`parameters`, so tactics can split them), returning a dict of
its outputs; each keyed by its ONNX name, so the program's leaves are
`inputs['x']`, `params['W1']`, `result['y']`.

The proposal's annotations become one tactic, `OnnxSharding` ("ONNX"): per
spec, per sharded dim, a tile over each of the mesh axes whose device blocks
the spec's shards are (`sharding.distribution_of`), on the graph input or
weight it names, or on the value a node computes (each node is traced under
a JAX named scope of its own, `node_scope`, which `plan.ScopedValue` finds).
The tiles are taken in graph order on the unpartitioned program, then
propagated: annotations that disagree are conflicts like any other, the
earlier action winning, each named by its tensor and node. The mesh is the
one a partir-exported model records for its configuration, or the one given.
An annotation naming an unknown configuration or a tensor the node does not
use, an axis out of range, shard counts and devices the mesh cannot realise
and more shards than a dimension has elements are `OnnxShardingError`s
naming the node and the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
import onnx
from onnx import helper, numpy_helper

from dialects.distribution import Distribution
from dialects.escaping import quoted, readable
from dialects.mesh import Mesh
from partir.api import jit
from partir.onnx_interop.from_onnx_ops import OPS, OnnxImportError, Value
from partir.onnx_interop.sharding import OnnxShardingError, distribution_of, meshes_of
from partir.plan import (
    Leaf,
    Plan,
    PlannedTile,
    ProgramView,
    ScopedValue,
    TacticError,
    tactic_label,
)
from partir.tactics import Tactic

STATIC_INPUTS: dict[str, set[int]] = {
    "Reshape": {1},
    "Expand": {1},
    "Slice": {1, 2, 3, 4},
    "ReduceMean": {1},
    "ReduceSum": {1},
    "ReduceMax": {1},
    "ReduceMin": {1},
    "ReduceProd": {1},
    "Unsqueeze": {1},
    "Squeeze": {1},
    "Split": {1},
    "ConstantOfShape": {0},
    "Range": {0, 1, 2},
}
"""Inputs ONNX passes as tensors that JAX needs known while tracing."""


def leaf_path(root: str, name: str) -> str:
    """The program's name of the dict entry `name` under `root` (as the importer
    names pytree paths: `jax.tree_util.keystr`)."""
    return root + jax.tree_util.keystr((jax.tree_util.DictKey(name),))


@dataclass(frozen=True)
class AnnotatedTile:
    """One split an annotation asks for: `tensor`'s `dim` over mesh `axis`, as
    node `node` says; `leaf` is the program's argument holding the tensor, or
    None for a value a node computes (traced under `node_scope(producer)`)."""

    node: str
    tensor: str
    leaf: str | None
    scope: str
    shape: tuple[int, ...]
    dim: int
    axis: str

    @property
    def label(self) -> str:
        return f"{readable(self.tensor)} at ONNX node {readable(self.node)}"


@dataclass(frozen=True)
class OnnxSharding(Tactic):
    """The model's sharding annotations as one tactic: every split each node's
    specs ask for, in graph order, all taken before propagation (on the
    unpartitioned program, where each tensor is one value); where they
    disagree, the earlier action wins and the conflict names both."""

    configuration: str
    tiles: tuple[AnnotatedTile, ...]

    @property
    def name(self) -> str:
        return "ONNX"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        leaves = {leaf.name: leaf for leaf in program.arguments}
        planned = []
        for tile in self.tiles:
            target: Leaf | ScopedValue
            if tile.leaf is None:
                target = ScopedValue(tile.scope, readable(tile.tensor), tile.shape)
            elif tile.leaf in leaves:
                target = leaves[tile.leaf]
            else:
                raise TacticError(f"{self.name}: the program has no argument {readable(tile.leaf)}")
            reason = f"ONNX node {readable(tile.node)} shards {readable(tile.tensor)}"
            planned.append(
                PlannedTile(target, tile.dim, tile.axis, "annotated", reason, label=tile.label)
            )
        axes = dict.fromkeys(tile.axis for tile in self.tiles)
        return Plan(self.name, tuple(planned), label=tactic_label(self.name, *axes))


def node_scope(index: int) -> str:
    """The JAX named scope node number `index` is traced in (never its name:
    user names do not become scopes)."""
    return f"onnx_node{index}"


@dataclass
class OnnxProgram:
    """An ONNX graph as a JAX function, its weights, and its annotations as tactics."""

    model: onnx.ModelProto
    input_names: tuple[str, ...]
    parameters: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    mesh: Mesh | None
    annotations: OnnxSharding | None = None
    """The annotations as a tactic (None: the model has none)."""
    specs: dict[tuple[str, str], Distribution] = field(default_factory=dict)
    """(node, tensor) -> the distribution the node's spec gives the tensor."""

    @property
    def tactics(self) -> list[Tactic]:
        return [] if self.annotations is None else [self.annotations]

    def function(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        """The graph on `inputs` (by graph input name) and `params` (weights);
        each node traced under its own named scope (`node_scope`)."""
        values = self._run(inputs, params)
        return {out.name: values[out.name] for out in self.model.graph.output}

    def _run(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Value]:
        values: dict[str, Value] = dict(self.constants)
        values.update(inputs)
        values.update(params)
        values[""] = None
        for index, node in enumerate(self.model.graph.node):
            with jax.named_scope(node_scope(index)):
                run_node(node, values)
        return values

    def example_inputs(self) -> dict[str, np.ndarray]:
        """Zeros of each graph input's type (for `lower` without data)."""
        types = _input_types(self.model.graph, self.input_names)
        return {name: np.zeros(shape, dtype) for name, (shape, dtype) in types.items()}

    def jit(self, *, mesh: Mesh | None = None, tactics: Sequence[Tactic] = ()) -> Any:
        """`partir.jit` of `function` with the annotations' tactics first, then `tactics`."""
        chosen = mesh or self.mesh
        if chosen is None:
            raise OnnxShardingError(
                "the model names no mesh: pass mesh=partir.Mesh({...}) to jit()"
            )
        return jit(self.function, mesh=chosen, tactics=[*self.tactics, *tactics])

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The graph on one device, by `jax.jit` (the reference for the partitioned run)."""
        return jax.jit(self.function)(dict(inputs), self.parameters)


def run_node(node: onnx.NodeProto, values: dict[str, Value]) -> None:
    attrs = {a.name: _attribute(a) for a in node.attribute}
    if node.op_type == "Constant":
        values[node.output[0]] = _constant(node, attrs)
        return
    op = OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if op is None:
        raise OnnxImportError(
            f"ONNX node {readable(node.name)}: op "
            f"{readable((node.domain + '.' if node.domain else '') + node.op_type)} has no "
            "conversion in partir; the ops it converts are "
            f"{', '.join(sorted(OPS))}, Constant"
        )
    try:
        outputs = op([values[name] for name in node.input], attrs)
    except OnnxImportError as err:
        raise OnnxImportError(f"ONNX node {readable(node.name)} ({node.op_type}): {err}") from None
    for name, value in zip(node.output, outputs, strict=False):
        if name:
            values[name] = value


def _attribute(attribute: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attribute)
    return value.decode() if isinstance(value, bytes) else value


def _constant(node: onnx.NodeProto, attrs: dict[str, Any]) -> np.ndarray:
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    for key, dtype in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(list(attrs[key]), dtype=dtype)
    raise OnnxImportError(f"ONNX node {readable(node.name)}: a Constant partir cannot read")


def _shape(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = info.type.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        raise OnnxImportError(
            f"graph input {readable(info.name)} has a symbolic shape; partir partitions "
            "static shapes: export the model with fixed input shapes"
        )
    return tuple(d.dim_value for d in dims)


def from_onnx(
    model_or_path: onnx.ModelProto | str | Path,
    *,
    mesh: Mesh | Mapping[str, int] | None = None,
    configuration: str | None = None,
) -> OnnxProgram:
    """Read an ONNX model as a program partir partitions; see the module docstring.

    `mesh` is needed for an annotated model that does not record its mesh
    (one partir did not write); `configuration` picks one of several device
    configurations (by default the only one)."""
    model = (
        model_or_path
        if isinstance(model_or_path, onnx.ModelProto)
        else onnx.load(str(model_or_path))
    )
    graph = model.graph
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    input_names = tuple(i.name for i in graph.input if i.name not in initializers)
    parameters, constants = _split_initializers(graph, initializers)
    chosen, config_name = _choose_mesh(model, mesh, configuration)
    program = OnnxProgram(model, input_names, parameters, constants, chosen)
    traced = _trace(program)
    if config_name is not None and chosen is not None:
        _read_annotations(program, traced, chosen, config_name)
    return program


def _split_initializers(
    graph: onnx.GraphProto, initializers: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Float initializers of rank >= 1 that some node computes with are
    parameters (program arguments, which tactics can split); the rest (shapes,
    axes, indices, scalars) stay constants."""
    dynamic = {
        name
        for node in graph.node
        for k, name in enumerate(node.input)
        if k not in STATIC_INPUTS.get(node.op_type, set())
    }
    parameters, constants = {}, {}
    for name, array in initializers.items():
        if name in dynamic and array.dtype.kind == "f" and array.ndim >= 1:
            parameters[name] = array
        else:
            constants[name] = array
    return parameters, constants


def _choose_mesh(
    model: onnx.ModelProto, mesh: Mesh | Mapping[str, int] | None, configuration: str | None
) -> tuple[Mesh | None, str | None]:
    given = None if mesh is None else mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    configs = {c.name: c for c in model.configuration}
    if not configs:
        return given, None
    if configuration is None:
        if len(configs) > 1:
            raise OnnxShardingError(
                f"the model has {len(configs)} device configurations "
                f"({', '.join(map(quoted, configs))}): pick one with configuration="
            )
        configuration = next(iter(configs))
    if configuration not in configs:
        raise OnnxShardingError(
            f"no device configuration {quoted(configuration)}; the model has "
            f"{', '.join(map(quoted, configs))}"
        )
    recorded = meshes_of(model).get(configuration)
    chosen = given or recorded
    if chosen is None:
        if any(node.device_configurations for node in model.graph.node):
            count = configs[configuration].num_devices
            raise OnnxShardingError(
                f"device configuration {quoted(configuration)} has {count} devices but no "
                f"mesh axes: pass mesh=partir.Mesh({{...}}) with {count} devices"
            )
        return None, None
    if chosen.size != configs[configuration].num_devices:
        raise OnnxShardingError(
            f"device configuration {quoted(configuration)} has "
            f"{configs[configuration].num_devices} devices, the mesh {dict(chosen.axes)} "
            f"{chosen.size}"
        )
    return chosen, configuration


@dataclass
class Traced:
    """What an abstract trace of the graph says of each value."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    static: set[str] = field(default_factory=set)
    """Values known while tracing (constants, shape arithmetic): nothing to tile."""
    origin: dict[str, str] = field(default_factory=dict)
    """Value -> the earlier value it is (an Identity's output is its input)."""


def _trace(program: OnnxProgram) -> Traced:
    """Every value's shape and whether it is static or another value under a
    new name, by tracing the graph abstractly (which also checks that each
    node converts)."""
    traced = Traced()

    def run(inputs: dict[str, Any], params: dict[str, Any]) -> int:
        values = program._run(inputs, params)
        first: dict[int, str] = {}
        for name, value in values.items():
            if not name:
                continue
            traced.shapes[name] = tuple(np.shape(value))
            if isinstance(value, np.ndarray | np.generic):
                traced.static.add(name)
            elif id(value) in first:
                traced.origin[name] = first[id(value)]
            else:
                first[id(value)] = name
        return 0

    graph = program.model.graph
    inputs = {
        name: jax.ShapeDtypeStruct(shape, dtype)
        for name, (shape, dtype) in _input_types(graph, program.input_names).items()
    }
    jax.eval_shape(run, inputs, program.parameters)
    return traced


def _input_types(
    graph: onnx.GraphProto, names: tuple[str, ...]
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {
        i.name: (_shape(i), helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        for i in graph.input
        if i.name in names
    }


def _read_annotations(
    program: OnnxProgram, traced: Traced, mesh: Mesh, configuration: str
) -> None:
    graph = program.model.graph
    known = {c.name for c in program.model.configuration}
    producer = {out: k for k, node in enumerate(graph.node) for out in node.output}
    tiles: list[AnnotatedTile] = []
    for node in graph.node:
        who = f"ONNX node {readable(node.name)}"
        for config in node.device_configurations:
            if config.configuration_id not in known:
                raise OnnxShardingError(
                    f"{who}: annotation names device configuration "
                    f"{quoted(config.configuration_id)}, which the model does not define "
                    f"(it has {', '.join(map(quoted, sorted(known))) or 'none'})"
                )
            if config.configuration_id != configuration:
                continue
            for spec in config.sharding_spec:
                tensor = spec.tensor_name
                where = f"{who}: tensor {readable(tensor)}"
                if tensor not in (*node.input, *node.output):
                    raise OnnxShardingError(
                        f"{where} is neither an input nor an output of the node"
                    )
                dist = distribution_of(spec, traced.shapes[tensor], mesh, where)
                program.specs[(node.name, tensor)] = dist
                source = traced.origin.get(tensor, tensor)
                if source in traced.static:
                    continue  # a constant: each device takes its part locally
                leaf = _leaf_of(program, source)
                scope = node_scope(producer.get(source, -1))
                for dim, axes in enumerate(dist.dims):
                    for axis in axes:
                        tiles.append(
                            AnnotatedTile(node.name, source, leaf, scope,
                                          traced.shapes[tensor], dim, axis)
                        )
    if tiles:
        program.annotations = OnnxSharding(configuration, tuple(tiles))


def _leaf_of(program: OnnxProgram, tensor: str) -> str | None:
    if tensor in program.input_names:
        return leaf_path("inputs", tensor)
    if tensor in program.parameters:
        return leaf_path("params", tensor)
    return None
