"""Export a partitioned program as an ONNX model with the proposal's annotations.

The graph is the *global* program (the import stage, op by op through
`to_onnx_ops`), so any ONNX runtime runs it and gets `jax.jit`'s numbers;
the multi-device annotations ride on its nodes and change nothing else, as
the proposal requires:

- one `DeviceConfigurationProto` for the mesh (`sharding.device_configuration`);
- on each node, a `NodeDeviceConfigurationProto` with a `ShardingSpecProto`
  per input and output whose distribution partir decided.

The distributions are read from the SPMD program, the one place partir
records them (each op's `dist`, each argument's and collective's type,
`dialects/spmd.py`): an input's spec is the distribution the SPMD op reads it
in (after any collective the lowering inserted, which the formalism leaves
implicit: "the input is repartitioned, as necessary"), an output's the
distribution the op produces. To know which SPMD op each node came from,
the export replays the partition on a copy of the import whose ops carry
their node number (`NODE_NUMBER`, a discardable attribute that rewrites and
the lowering keep), as `Lowered.stages` replays it; the replay's collectives
are checked to be the emitted program's. Where the SPMD program records no
global distribution for a value (the lowering leaves a value unannotated when
its relation to a loop is unknown, e.g. between attention's head reshapes),
it is projected from the op's operands through the op's rule and kept only
if it gives the local type the SPMD op holds (`global_distributions`); where
that fails too (a constant broadcast into a split shape), the spec is left
out, which the formalism allows: a backend infers it from the producer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import onnx
from onnx import helper
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, i64
from xdsl.ir import Attribute, BlockArgument, Operation, OpResult, SSAValue
from xdsl.passes import PassPipeline

from dialects.context import make_context
from dialects.distribution import Distribution
from dialects.functions import NAME_ATTR, entry_function
from dialects.mesh import Mesh
from dialects.sdy import ShardingConstraintOp
from dialects.spmd import DTensorType, mesh_of, result_dtensors
from lowering.collectives import collectives
from lowering.to_spmd import LowerToSpmdPass
from partir.onnx_interop.sharding import (
    IR_VERSION,
    OPSET,
    device_configuration,
    mesh_metadata,
    sharding_spec,
)
from partir.onnx_interop.to_onnx_ops import GraphBuilder, export_op, onnx_type, shape_of
from rewrites.projection import project, result_distribution
from rewrites.registry import rule_for

NODE_NUMBER = "partir.onnx_node"
"""The discardable attribute numbering the import's ops for the export's replay."""
CONFIGURATION = "partir_mesh"
"""The name of the exported device configuration (`configuration_id` on nodes)."""


@dataclass
class DecidedSharding:
    """What the SPMD program says of one imported op: per operand and for the
    result, the distributed type it was read or made in (None: not recorded);
    per operand, the numbered op whose SPMD result it reads directly (None:
    a collective or an argument); the result's local type (what a device holds)."""

    operands: list[DTensorType | None] = field(default_factory=list)
    result: DTensorType | None = None
    producers: list[int | None] = field(default_factory=list)
    local: Attribute | None = None


def number_ops(module: ModuleOp) -> list[Operation]:
    """Number the entry function's top-level ops (`NODE_NUMBER`); returns them."""
    ops = list(entry_function(module).body.block.ops)
    for n, op in enumerate(ops):
        op.attributes[NODE_NUMBER] = IntegerAttr(n, i64)
    return ops


def _dtensor_of(value: SSAValue) -> DTensorType | None:
    if isinstance(value, BlockArgument):
        return value.type if isinstance(value.type, DTensorType) else None
    assert isinstance(value, OpResult)
    return result_dtensors(value.owner)[value.index]


def decided_shardings(spmd: ModuleOp) -> dict[int, DecidedSharding]:
    """Per numbered op, the distributions the SPMD program records for it."""
    decided: dict[int, DecidedSharding] = {}
    for op in entry_function(spmd).body.block.ops:
        number = op.attributes.get(NODE_NUMBER)
        if not isinstance(number, IntegerAttr) or number.value.data in decided:
            continue
        results = result_dtensors(op) if op.results else [None]
        decided[number.value.data] = DecidedSharding(
            [_dtensor_of(v) for v in op.operands],
            results[0],
            [_number_of(v) for v in op.operands],
            op.results[0].type if op.results else None,
        )
    return decided


def _number_of(value: SSAValue) -> int | None:
    if isinstance(value, OpResult):
        number = value.owner.attributes.get(NODE_NUMBER)
        if isinstance(number, IntegerAttr):
            return number.value.data
    return None


