"""Export a pipelined step as ONNX, each node on the stage the schedule runs it on.

The proposal's `pipeline_stage` is a node's annotation, so the graph must
have a node per layer for each layer's stage to be said: the export writes
the *global* step (what `jax.jit` runs) with its two layer loops unrolled,
layer `l`'s forward and backward ops traced under the JAX named scope of
stage `l // (layers / stages)` (`stage_scope`), and the head's ops that
read the forward loop's output (the last stage runs them,
`StepStructure.head_split`) under the last stage's. Each of these nodes
gets `pipeline_stage`; the embedding, the rest of the head and the
optimizer update run on every stage and get none (the stacked parts of the
update are split over the stage axis, which the stacked results' specs
say). The graph goes through the same StableHLO -> ONNX mapping as
`partir.onnx_interop.export` (`build_model`), so onnxruntime runs it and
gets `jax.jit`'s numbers, ignoring the annotations as the proposal allows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import onnx
from jax import lax
from jax.extend.core import ClosedJaxpr, JaxprEqn, jaxpr_as_fun
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp
from xdsl.ir import Operation
from xdsl_jax.dialects import stablehlo as shlo

from dialects.distribution import Distribution
from dialects.functions import entry_function
from dialects.interpreter.positions import Positions
from dialects.locations import source_location
from dialects.mesh import Mesh
from partir.importer import import_lowered, name_arguments, name_results, result_paths
from partir.onnx_interop.export import (
    NODE_NUMBER,
    build_model,
    decided_shardings,
    number_ops,
    replayed,
    result_distributions,
)
from partir.pipeline.equations import run_eqn, run_jaxpr
from partir.pipeline.layer_loops import find_layer_loops
from partir.pipeline.schedule import recorded_schedule
from rewrites.unroll import unroll

if TYPE_CHECKING:
    from partir.pipeline.schedule import Schedule
    from partir.pipeline.structure import StepStructure

STAGE_SCOPE = "partir_pipeline_stage_"
"""The named scope a stage's ops are traced under: `partir_pipeline_stage_3`."""


def stage_scope(stage: int) -> str:
    return f"{STAGE_SCOPE}{stage}"


def stage_of(name_stack: str | None) -> int | None:
    """The stage a name stack's scope says (the innermost), or None."""
    for segment in reversed((name_stack or "").split("/")):
        if segment.startswith(STAGE_SCOPE) and segment[len(STAGE_SCOPE) :].isdigit():
            return int(segment[len(STAGE_SCOPE) :])
    return None


def unrolled_step(
    closed: ClosedJaxpr, loops: Sequence[int], layer_scope: Callable[[int], str],
    scoped: dict[int, str],
) -> Callable[..., list[Any]]:
    """`closed` as a function of its inputs, with the scans at `loops` (equation
    indices) run one layer at a time, layer `l` under `layer_scope(l)`, and the
    equations in `scoped` under their scope."""

    def step(index: int, eqn: JaxprEqn, operands: list[Any]) -> list[Any]:
        if index in loops:
            return _unrolled_scan(eqn, operands, layer_scope)
        if index in scoped:
            with jax.named_scope(scoped[index]):
                return run_eqn(eqn, operands)
        return run_eqn(eqn, operands)

    return lambda *leaves: run_jaxpr(closed.jaxpr, closed.consts, leaves, step)


def _unrolled_scan(eqn: JaxprEqn, operands: list[Any], scope: Callable[[int], str]) -> list[Any]:
    """A `scan` equation run layer by layer (in reverse for a reverse scan),
    its per-layer outputs stacked back on a leading layer dim."""
    params = eqn.params
    consts, carries = params["num_consts"], params["num_carry"]
    length = params["length"]
    body = jaxpr_as_fun(params["jaxpr"])
    carry = operands[consts : consts + carries]
    xs = operands[consts + carries :]
    per_layer: list[list[Any]] = [[] for _ in range(length)]
    order = range(length - 1, -1, -1) if params["reverse"] else range(length)
    for layer in order:
        with jax.named_scope(scope(layer)):
            parts = [lax.index_in_dim(x, layer, keepdims=False) for x in xs]
            outs = body(*operands[:consts], *carry, *parts)
        carry, per_layer[layer] = list(outs[:carries]), list(outs[carries:])
    stacked = [jnp.stack(ys) for ys in zip(*per_layer, strict=True)]
    return [*carry, *stacked]


