"""The report of a pipelined step: its schedule as a timeline, the transfers on
the stage axis, each stage's layers and buffers, and the estimate if asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dialects.escaping import quoted
from partir.report.render import Table, render_plain
from partir.selectors import display_path

if TYPE_CHECKING:
    from partir.cost.pipeline import PipelineEstimate
    from partir.pipeline.schedule import Schedule
    from partir.pipeline.structure import StepStructure
    from partir.pipeline.tactic import Pipeline


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
    estimate: PipelineEstimate | None = None

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
