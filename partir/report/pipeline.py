"""The report of a pipelined step: its schedule as a timeline, the transfers on
the stage axis, each stage's layers and buffers, and the estimate if asked.

`PipelineSection` is what a pipelined program's `Report` shows: the schedule
the program records (`partir.pipeline.schedule.recorded_schedule`) drawn as a
table, one row per stage, one column per time step (`F3`: the forward of
microbatch 3, `B3` its backward, `.` idle), and the transfers as counted in
the program (its `spmd.collective_permute`s on the stage axis).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xdsl.dialects.builtin import ModuleOp

from dialects.escaping import quoted
from dialects.spmd import CollectivePermuteOp
from partir.pipeline.schedule import Schedule, recorded_schedule
from partir.report.render import Table, render_plain
from partir.selectors import display_path

if TYPE_CHECKING:
    from partir.pipeline.structure import StepStructure
    from partir.pipeline.tactic import Pipeline


@dataclass(frozen=True)
class PipelineSection:
    """A pipelined program's schedule and its transfers on the stage axis."""

    axis: str
    schedule: Schedule
    transfers: int
    """Point-to-point transfers in the program: the pairs of its permutes on `axis`."""
    transfer_bytes: int
    """Bytes those transfers move, summed over the pairs."""

    @staticmethod
    def of(module: ModuleOp) -> PipelineSection | None:
        """The section of a pipelined `module` (None if it records no schedule)."""
        recorded = recorded_schedule(module)
        if recorded is None:
            return None
        axis, schedule = recorded
        permutes = [
            op
            for op in module.walk()
            if isinstance(op, CollectivePermuteOp) and axis in op.axis_names
        ]
        pairs = [len(op.source_target_pairs) for op in permutes]
        moved = sum(n * op.bytes_per_device for n, op in zip(pairs, permutes, strict=True))
        return PipelineSection(axis, schedule, sum(pairs), moved)

    def title(self) -> str:
        sched = self.schedule
        return (
            f"pipeline over {quoted(self.axis)}: {sched.name} schedule, {sched.stages} stages, "
            f"{sched.microbatches} microbatches, {sched.steps} time steps, bubble "
            f"{sched.bubble:.1%}, {sched.slots} slots per stage, {self.transfers} transfers "
            f"({self.transfer_bytes} B)"
        )

    def table(self) -> Table:
        """One row per stage, one column per time step: `F<m>`, `B<m>` or `.`."""
        sched = self.schedule
        rows = [
            (str(s), *(str(row[s]) if row[s] else "." for row in sched.table))
            for s in range(sched.stages)
        ]
        return Table(self.title(), ("stage", *map(str, range(sched.steps))), rows)

    def to_json(self) -> dict[str, Any]:
        sched = self.schedule
        return {
            "axis": self.axis,
            "schedule": sched.name,
            "stages": sched.stages,
            "microbatches": sched.microbatches,
            "time_steps": sched.steps,
            "bubble": sched.bubble,
            "slots": sched.slots,
            "transfers": self.transfers,
            "transfer_bytes": self.transfer_bytes,
            "table": [[str(a) if a else None for a in row] for row in sched.table],
        }


def _split(spec: Any) -> str:
    """`P(("stage", "batch"), None, "model")` as `dim 0 over "stage" x "batch",
    dim 2 over "model"` (axis names escaped)."""
    parts = []
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        parts.append(f"dim {dim} over " + " x ".join(quoted(a) for a in axes))
    return ", ".join(parts)


@dataclass(frozen=True)
class PipelineReport:
    tactic: Pipeline
    schedule: Schedule
    structure: StepStructure
    in_specs: tuple[Any, ...]
    """Each argument leaf's PartitionSpec (the stage axis on the layer dim,
    with ZeRO the data axis too, with Megatron the model axis on its dim)."""
    estimate: Any = None
    """The jaxpr engine's `PipelineEstimate`, if asked."""

    @property
    def transfer_bytes(self) -> int:
        """Bytes one run moves on the stage axis: each transfer is one
        microbatch's activation (forward) or its gradient (backward)."""
        return self.schedule.transfers * self.structure.activation_bytes

    def tables(self) -> list[Table]:
        s, sched = self.structure, self.schedule
        per_stage = s.layers // sched.stages
        stages = Table(
            "stages",
            ("stage", "layers", "in flight (slots)"),
            [
                (str(k), f"{k * per_stage}..{(k + 1) * per_stage - 1}", str(sched.slots))
                for k in range(sched.stages)
            ],
        )
        stacked = Table(
            f"split over {quoted(self.tactic.axis)} on the layer dim",
            ("leaf", "split"),
            [
                (quoted(display_path(s.arg_names[i])), _split(self.in_specs[i]))
                for i in s.stacked
            ],
        )
        return [stages, stacked]

    def to_text(self) -> str:
        sched = self.schedule
        head = (
            f"Pipeline over {quoted(self.tactic.axis)}: {self.structure.layers} layers, "
            f"{sched.stages} stages, batch {self.structure.batch} in {sched.microbatches} "
            f"microbatches of {self.structure.micro_rows} rows per shard\n"
            f"transfers on {quoted(self.tactic.axis)}: {sched.transfers} "
            f"(2 x (stages - 1) x microbatches), {self.transfer_bytes} bytes\n{sched}\n"
        )
        text = head + "\n" + render_plain(self.tables())
        return text + (f"\n{self.estimate}\n" if self.estimate is not None else "")

    def __str__(self) -> str:
        return self.to_text()
