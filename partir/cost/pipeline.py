"""The predicted step of a pipelined program: the bubble, and memory per stage.

A schedule of `stages` S and `microbatches` M runs M + S - 1 forward and as
many backward time steps (`Schedule.steps`); a time step lasts one
stage's forward (or backward) of one microbatch on its layers, the same
on every stage. So the loops take (M + S - 1)(t_f + t_b) where the work is
M (t_f + t_b): the stages idle (S - 1)/(M + S - 1) of the time, GPipe and
1F1B alike. t_f and t_b are this cost model's estimates (`simulate`) of
the microbatch forward and backward loops on one stage's layers; the
rest of the step (the head, the update on the stage's layers) is the
microbatch step's estimate less the two loops. Communication: one
collective permute of a microbatch's activation (or gradient) per time
step that sends one (α + bytes/β on the stage axis' link), and, with a
data-parallel axis, the all-reduce of each stage's gradients over it.

Memory per stage: its layers' parameters and optimizer state, and
`Schedule.slots` microbatches' buffers (the activation received, the
forward loop's residuals, the gradient received), which is where 1F1B
(about S slots) saves over GPipe (M).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
from jax.extend.core import jaxpr_as_fun

from partir.cost.collective_costs import collective_seconds
from partir.cost.profile import Profile
from partir.mesh import Mesh
from partir.pipeline.equations import eqn_function
from partir.pipeline.structure import avals_bytes
from partir.simulation import simulate
from partir.tactics import ManualPartition

if TYPE_CHECKING:
    from partir.pipeline.megatron import Segment, StageSegments
    from partir.pipeline.schedule import Schedule
    from partir.pipeline.structure import StepStructure


@dataclass(frozen=True)
class PipelineEstimate:
    """A pipelined step predicted on one profile (per device)."""

    profile: str
    schedule: str
    stages: int
    microbatches: int
    steps: int
    forward_seconds: float
    """One stage's forward loop on one microbatch."""
    backward_seconds: float
    other_seconds: float
    """The step outside the loops on one stage (head, update of its layers)."""
    permute_seconds: float
    """All the collective permutes of one step on the stage axis."""
    data_seconds: float
    """The gradient all-reduce over the data-parallel axis."""
    activation_bytes: int
    """The buffers a stage holds for its in-flight microbatches."""
    parameter_bytes: int
    """A stage's stacked leaves (its layers' parameters and optimizer state)."""

    @property
    def bubble(self) -> float:
        """(stages - 1) / (microbatches + stages - 1)."""
        return (self.stages - 1) / (self.microbatches + self.stages - 1)

    @property
    def loop_seconds(self) -> float:
        return self.steps / 2 * (self.forward_seconds + self.backward_seconds)

    @property
    def idle_seconds(self) -> float:
        return self.bubble * self.loop_seconds

    @property
    def compute_seconds(self) -> float:
        return self.loop_seconds + self.other_seconds

    @property
    def comm_seconds(self) -> float:
        return self.permute_seconds + self.data_seconds

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.comm_seconds

    @property
    def peak_bytes(self) -> int:
        return self.activation_bytes + self.parameter_bytes

    def __str__(self) -> str:
        ms = 1e3
        return (
            f"estimate on {self.profile}: {self.seconds * ms:.3f} ms per step "
            f"({self.schedule}, {self.stages} stages x {self.microbatches} microbatches)\n"
            f"  layer loops  {self.loop_seconds * ms:.3f} ms: {self.steps} time steps of "
            f"forward {self.forward_seconds * ms:.4f} ms / backward "
            f"{self.backward_seconds * ms:.4f} ms, idle {self.idle_seconds * ms:.3f} ms "
            f"(bubble {self.bubble:.1%})\n"
            f"  outside      {self.other_seconds * ms:.3f} ms (head, update)\n"
            f"  permutes     {self.permute_seconds * ms:.3f} ms; stacked gradients over "
            f"the data axis {self.data_seconds * ms:.3f} ms\n"
            f"  memory/stage {self.activation_bytes / 2**20:.2f} MiB in-flight microbatches + "
            f"{self.parameter_bytes / 2**20:.2f} MiB stacked leaves"
        )


