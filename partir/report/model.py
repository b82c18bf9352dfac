"""The report of one module: the `Report` class."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dialects.escaping import readable
from dialects.mesh import Mesh
from partir.cost.memory import MemoryEstimate
from partir.report.memory import XlaMemory
from partir.report.pipeline import PipelineSection
from partir.report.render import Table, _conflict_json, _counts, _type_text, render_plain
from partir.report.rows import CollectiveInfo, PaddedValue, ReplicatedOp, ValueInfo
from partir.selections import Selection, tactic_summaries
from rewrites.conflicts import Conflict

if TYPE_CHECKING:
    from partir.cost.estimate import Estimate


@dataclass(frozen=True)
class Report:
    """Everything `partir-inspect` shows about one module; see the module docstring."""

    stage: str
    mesh: Mesh
    values: list[ValueInfo]
    results: list[ValueInfo]
    collectives: list[CollectiveInfo]
    replicated_ops: list[ReplicatedOp]
    conflicts: list[Conflict]
    memory: MemoryEstimate
    core_available: bool = True
    """False for an SPMD module reported without its core stage (no `replicated_ops`)."""
    xla: XlaMemory | None = field(default=None)
    padding: list[PaddedValue] = field(default_factory=list)
    """Values padded for divisibility (a dim the mesh axis does not divide)."""
    estimate: Estimate | None = field(default=None)
    """A predicted step on some profile (`with_estimate`, `partir-inspect --estimate`)."""
    selections: list[Selection] = field(default_factory=list)
    """What each tactic chose for each leaf it looked at, and why (`partir.selections`)."""
    pipeline: PipelineSection | None = field(default=None)
    """A pipelined program's schedule, as the program records it."""

    def tactic_lines(self) -> list[str]:
        """One line per tactic, in schedule order: "BatchParallel(batch): 2 data
        leaves on dim 0, 12 state leaves not split"."""
        return [f"{tactic}: {line}" for tactic, line in tactic_summaries(self.selections)]

    @property
    def arguments(self) -> list[ValueInfo]:
        return [v for v in self.values if v.op == "argument"]

    @property
    def bytes_communicated(self) -> int:
        """Per device, summed over every collective."""
        return sum(c.bytes_per_device for c in self.collectives)

    def with_xla(self, xla: XlaMemory) -> Report:
        return replace(self, xla=xla)

    def with_estimate(self, estimate: Estimate) -> Report:
        """The report with a predicted step beside it (`partir.cost`)."""
        return replace(self, estimate=estimate)

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "mesh": dict(self.mesh),
            "values": [v.to_json() for v in self.values],
            "results": [v.to_json() for v in self.results],
            "collectives": [c.to_json() for c in self.collectives],
            "bytes_communicated_per_device": self.bytes_communicated,
            "replicated_ops": [r.to_json() for r in self.replicated_ops],
            "core_stage_available": self.core_available,
            "conflicts": [_conflict_json(c) for c in self.conflicts],
            "memory": self.memory.to_json(),
            "xla_memory": None if self.xla is None else self.xla.to_json(),
            "padding": [p.to_json() for p in self.padding],
            "estimate": None if self.estimate is None else self.estimate.to_json(),
            "tactics": [
                {"tactic": tactic, "summary": line}
                for tactic, line in tactic_summaries(self.selections)
            ],
            "selections": [s.to_json() for s in self.selections],
            "pipeline": None if self.pipeline is None else self.pipeline.to_json(),
        }

    def summary(self) -> list[tuple[str, str]]:
        mesh = ", ".join(f"{a}={n}" for a, n in self.mesh.items()) or "none"
        unknown = sum(v.properties is None for v in self.values)
        m = self.memory
        lines = [
            ("stage", f"{self.stage} (mesh {mesh})"),
            *(("tactic", readable(line)) for line in self.tactic_lines()),
            ("values", f"{len(self.values)} ({unknown} of unknown distribution)"),
            (
                "collectives",
                f"{len(self.collectives)}, {self.bytes_communicated} B communicated per device",
            ),
            ("arguments", f"{m.arguments} B per device"),
            (
                "peak estimate",
                f"{m.peak} B per device = arguments + {m.peak_intermediates} B "
                f"live intermediates (at {m.peak_at}); no fusion or reuse",
            ),
        ]
        if self.xla is not None:
            x = self.xla
            lines.append(
                (
                    "XLA",
                    f"arguments {x.arguments} B + temporaries {x.temporaries} B = "
                    f"{x.arguments_and_temporaries} B per device; outputs "
                    f"{x.outputs} B, aliased {x.aliased} B, total {x.total} B",
                )
            )
        if self.padding:
            lines.append(("padded", "; ".join(p.text for p in self.padding)))
        lines += [
            ("conflicts", str(len(self.conflicts))),
            (
                "replicated ops",
                f"{len(self.replicated_ops)} core-stage ops outside every loop"
                + _counts(r.reason for r in self.replicated_ops)
                if self.core_available
                else "unknown (no core stage given)",
            ),
        ]
        return lines

    def tables(self) -> list[Table]:
        """The report's sections as tables: summary first, then the details."""
        out = [Table("summary", ("", ""), self.summary())]
        if self.estimate is not None:
            out.append(Table("estimate", ("", ""), self.estimate.summary()))
        if self.pipeline is not None:
            out.append(self.pipeline.table())
        sharding_headers = ("name", "partir.name", "global", "sharding", "local", "bytes")
        out.append(
            Table(
                "arguments and results",
                sharding_headers,
                [
                    (
                        v.name,
                        v.partir_name or "",
                        _type_text(v.global_shape, v.dtype),
                        v.sharding,
                        _type_text(v.local_shape, v.dtype),
                        str(v.bytes_per_device),
                    )
                    for v in (*self.arguments, *self.results)
                ],
            )
        )
        if self.selections:
            out.append(
                Table(
                    "what each tactic selected",
                    ("tactic", "leaf", "role", "split", "why"),
                    [
                        (readable(s.tactic), readable(s.leaf), s.role, readable(s.split),
                         readable(s.reason))
                        for s in self.selections
                    ],
                )
            )
        out.append(
            Table(
                "collectives",
                (
                    "name", "kind", "axes", "operand", "result", "bytes", "needed by",
                    "at", "caused by", "per iteration of",
                ),
                [
                    (
                        c.name,
                        c.kind,
                        ",".join(c.axes),
                        c.operand,
                        c.result,
                        str(c.bytes_per_device),
                        c.needed_by or "",
                        c.source or c.name_stack or "",
                        c.cause,
                        c.loop or "",
                    )
                    for c in self.collectives
                ],
            )
        )
        if self.conflicts:
            out.append(
                Table(
                    "conflicts",
                    ("op", "axis", "values", "winner", "loser", "detail"),
                    [
                        (c.op, c.axis, ", ".join(c.values), c.winner, c.loser, c.detail)
                        for c in self.conflicts
                    ],
                )
            )
        if self.replicated_ops:
            out.append(
                Table(
                    "replicated ops (core stage)",
                    ("name", "op", "reason", "detail", "reference"),
                    [
                        (r.name, r.op, r.reason, r.detail, readable(r.reference or ""))
                        for r in self.replicated_ops
                    ],
                )
            )
        out.append(
            Table(
                "values",
                ("name", "op", "global", "sharding", "local", "bytes"),
                [
                    (
                        v.name,
                        v.op,
                        _type_text(v.global_shape, v.dtype),
                        v.sharding,
                        _type_text(v.local_shape, v.dtype),
                        str(v.bytes_per_device),
                    )
                    for v in self.values
                ],
            )
        )
        return out

    def to_text(self) -> str:
        return render_plain(self.tables())

    def __str__(self) -> str:
        return self.to_text()