def export_pipelined(
    structure: StepStructure,
    schedule: Schedule,
    axis: str,
    out_tree: Any,
    mesh: Mesh,
    *,
    name: str = "partir_program",
) -> onnx.ModelProto:
    """The ONNX model of a pipelined step (`PipelinedLowered.to_onnx`: its
    structure, schedule, stage axis, result tree and mesh; see the module
    docstring)."""
    s = structure
    stages = schedule.stages
    per_stage = s.layers // stages
    late, _ = s.head_split()
    step = unrolled_step(
        s.full,
        (s.forward, s.backward),
        lambda layer: stage_scope(layer // per_stage),
        dict.fromkeys(late, stage_scope(stages - 1)),
    )
    shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in s.full.jaxpr.invars]
    traced = jax.jit(step, keep_unused=True).lower(*shapes)
    module = import_lowered(traced.compiler_ir("stablehlo"))
    entry = entry_function(module)
    name_arguments(entry, list(s.arg_names))
    outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in s.full.jaxpr.outvars]
    name_results(entry, result_paths(jax.tree_util.tree_unflatten(out_tree, outs)))
    placed = {
        number: stage
        for number, op in enumerate(entry.body.block.ops)
        if (stage := stage_of(source_location(op.location).name_stack)) is not None
    }
    results = [
        Distribution(((axis,), *(() for _ in out.shape[1:]))) if i in s.stacked_results else None
        for i, out in enumerate(outs)
    ]
    return build_model(module, mesh, {}, results, name=name, pipeline_stages=placed)


def export_pipelined_program(
    imported: ModuleOp,
    mesh: Mesh,
    partition: Callable[[ModuleOp], None],
    scheduled: Callable[[ModuleOp], None],
    *,
    name: str = "partir_program",
    expected_collectives: list[tuple[str, tuple[str, ...], int]] | None = None,
) -> onnx.ModelProto:
    """The ONNX model of a pipelined step: `imported` replayed through
    `partition`, the SPMD lowering and `scheduled` (the pipeline pass, which
    records its schedule); the graph is the global step with its layer loops
    unrolled (`rewrites.unroll`), each layer's nodes on the stage that holds
    the layer, every other op's on the one stage the pipelined program runs
    it on, if one (see the module docstring)."""
    replay = replayed(
        imported, partition, scheduled=scheduled, expected_collectives=expected_collectives
    )
    recorded = recorded_schedule(replay)
    if recorded is None:
        raise ValueError("the scheduled replay records no pipeline schedule")
    axis, schedule = recorded
    runs_on = _stages_running(replay, axis, schedule.stages, mesh)
    graph = imported.clone()
    number_ops(graph)
    loops = find_layer_loops(graph, axis)
    per_stage = loops.layers // schedule.stages
    layer_stage: dict[Operation, int] = {}
    for loop in (loops.forward, loops.backward):
        if loop is None:
            continue
        for j, ops in enumerate(unroll(graph, loop)):
            row = loop.trips - 1 - j if loop.reverse else j
            layer_stage.update(dict.fromkeys(ops, row // per_stage))
    ops = list(entry_function(graph).body.block.ops)
    position = {
        number.value.data: p
        for p, op in enumerate(ops)
        if isinstance(number := op.attributes.get(NODE_NUMBER), IntegerAttr)
    }
    decided = {
        position[n]: replace(d, producers=[position.get(k) if k is not None else None
                                           for k in d.producers])
        for n, d in decided_shardings(replay).items()
        if n in position
    }
    stages = {p: layer_stage[op] for p, op in enumerate(ops) if op in layer_stage}
    for n, running in runs_on.items():
        if n in position and len(running) == 1:
            stages[position[n]] = next(iter(running))
    return build_model(
        graph, mesh, decided, result_distributions(replay), name=name, pipeline_stages=stages
    )


def _stages_running(
    spmd: ModuleOp, axis: str, stages: int, mesh: Mesh
) -> dict[int, set[int]]:
    """Per numbered op of the pipelined `spmd` program, the stages that run it
    (one of its copies): those whose position picks every conditional around it."""
    positions = Positions(spmd, mesh)
    running: dict[int, set[int]] = {}
    for op in spmd.walk():
        number = op.attributes.get(NODE_NUMBER)
        if not isinstance(number, IntegerAttr):
            continue
        here = set(range(stages))
        child: Operation = op
        parent = op.parent_op()
        while parent is not None and not isinstance(parent, func.FuncOp):
            if positions.selector_axes(parent) == {axis}:
                region = child.parent_region()
                assert isinstance(parent, shlo.CaseOp | shlo.IfOp)
                here = {s for s in here if positions.branch(parent, {axis: s}) is region}
            child, parent = parent, parent.parent_op()
        running.setdefault(number.value.data, set()).update(here)
    return running
