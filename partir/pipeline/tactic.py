"""`partir.Pipeline`: pipeline parallelism over a mesh axis.

Two moves on the IR (`partir.lowered.lower`, or `partir-opt`'s
`partir-pipeline` and `partir-schedule-pipeline`): the step is partitioned
with the tactics beside the Pipeline and one more, the batch split over a
microbatch axis (`Pipeline.microbatched`), so every tactic works inside a
stage as it works anywhere; then `partir.pipeline.program` turns that axis
into the schedule's time steps, the transfers `spmd.collective_permute`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from dialects.errors import PartirTypeError
from dialects.escaping import quoted
from partir.mesh import Mesh
from partir.pipeline.schedule import make_schedule
from partir.plan import Leaf, Plan, ProgramView, TacticError
from partir.tactics import BatchParallel, Megatron, Tactic

MICROBATCH_AXIS = "microbatch"
"""The axis a pipelined step is partitioned over per microbatch, which the
schedule turns into time."""


@dataclass(frozen=True, repr=False)
class Pipeline(Tactic):
    """Pipeline the layer loop over `axis` with `microbatches` under `schedule`.

    The stacked values (parameters, their optimizer state, their updates) are
    the ones whose dim runs over the layer loop's rows, by the registry's
    factor rules (`partir.pipeline.layer_loops`). Under `schedule="interleaved"`
    each stage holds `virtual_stages` chunks of the layers, chunk `c` of
    `|axis| x virtual_stages` on stage `c % |axis|` (Megatron-LM's interleaved
    1F1B: a smaller bubble for more transfers)."""

    axis: str
    microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1

    CLI_NAME: ClassVar[str] = "partir-pipeline"

    def microbatched(self, mesh: Mesh, others: Sequence[Tactic]) -> tuple[Mesh, list[Tactic]]:
        """The mesh and the tactics the step is partitioned with, per
        microbatch: `others`, with the batch split over a microbatch axis (as
        the BatchParallel beside it selects it, if any) minor to the data's
        splits and before Megatron's (the engine decides the layer loops'
        carried activations on the data's splits)."""
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
        mesh.check_axis(self.axis, "Pipeline")
        make_schedule(self.schedule, mesh.axes[self.axis], self.microbatches, self.virtual_stages)
        if MICROBATCH_AXIS in mesh:
            raise TacticError(
                f"Pipeline: the mesh has an axis named {quoted(MICROBATCH_AXIS)}, the name "
                "Pipeline gives its microbatches; rename that axis"
            )
        if any(isinstance(t, Pipeline) for t in others):
            raise TacticError("Pipeline: one Pipeline per step; the tactics list two")
        taken = [t for t in others if getattr(t, "axis", None) == self.axis]
        if taken:
            raise TacticError(
                f"Pipeline owns the axis {quoted(self.axis)}; give {taken[0]!r} beside it "
                "another axis of the mesh"
            )
        split = Microbatches(MICROBATCH_AXIS)
        like = next((t for t in others if isinstance(t, BatchParallel)), None)
        if like is not None:
            shards = mesh.axes[like.axis]
            split = Microbatches(MICROBATCH_AXIS, like.inputs, like.dim, shards=shards)
        axes = {**dict(mesh.axes), MICROBATCH_AXIS: self.microbatches}
        # the microbatches minor to the data's splits, before the model's
        at = next((i for i, t in enumerate(others) if isinstance(t, Megatron)), len(others))
        return Mesh(axes), [*others[:at], split, *others[at:]]

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        raise TacticError(
            f"Pipeline({quoted(self.axis)}) is not one tiling of the imported IR: "
            "partir.jit partitions the step per microbatch and schedules its SPMD program; "
            "in partir-opt, run partir-pipeline, partir-lower-spmd, then "
            "partir-schedule-pipeline"
        )


@dataclass(frozen=True, repr=False)
class Microbatches(BatchParallel):
    """A Pipeline's batch split over its microbatch axis: a `BatchParallel`
    named after the Pipeline, so its stage, selections and report rows say
    "Pipeline"."""

    shards: int = 1
    """The data shards beside it (the BatchParallel's axis size): a shard's
    rows split into the microbatches."""

    @property
    def name(self) -> str:
        return "Pipeline"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        """BatchParallel's plan, where the microbatches divide each shard's
        rows (padding would add rows to a microbatch's mean)."""
        plan = super().plan(program, mesh)
        count = mesh.axes[self.axis]
        for tile in plan.tiles:
            size = tile.leaf.shape[tile.dim] if isinstance(tile.leaf, Leaf) else 0
            if size % (count * self.shards):
                shards = f" of {self.shards} data shards" if self.shards > 1 else ""
                raise TacticError(
                    f"Pipeline: the batch of {size} ({quoted(tile.leaf.name)}) does not split "
                    f"into {count} microbatches{shards}; give a batch they divide"
                )
        return plan
