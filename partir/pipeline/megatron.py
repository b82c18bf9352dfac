"""Megatron inside a stage: the stage's code partitioned by partir over a model axis.

With `Megatron(model)` beside a `Pipeline`, each stage's stacked parameters
(and the optimizer state mirroring them) are split over the model axis on
the dims `Megatron` picks for them. The three pieces of the step that read
them, the microbatch forward loop, the microbatch backward loop and the
update, are each taken as a function of their operands and partitioned by
partir itself (`partir.jit` with a `ManualPartition` of those operands over
the model axis alone); the pipeline's program calls each one's emitted
per-device `_body` inside its own shard_map, where the model axis is manual
too, so the loops' all-reduces over "model" are partir's. The rest of the
step (embedding, head) runs whole on every model shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.extend.core import JaxprEqn, Var

from dialects.errors import UnsupportedError
from dialects.escaping import quoted
from dialects.mesh import Mesh
from lowering.loader import load_source
from partir.lowered import lower
from partir.pipeline.equations import eqn_function, inputs_of, read_atoms, run_eqns
from partir.pipeline.structure import StepStructure
from partir.tactics import ManualPartition


def _model_dims(specs: Sequence[Any], axis: str) -> tuple[int | None, ...]:
    """Per PartitionSpec, the dim split over `axis` (None: none)."""
    found = []
    for spec in specs:
        dim = None
        for d, entry in enumerate(spec):
            if entry == axis or (isinstance(entry, tuple) and axis in entry):
                dim = d
        found.append(dim)
    return tuple(found)


@dataclass(frozen=True)
class Segment:
    """One piece of the step, partitioned over the model axis: its per-device
    body and, per operand and per result, the dim split over the axis."""

    body: Callable[..., Any]
    operand_dims: tuple[int | None, ...]
    result_dims: tuple[int | None, ...]

    def __call__(self, operands: Sequence[Any]) -> list[Any]:
        return list(self.body(*operands))


def partition_segment(
    fn: Callable[..., Any],
    avals: Sequence[Any],
    dims: dict[int, int],
    axis: str,
    parts: int,
    name: str,
) -> Segment:
    """`fn` on operands shaped `avals`, operand k split on `dims[k]` over `axis`,
    through partir; the operands keep the splits asked for."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    spec = {f"args/{k}": {d: axis} for k, d in dims.items()}
    tactics = [ManualPartition(spec)] if spec else []
    lowered = lower(fn, shapes, Mesh({axis: parts}), tactics, name=name)
    program = load_source(lowered.source, lowered.name)
    segment = Segment(
        program._body,
        _model_dims(program.IN_SPECS, axis),
        _model_dims(program.OUT_SPECS, axis),
    )
    wanted = tuple(dims.get(k) for k in range(len(avals)))
    assert segment.operand_dims == wanted, (segment.operand_dims, wanted)
    return segment


@dataclass(frozen=True)
class StageSegments:
    """The forward loop, the backward loop and the update, each partitioned."""

    axis: str
    parts: int
    forward: Segment
    backward: Segment
    update: Segment
    update_inputs: tuple[Any, ...]
    """The variables the update reads, in its operands' order: of the local
    trace, or with ZeRO of the ZeRO trace."""
    leaf_dims: dict[int, int]
    """Argument leaf -> the dim split over the model axis."""


def stage_segments(
    s: StepStructure, source: dict[int, tuple[str, int]], leaf_dims: dict[int, int],
    axis: str, parts: int,
) -> StageSegments:
    """Partition the three pieces (`source` is the backward loop's operand
    layout, `partir.pipeline.engine.backward_layout`). With ZeRO (`s.zero`)
    the update is the ZeRO trace's, on a data shard's share of the layers."""
    if s.across_layers:
        raise UnsupportedError(
            f"Pipeline with Megatron({quoted(axis)}): the update reduces over the layers of "
            "a stacked value (a global gradient norm, for one), which partir's split of the "
            "update over the model axis cannot complete across stages yet; drop Megatron "
            "beside the Pipeline, or the reduction"
        )
    micro_args = {v: i for i, v in enumerate(s.micro.jaxpr.invars)}
    fwd, bwd = s.micro_forward, s.micro_backward

    def arg_dims(eqn: JaxprEqn) -> dict[int, int]:
        return {
            k: leaf_dims[micro_args[v]]
            for k, v in enumerate(eqn.invars)
            if isinstance(v, Var) and micro_args.get(v) in leaf_dims
        }

    forward = partition_segment(
        eqn_function(fwd), [v.aval for v in fwd.invars], arg_dims(fwd), axis, parts, "forward"
    )
    carries = fwd.params["num_carry"]
    if any(d is not None for d in forward.result_dims[:carries]):
        raise UnsupportedError(
            "Pipeline with Megatron: the layer loop's carry comes out split over "
            f"{axis!r}; a stage hands its neighbour a whole activation"
        )
    backward_dims = arg_dims(bwd)
    for k, (kind, index) in source.items():
        made = forward.result_dims[index] if kind == "residual" else None
        if made is not None:
            backward_dims[k] = made  # kept as the forward made it
    backward = partition_segment(
        eqn_function(bwd), [v.aval for v in bwd.invars], backward_dims, axis, parts, "backward"
    )
    if any(d is not None for d in backward.result_dims[: bwd.params["num_carry"]]):
        raise UnsupportedError(
            f"Pipeline with Megatron: the backward loop's carry comes out split over {axis!r}"
        )
    update, inputs = _update_segment(s, backward, leaf_dims, axis, parts)
    return StageSegments(axis, parts, forward, backward, update, inputs, leaf_dims)


def _update_segment(
    s: StepStructure, backward: Segment, leaf_dims: dict[int, int], axis: str, parts: int
) -> tuple[Segment, tuple[Any, ...]]:
    """The equations after the backward loop, as a function of what they read:
    those of the stage-local trace, or with ZeRO of the trace whose stacked
    leaves are a data shard's share (its variables align with the local
    trace's, `StepStructure.zero_vars`, which is how its operands are found)."""
    jaxpr = (s.zero or s.local).jaxpr
    stands_for = s.zero_vars() if s.zero is not None else {}
    eqns = jaxpr.eqns[s.backward + 1 :]
    inputs = inputs_of(eqns, jaxpr.outvars)
    local_args = {v: i for i, v in enumerate(s.local.jaxpr.invars)}
    grads = {v: j for j, v in enumerate(s.backward_eqn.outvars)}
    dims: dict[int, int] = {}
    for k, mine in enumerate(inputs):
        var = stands_for.get(mine, mine)
        if local_args.get(var) in leaf_dims:
            dims[k] = leaf_dims[local_args[var]]
        elif var in grads and (split := backward.result_dims[grads[var]]) is not None:
            dims[k] = split

    def update(*values: Any) -> list[Any]:
        env = dict(zip(inputs, values, strict=True))
        run_eqns(eqns, env)
        return read_atoms(env, jaxpr.outvars)

    segment = partition_segment(update, [v.aval for v in inputs], dims, axis, parts, "update")
    return segment, tuple(inputs)