ONE_DEVICE = {"device": 1}
"""The mesh a stage's own work is estimated on: it runs on one device."""


def _loop_seconds(
    eqn: Any, profile: Profile, segments: StageSegments | None = None,
    segment: Segment | None = None,
) -> float:
    """The estimate of one `scan` equation alone: on one device, or split over
    the model axis as `segment` is (its collectives included)."""
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    fn = eqn_function(eqn)
    if segments is None or segment is None:
        return simulate(fn, avals, ONE_DEVICE, [], profile).compute_seconds
    spec = {
        f"args/{k}": {d: segments.axis} for k, d in enumerate(segment.operand_dims) if d is not None
    }
    found = simulate(fn, avals, {segments.axis: segments.parts}, [ManualPartition(spec)], profile)
    return found.seconds


def estimate_pipeline(
    structure: StepStructure,
    schedule: Schedule,
    axis: str,
    data_axis: str | None,
    mesh: Mesh,
    profile: Profile,
    zero: int = 0,
    segments: StageSegments | None = None,
) -> PipelineEstimate:
    """With `zero` (a ZeRO stage over `data_axis`), the stacked gradients are
    reduce-scattered and the updated layers all-gathered instead of one
    all-reduce, and a stage holds its share of the optimizer state (and at
    stage 3 of the parameters). With
    `segments` (Megatron), a time step lasts the loop split over the model
    axis as partir splits it, its all-reduces included, and a stage holds
    its model shard of the leaves Megatron splits."""
    micro = structure.micro
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in micro.jaxpr.invars]
    whole = simulate(jaxpr_as_fun(micro), avals, ONE_DEVICE, [], profile).compute_seconds
    forward = _loop_seconds(structure.micro_forward, profile)
    backward = _loop_seconds(structure.micro_backward, profile)
    other = max(0.0, whole - forward - backward)
    if segments is not None:
        forward = _loop_seconds(structure.micro_forward, profile, segments, segments.forward)
        backward = _loop_seconds(structure.micro_backward, profile, segments, segments.backward)
    axes = dict(mesh.axes)
    stage_link = profile.axis_levels(axes, (axis,))
    fwd, bwd = structure.micro_forward, structure.micro_backward
    act = grad = structure.activation_bytes
    permutes = sum(
        bool(schedule.forward_sends(t)) * collective_seconds("collective_permute", act, stage_link)
        + bool(schedule.backward_sends(t))
        * collective_seconds("collective_permute", grad, stage_link)
        for t in range(schedule.steps)
    )
    data = 0.0
    if data_axis is not None:
        split = segments.backward.result_dims if segments is not None else ()
        ys = sum(  # the stacked gradients, each stage's model shard of them with Megatron
            avals_bytes([v.aval]) // (segments.parts if segments and split[j] is not None else 1)
            for j, v in enumerate(bwd.outvars)
            if j >= bwd.params["num_carry"]
        )
        data_link = profile.axis_levels(axes, (data_axis,))
        data = (
            collective_seconds("reduce_scatter", ys, data_link)
            + collective_seconds("all_gather", ys, data_link)
            if zero
            else collective_seconds("all_reduce", ys, data_link)
        )
    per_microbatch = act + avals_bytes(v.aval for v in fwd.outvars) + grad
    invars = structure.local.jaxpr.invars
    parts = axes[data_axis] if zero and data_axis is not None else 1
    shared = structure.zero_split(zero)
    model = segments.leaf_dims if segments is not None else {}
    stacked = sum(
        avals_bytes([invars[i].aval])
        // (parts if i in shared else 1)
        // (segments.parts if segments is not None and i in model else 1)
        for i in structure.stacked
    )
    return PipelineEstimate(
        profile.name,
        schedule.name,
        schedule.stages,
        schedule.microbatches,
        schedule.steps,
        forward,
        backward,
        other,
        permutes,
        data,
        schedule.slots * per_microbatch,
        stacked,
    )