def global_distributions(
    ops: list[Operation], decided: Mapping[int, DecidedSharding], mesh: Mesh
) -> dict[int, tuple[list[Distribution | None], Distribution | None]]:
    """Per numbered op, the global distributions of its operands and result.

    The SPMD program's record where it describes the import's value (its
    global type); where it does not (a value whose relation to a loop the
    lowering left unknown), the result's is projected from the operands' known
    ones through the op's rule (`rewrites.projection`, as the lowering projects
    them) and kept only if it gives exactly the local type the SPMD op holds."""
    found: dict[int, tuple[list[Distribution | None], Distribution | None]] = {}
    for number, op in enumerate(ops):
        sharding = decided.get(number)
        if sharding is None or not op.results:
            continue
        operands: list[Distribution | None] = []
        for k, (value, dtensor) in enumerate(zip(op.operands, sharding.operands, strict=True)):
            dist = _global(dtensor, value)
            producer = sharding.producers[k]
            if dist is None and producer is not None and producer in found:
                dist = found[producer][1]
            operands.append(dist)
        result = _global(sharding.result, op.results[0])
        if result is None:
            result = _projected(op, operands, sharding.local, mesh)
        found[number] = (operands, result)
    return found


def _projected(
    op: Operation, operands: list[Distribution | None], local: Attribute | None, mesh: Mesh
) -> Distribution | None:
    rule = rule_for(op)
    known = [d for d in operands if d is not None]
    if rule is None or not isinstance(local, TensorType) or not known:
        return None
    if any(d.partial for d in known):
        return None
    dist, lost = result_distribution(rule, project(rule, operands))
    if lost:
        return None
    shape = shape_of(op.results[0])
    parts = dist.parts(mesh)
    if any(n % k for n, k in zip(shape, parts, strict=True)):
        return None
    expected = tuple(n // k for n, k in zip(shape, parts, strict=True))
    return dist if expected == tuple(local.get_shape()) else None


def _global(dtensor: DTensorType | None, value: SSAValue) -> Distribution | None:
    """`dtensor`'s distribution if it describes `value` (the same global type)."""
    if dtensor is None or dtensor.global_type != value.type:
        return None
    return dtensor.distribution


def export_module(
    imported: ModuleOp,
    mesh: Mesh | None,
    partition: Callable[[ModuleOp], None],
    *,
    name: str = "partir_program",
    expected_collectives: list[tuple[str, tuple[str, ...], int]] | None = None,
    pipeline_stages: Mapping[int, int] | None = None,
) -> onnx.ModelProto:
    """The ONNX model of `imported` (a module of the import stage), annotated
    with the distributions `partition` (the schedule, applied in place) and the
    SPMD lowering give it on `mesh` (None: the mesh `partition` declares).

    `pipeline_stages` (op number -> stage): each numbered op's nodes get
    `pipeline_stage` (what `partir.onnx_interop.pipeline` gives `build_model`
    for a pipelined step).
    """
    replay = replayed(imported, partition, expected_collectives=expected_collectives)
    decided = decided_shardings(replay)
    chosen = mesh or mesh_of(replay)
    return build_model(
        imported,
        chosen,
        decided,
        result_distributions(replay),
        name=name,
        pipeline_stages=pipeline_stages,
    )


def replayed(
    imported: ModuleOp,
    partition: Callable[[ModuleOp], None],
    *,
    scheduled: Callable[[ModuleOp], None] | None = None,
    expected_collectives: list[tuple[str, tuple[str, ...], int]] | None = None,
) -> ModuleOp:
    """The SPMD program of a numbered copy of `imported` (`number_ops`):
    `partition`ed, lowered, then `scheduled` (a pipeline pass), its
    collectives checked to be `expected_collectives`."""
    replay = imported.clone()
    number_ops(replay)
    partition(replay)
    PassPipeline((LowerToSpmdPass(),)).apply(make_context(), replay)
    if scheduled is not None:
        scheduled(replay)
    if expected_collectives is not None:
        replayed = [(c.kind, c.axes, c.bytes_per_device) for c in collectives(replay)]
        assert replayed == expected_collectives, "the replayed partition differs"
    return replay


def result_distributions(spmd: ModuleOp) -> list[Distribution | None]:
    """The distribution of each result of the SPMD program's entry function."""
    return [
        t.distribution if isinstance(t, DTensorType) else None
        for t in entry_function(spmd).function_type.outputs.data
    ]


def build_model(
    imported: ModuleOp,
    mesh: Mesh,
    decided: Mapping[int, DecidedSharding],
    results: list[Distribution | None],
    *,
    name: str = "partir_program",
    pipeline_stages: Mapping[int, int] | None = None,
) -> onnx.ModelProto:
    """The ONNX model of `imported` with the specs `decided` gives its ops and
    `results` (the SPMD function's result types) its outputs."""
    entry = entry_function(imported)
    builder = GraphBuilder()
    inputs = []
    for i, arg in enumerate(entry.body.block.args):
        label = _attr_name(entry.arg_attrs, i) or f"arg{i}"
        builder.names[arg] = builder.fresh(label)
        inputs.append(_value_info(builder.names[arg], arg))
    ops = list(entry.body.block.ops)
    returned: list[SSAValue] = []
    for number, op in enumerate(ops):
        if op.name == "func.return":
            returned = list(op.operands)
            continue
        if isinstance(op, ShardingConstraintOp):  # an annotation: its value, now decided
            builder.names[op.results[0]] = builder.name(op.input)
            continue
        builder.op_number = number
        builder.names[op.results[0]] = export_op(builder, op)
    outputs = []
    for i, value in enumerate(returned):
        label = builder.fresh(_attr_name(entry.res_attrs, i) or f"result{i}")
        builder.op_number = -1
        node = helper.make_node("Identity", [builder.name(value)], [label], name=f"output_{i}")
        dist = results[i]
        if dist is not None:
            node.device_configurations.add(configuration_id=CONFIGURATION).sharding_spec.extend(
                sharding_spec(t, dist, mesh, shape_of(value)) for t in (*node.input, label)
            )
        builder.nodes.append(node)
        builder.node_ops.append(-1)
        outputs.append(_value_info(label, value))
    _annotate(builder, ops, global_distributions(ops, decided, mesh), mesh, pipeline_stages or {})
    used = {name for node in builder.nodes for name in node.input}
    initializers = [t for t in builder.initializers if t.name in used]
    graph = helper.make_graph(builder.nodes, name, inputs, outputs, initializers)
    model = helper.make_model(
        graph,
        ir_version=IR_VERSION,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="partir",
    )
    model.configuration.append(device_configuration(mesh, CONFIGURATION))
    model.metadata_props.append(mesh_metadata({CONFIGURATION: mesh}))
    onnx.checker.check_model(model, full_check=True)
    return model


def _annotate(
    builder: GraphBuilder,
    ops: list[Operation],
    layouts: Mapping[int, tuple[list[Distribution | None], Distribution | None]],
    mesh: Mesh,
    stages: Mapping[int, int],
) -> None:
    """Each node of a numbered op gets a spec for each of its inputs that is
    an operand of the op, and for its output if that is the op's result."""
    for node, number in zip(builder.nodes, builder.node_ops, strict=True):
        if number < 0:
            continue
        op = ops[number]
        known: dict[str, tuple[Distribution, SSAValue]] = {}
        if number in layouts:
            operands, result_dist = layouts[number]
            for value, dist in zip(op.operands, operands, strict=True):
                if dist is not None:
                    known.setdefault(builder.name(value), (_summed(dist), value))
            result = op.results[0]
            if result_dist is not None and builder.names.get(result) == node.output[0]:
                known[node.output[0]] = (_summed(result_dist), result)
        specs = [
            sharding_spec(tensor, dist, mesh, shape_of(value))
            for tensor in (*node.input, *node.output)
            if tensor in known
            for dist, value in [known[tensor]]
        ]
        if not specs and number not in stages:
            continue
        config = node.device_configurations.add(configuration_id=CONFIGURATION)
        config.sharding_spec.extend(specs)
        if number in stages:
            config.pipeline_stage = stages[number]


def _summed(dist: Distribution) -> Distribution:
    """A partial sum as the formalism sees a reduction's output: the summed
    value, replicated over the axes it was partial over."""
    return dist.summed(dist.partial)


def _attr_name(attrs: object, index: int) -> str | None:
    if attrs is None:
        return None
    entry = attrs.data[index]  # type: ignore[attr-defined]
    value = entry.data.get(NAME_ATTR)
    return value.data if value is not None else None


def _value_info(name: str, value: SSAValue) -> onnx.ValueInfoProto:
    assert isinstance(value.type, TensorType)
    return helper.make_tensor_value_info(name, onnx_type(value), list(shape_of(value)))
