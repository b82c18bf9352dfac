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
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import onnx
from jax import lax
from jax.extend.core import ClosedJaxpr, JaxprEqn, jaxpr_as_fun

from dialects.distribution import Distribution
from dialects.functions import entry_function
from dialects.locations import source_location
from partir.importer import import_lowered, name_arguments, name_results, result_paths
from partir.onnx_interop.export import build_model
from partir.pipeline.equations import run_eqn, run_jaxpr

if TYPE_CHECKING:
    from dialects.mesh import Mesh
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
