"""What a partitioning did, as plain data: shardings, collectives, replication, memory.

`build_report(module)` accepts a module at any stage:

- SPMD (`spmd.*` ops, `!spmd.dtensor` arguments): read directly; every body op
  carries its result's distribution in its `dist` attribute.
- core (a `partir.mesh`, loops, no SPMD ops; the import stage too): a clone
  is lowered with `lower_to_spmd`, and the report is read from that, so the
  distributions are the same notions at every stage. The core module itself
  says which ops were left outside every loop (`replicated_ops`).
- plain StableHLO (no mesh): lowered over an empty mesh, so every value is
  replicated and nothing is communicated (and no op is listed as replicated:
  without a mesh there is nothing to partition it over).

`Report.stage` is "spmd", "core" (loops) or "stablehlo" (no loops yet: the
import stage, with or without a mesh).

Values are named as the printer names them (`%x_1`, `%42`), so a row can be
found in the stage text: for a core-stage input that is the text of its SPMD
lowering. Sizes are bytes per device. `Report.to_json()` is the stable,
machine-readable form; `Report.tables()` the human one (`partir-inspect`).
"""

from partir.cost.memory import MemoryEstimate
from partir.report.build import build_report, parse_module, report_text
from partir.report.diff import Diff, ShardingChange, diff
from partir.report.memory import XlaMemory
from partir.report.model import Report
from partir.report.render import Table, dumps, render_plain
from partir.report.rows import CollectiveInfo, ReplicatedOp, ValueInfo

__all__ = [
    "CollectiveInfo",
    "Diff",
    "MemoryEstimate",
    "ReplicatedOp",
    "Report",
    "ShardingChange",
    "Table",
    "ValueInfo",
    "XlaMemory",
    "build_report",
    "diff",
    "dumps",
    "parse_module",
    "render_plain",
    "report_text",
]
