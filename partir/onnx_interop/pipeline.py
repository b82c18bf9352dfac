"""Export a pipelined step as ONNX, each node on the stage that runs it.

The proposal's `pipeline_stage` is a node's annotation, so the graph must
have a node per layer for each layer's stage to be said: the export writes
the *global* step (the import stage, what `jax.jit` runs) with its two layer
loops unrolled on the IR (`rewrites.unroll`), layer `l`'s forward and
backward nodes on the stage that holds it, `l // (layers / stages)` (the
pipelined program splits the layer dim over the stage axis, major; under
the interleaved schedule, chunk `l // (layers / (stages k))` on stage
that `% stages`). Every
other op gets the stage the pipelined program runs it on when that is one
stage: the replay of the pipelining (partition, SPMD lowering, schedule, on
a numbered copy of the import, as `partir.onnx_interop.export` replays a
partition) says which stages' branches hold the op's copies
(`dialects.interpreter.positions`): the head on the last stage, the ops
after the backward loop on the first; the embedding and the optimizer
update run on every stage and get none. The replay gives the sharding
specs too (the stacked results split over the stage axis), and the graph
goes through the same StableHLO -> ONNX mapping (`build_model`), so
onnxruntime runs it and gets `jax.jit`'s numbers, ignoring the annotations
as the proposal allows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import onnx
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp
from xdsl.ir import Operation
from xdsl_jax.dialects import stablehlo as shlo

from dialects.functions import entry_function
from dialects.interpreter.positions import Positions
from dialects.mesh import Mesh
from partir.onnx_interop.export import (
    NODE_NUMBER,
    build_model,
    decided_shardings,
    number_ops,
    replayed,
    result_distributions,
)
from partir.pipeline.layer_loops import find_layer_loops
from partir.pipeline.schedule import recorded_schedule
from rewrites.unroll import unroll


def export_pipelined(
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
    per_chunk = loops.layers // (schedule.stages * schedule.chunks)
    layer_stage: dict[Operation, int] = {}
    for loop in (loops.forward, loops.backward):
        if loop is None:
            continue
        for j, ops in enumerate(unroll(graph, loop)):
            row = loop.trips - 1 - j if loop.reverse else j
            layer_stage.update(dict.fromkeys(ops, row // per_chunk % schedule.stages))
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
