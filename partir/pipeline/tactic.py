"""`partir.Pipeline`: pipeline parallelism over a mesh axis.

The layer loop's stacked parameters are split over `axis` on their layer
dim (each stage owns `layers / |axis|` consecutive layers), the batch into
`microbatches`, and the step runs `schedule` ("gpipe" or "1f1b",
`partir.pipeline.schedule.ORDERS`) as one SPMD program: microbatches move
between neighbouring stages by `lax.ppermute`, so the result needs nothing
beyond JAX (`partir.pipeline.engine`).

Unlike the tiling tactics it restructures the whole step (one loop over
time steps holding both the forward and the backward loop), so
`partir.jit` runs it on the step's jaxpr rather than as a partitioning of
the imported IR; a `BatchParallel` on another axis splits each
microbatch's rows over that axis, and a `ZeRO(that axis, stage)` beside
it splits each stage's optimizer state over it on the layer dim (each data
shard updates its share of the stage's layers: the stacked gradients are
reduce-scattered to it and the updated layers all-gathered back; from
stage 2 the updates it returns stay split, at 3 the parameters too). A
`Megatron(axis)` on an axis of its own splits each stage's layers over it,
the loops and the update partitioned by partir (`partir.pipeline.megatron`);
with a ZeRO too, each data shard's share of a stage's layers is split over
the model axis as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from dialects.errors import PartirTypeError
from dialects.escaping import quoted
from partir.mesh import Mesh
from partir.pipeline.schedule import ORDERS
from partir.plan import Plan, ProgramView, TacticError
from partir.tactics import BatchParallel, Megatron, Tactic, ZeRO

MICROBATCH_AXIS = "microbatch"
"""The axis a pipelined step is partitioned over per microbatch, which the
schedule turns into time."""


@dataclass(frozen=True, repr=False)
class Pipeline(Tactic):
    """Pipeline the layer loop over `axis` with `microbatches` under `schedule`.

    `stacked` selects the loop's stacked parameters (by default, the leaves the
    step's first `lax.scan` over arguments reads as xs)."""

    axis: str
    microbatches: int
    schedule: str = "1f1b"
    stacked: str | Sequence[str] | None = None
    engine: str = "jaxpr"
    """"ir": the step is partitioned per microbatch by the tactics beside it and
    scheduled on its SPMD program (`partir.pipeline.program`), giving the same
    `Lowered` as any other strategy; "jaxpr": the step's jaxpr is split and run
    by `partir.pipeline.engine`. (The jaxpr engine goes once the IR one does
    all it does.)"""

    CLI_NAME: ClassVar[str] = "partir-pipeline"

    def microbatched(self, mesh: Mesh, others: Sequence[Tactic]) -> tuple[Mesh, list[Tactic]]:
        """The mesh and the tactics the step is partitioned with, per
        microbatch: `others`, then the batch split over a microbatch axis minor
        to theirs (as the BatchParallel beside it selects it, if any)."""
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int):
            raise PartirTypeError(
                f"Pipeline: microbatches is a number, got {self.microbatches!r}; "
                'e.g. Pipeline("stage", microbatches=8)'
            )
        if self.microbatches < 2:
            raise TacticError(
                f"Pipeline: microbatches must be at least 2, got {self.microbatches} (a "
                "pipeline of one microbatch runs its stages one after another)"
            )
        if self.schedule not in ORDERS:
            raise TacticError(
                f"Pipeline: unknown schedule {self.schedule!r}; the schedules are "
                + ", ".join(repr(n) for n in ORDERS)
            )
        mesh.check_axis(self.axis, "Pipeline")
        if MICROBATCH_AXIS in mesh:
            raise TacticError(
                f"Pipeline: the mesh has an axis named {quoted(MICROBATCH_AXIS)}, the name "
                "Pipeline gives its microbatches; rename that axis"
            )
        if any(isinstance(t, Pipeline) for t in others):
            raise TacticError("Pipeline: one Pipeline per step; the tactics list two")
        data = [t for t in others if isinstance(t, BatchParallel)]
        if any(t.axis == self.axis for t in others if isinstance(t, BatchParallel | ZeRO)):
            raise TacticError(
                f"Pipeline owns the axis {quoted(self.axis)}; give the tactics beside it "
                "other axes of the mesh"
            )
        like = data[0] if data else None
        split = Microbatches(
            MICROBATCH_AXIS,
            inputs=like.inputs if like is not None else None,
            dim=like.dim if like is not None else 0,
        )
        axes = {**dict(mesh.axes), MICROBATCH_AXIS: self.microbatches}
        return Mesh(axes), [*others, split]

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        raise TacticError(
            f"Pipeline({quoted(self.axis)}) restructures the whole training step, which "
            "partir.jit does on the step's jaxpr; it is not a tiling of imported IR "
            "(partir.partition / partir-opt): call the step through partir.jit"
        )

    def check(self, mesh: Mesh, others: Sequence[Tactic]) -> Beside:
        """What the tactics beside it ask for, or a clear error."""
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int):
            raise PartirTypeError(
                f"Pipeline: microbatches is a number, got {self.microbatches!r}; "
                'e.g. Pipeline("stage", microbatches=8)'
            )
        if self.microbatches < 1:
            raise TacticError(f"Pipeline: microbatches must be at least 1, got {self.microbatches}")
        if self.schedule not in ORDERS:
            raise TacticError(
                f"Pipeline: unknown schedule {self.schedule!r}; the schedules are "
                + ", ".join(repr(n) for n in ORDERS)
            )
        stages = mesh.check_axis(self.axis, "Pipeline")
        data_axis, parts = None, 1
        zeros = [t for t in others if isinstance(t, ZeRO)]
        megatrons = [t for t in others if isinstance(t, Megatron)]
        for other in others:
            if isinstance(other, Pipeline):
                raise TacticError("Pipeline: one Pipeline per step; the tactics list two")
            if isinstance(other, ZeRO | Megatron):
                continue
            if not isinstance(other, BatchParallel) or other.inputs is not None or other.dim != 0:
                raise TacticError(
                    f"Pipeline composes with BatchParallel(axis), ZeRO(axis, stage) and "
                    f"Megatron(axis) on other axes; {other!r} on the pipelined step is not "
                    "supported yet: drop it, or partition without Pipeline"
                )
            if data_axis is not None:
                raise TacticError("Pipeline: at most one BatchParallel beside it")
            parts = mesh.check_axis(other.axis, other.name)
            if other.axis == self.axis:
                raise TacticError(
                    f"Pipeline and BatchParallel both name the axis {quoted(self.axis)}; "
                    "give the data-parallel split another axis of the mesh"
                )
            data_axis = other.axis
        for zero in zeros:
            if zero.axis != data_axis or zero.stage not in (1, 2, 3) or (
                zero.params, zero.opt_state, zero.updates
            ) != (None, None, None) or len(zeros) > 1:
                raise TacticError(
                    f"Pipeline composes with one ZeRO(axis, stage) on its BatchParallel's "
                    f"axis ({quoted(data_axis) if data_axis else 'none given'}), with the "
                    f"default selectors, which splits each stage's optimizer state (and, "
                    f"from stage 2, the updates it returns; at 3, the parameters) over it; "
                    f"{zero!r} is not supported beside a Pipeline"
                )
        megatron = megatrons[0] if megatrons else None
        model_parts = 1
        if megatron is not None:
            if len(megatrons) > 1 or megatron.axis in (self.axis, data_axis):
                raise TacticError(
                    f"Pipeline composes with one Megatron(axis) on an axis of its own (not "
                    f"the stage or the data axis); got {megatron!r} beside "
                    f"{', '.join(repr(t) for t in others if t is not megatron)}"
                )
            model_parts = mesh.check_axis(megatron.axis, megatron.name)
        zero_stage = zeros[0].stage if zeros else 0
        return Beside(stages, data_axis, parts, zero_stage, megatron, model_parts)


@dataclass(frozen=True, repr=False)
class Microbatches(BatchParallel):
    """A Pipeline's batch split over its microbatch axis: a `BatchParallel`
    named after the Pipeline, so its stage, selections and report rows say
    "Pipeline"."""

    @property
    def name(self) -> str:
        return "Pipeline"


@dataclass(frozen=True)
class Beside:
    """What the tactics beside a Pipeline ask for (`Pipeline.check`)."""

    stages: int
    data_axis: str | None
    data_parts: int
    zero: int
    """The ZeRO stage over the data axis (0: none)."""
    megatron: Megatron | None
    model_parts: int
