"""The report of a pipelined step: its schedule, as the program records it.

`PipelineSection` is what a pipelined program's `Report` shows: the schedule
the program records (`partir.pipeline.schedule.recorded_schedule`) drawn as a
table, one row per stage, one column per time step (`F3`: the forward of
microbatch 3, `B3` its backward, `.` idle; `F3v1` through a stage's second
chunk under the interleaved schedule), and the transfers as counted in
the program (its `spmd.collective_permute`s on the stage axis).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from dialects.escaping import quoted
from dialects.spmd import CollectivePermuteOp
from partir.pipeline.schedule import Schedule, recorded_schedule
from partir.report.render import Table


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
        return (
            f"pipeline over {quoted(self.axis)}: {self.schedule.summary}; in the program "
            f"{self.transfers} permute pairs on {quoted(self.axis)}, {self.transfer_bytes} B"
        )

    def table(self) -> Table:
        """One row per stage, one column per time step: `F<m>`, `B<m>` (`F<m>v<chunk>`) or `.`."""
        sched = self.schedule
        rows = [
            (str(s), *(sched.label(row[s]) for row in sched.table))
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
            "table": [[sched.label(a) if a else None for a in row] for row in sched.table],
        }
