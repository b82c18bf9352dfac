"""Pipeline schedules as data: which stage runs which microbatch, when.

The layers are cut into `stages x chunks` consecutive *chunks*; chunk `c`
lives on stage `c % stages` as its virtual stage `c // stages` (one chunk per
stage unless the schedule interleaves). A schedule is a table (time step,
stage) -> action or idle. Each stage runs its actions in a fixed order, each
as early as its inputs exist, so a schedule is named by its per-stage order
alone (`WARMUPS`; ZeroBubble, as in Shardy's `mpmd` set, would be another).
From the table follow the transfers at each step and how many (chunk,
microbatch) units a stage holds at once, which sizes its buffers (`slots`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64

from dialects.errors import PartirValueError
from partir.plan import TacticError

RECORD = "partir.pipeline"
"""The module attribute a pipelined program records its schedule in
(`Schedule.record`, `recorded_schedule`): what the report draws and the
ONNX export places by."""

Phase = Literal["F", "B"]


@dataclass(frozen=True)
class Action:
    """One stage's work in one time step: a microbatch's forward or backward
    through the stage's virtual stage `chunk` (`F3`, or `F3v1` where the
    stage holds several chunks)."""

    microbatch: int
    phase: Phase
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.phase}{self.microbatch}" + (f"v{self.chunk}" if self.chunk else "")


WARMUPS: dict[str, Callable[[int, int, int, int], int]] = {
    "gpipe": lambda stage, stages, units, chunks: units,
    "1f1b": lambda stage, stages, units, chunks: stages - stage - 1,
    "interleaved": lambda stage, stages, units, chunks: 2 * (stages - stage - 1)
    + (chunks - 1) * stages,
}
"""Per schedule, (stage, stages, units, chunks) -> the forwards a stage runs
before it alternates forward and backward. GPipe: all of them. 1F1B
(PipeDream-flush): `stages - stage - 1`, so a stage never holds more than
`stages - stage` microbatches' activations. Interleaved 1F1B (Megatron-LM's):
each stage holds `chunks` chunks, 1 / chunks of its layers each, so the
bubble is about 1 / chunks of 1F1B's, for more transfers."""


def stage_order(name: str, stage: int, stages: int, microbatches: int, chunks: int) -> list[Action]:
    """`stage`'s actions in the order it runs them: its warm-up forwards, then
    a forward and a backward in turn, then the rest. The units run in groups
    of `stages` microbatches, each group through the chunks in turn
    (backwards in reverse); with one chunk, microbatch by microbatch."""
    group = stages * chunks

    def unit(i: int, phase: Phase) -> Action:
        chunk = i % group // stages
        m = i // group * stages + i % stages
        return Action(m, phase, chunk if phase == "F" else chunks - 1 - chunk)

    units = range(microbatches * chunks)
    forwards, backwards = [unit(i, "F") for i in units], [unit(i, "B") for i in units]
    warmup = min(WARMUPS[name](stage, stages, len(units), chunks), len(units))
    order = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards, strict=False):
        order += [f, b]
    return order + backwards[len(forwards) - warmup :]


@dataclass(frozen=True)
class Schedule:
    """The table of a pipelined step: `table[t][s]` is stage `s`'s action at
    time step `t` (None: idle, the bubble); each stage holds `chunks` chunks."""

    name: str
    stages: int
    microbatches: int
    table: tuple[tuple[Action | None, ...], ...]
    chunks: int = 1

    @property
    def steps(self) -> int:
        return len(self.table)

    def time_of(self, stage: int, action: Action) -> int:
        for t, row in enumerate(self.table):
            if row[stage] == action:
                return t
        raise KeyError((stage, action))

    def neighbour(self, stage: int, action: Action, step: int) -> tuple[int, Action] | None:
        """The stage and action of chunk `step` (+1: the next, -1: the
        previous) of the one `action` runs on `stage`, for its microbatch and
        phase; None past the first or the last chunk."""
        c = action.chunk * self.stages + stage + step
        if not 0 <= c < self.stages * self.chunks:
            return None
        return c % self.stages, Action(action.microbatch, action.phase, c // self.stages)

    def sends(self, t: int, phase: Phase) -> list[tuple[int, int, Action]]:
        """(from stage, to stage, the receiver's action it is for) of the
        activations (`F`) or gradients (`B`) sent after step `t`."""
        step = 1 if phase == "F" else -1
        return [
            (s, *to)
            for s, a in enumerate(self.table[t])
            if a is not None and a.phase == phase and (to := self.neighbour(s, a, step))
        ]

    @property
    def transfers(self) -> int:
        """Point-to-point transfers of one microbatch's activation or gradient:
        2 (stages x chunks - 1) microbatches."""
        return sum(len(self.sends(t, "F")) + len(self.sends(t, "B")) for t in range(self.steps))

    @property
    def bubble(self) -> float:
        """The idle fraction of a stage's time steps: (stages - 1) / (microbatches + stages - 1)
        for GPipe and 1F1B; a time step is a chunk's, 1 / chunks of a stage's layers."""
        idle = sum(a is None for row in self.table for a in row)
        return idle / (self.steps * self.stages)

    @functools.cached_property
    def _slot_of(self) -> tuple[dict[tuple[int, int], int], ...]:
        """Per stage, the buffer of each (chunk, microbatch) it holds, from its
        activation's arrival to its backward: the first one free by then, in
        order of arrival (so as few as the most units a stage holds at once)."""
        tables = []
        for stage in range(self.stages):
            spans = []
            for v in range(self.chunks):
                for m in range(self.microbatches):
                    own = Action(m, "F", v)
                    before = self.neighbour(stage, own, -1)
                    start = self.time_of(*before) + 1 if before else self.time_of(stage, own)
                    spans.append((start, self.time_of(stage, Action(m, "B", v)), (v, m)))
            free_after: list[int] = []  # per slot, the last step its unit holds it
            table = {}
            for start, end, unit in sorted(spans, key=lambda span: span[0]):
                free = (i for i, last in enumerate(free_after) if last < start)
                slot = next(free, len(free_after))
                if slot == len(free_after):
                    free_after.append(end)
                free_after[slot] = end
                table[unit] = slot
            tables.append(table)
        return tuple(tables)

    @property
    def slots(self) -> int:
        """Buffers per stage for in-flight units (`slot`)."""
        return 1 + max(max(t.values()) for t in self._slot_of)

    def slot(self, stage: int, action: Action) -> int:
        """The buffer `stage` keeps `action`'s unit in."""
        return self._slot_of[stage][(action.chunk, action.microbatch)]

    def label(self, action: Action | None) -> str:
        """A table cell: `.` (idle), `F3`, or where stages hold several chunks
        `F3v0` (microbatch 3's forward through the stage's first chunk)."""
        if action is None:
            return "."
        return f"{action}v0" if self.chunks > 1 and action.chunk == 0 else str(action)

    def timeline(self) -> str:
        """The table drawn as one row per stage, one column per time step."""
        width = max(len(self.label(a)) for row in self.table for a in row)
        head = "stage | " + " ".join(f"{t:>{width}}" for t in range(self.steps))
        rows = [head, "-" * len(head)]
        for s in range(self.stages):
            cells = [f"{self.label(row[s]):>{width}}" for row in self.table]
            rows.append(f"{s:>5} | " + " ".join(cells))
        return "\n".join(rows)

    def record(self, module: ModuleOp, axis: str) -> None:
        """Record the table on `module` (`RECORD`): one string per time step,
        each stage's action or "." (idle), e.g. `"F1 F0 . ."`."""
        rows = [" ".join(map(self.label, row)) for row in self.table]
        module.attributes[RECORD] = DictionaryAttr(
            {
                "axis": StringAttr(axis),
                "schedule": StringAttr(self.name),
                "microbatches": IntegerAttr(self.microbatches, i64),
                "virtual_stages": IntegerAttr(self.chunks, i64),
                "table": ArrayAttr([StringAttr(r) for r in rows]),
            }
        )

    @property
    def summary(self) -> str:
        """One line: the kind, the sizes, the bubble, the slots and the transfers."""
        chunks = f" x {self.chunks} virtual stages" if self.chunks > 1 else ""
        return (
            f"{self.name} schedule: {self.stages} stages{chunks}, "
            f"{self.microbatches} microbatches, "
            f"{self.steps} time steps, bubble {self.bubble:.1%}, {self.slots} slots per stage, "
            f"{self.transfers} transfers"
        )

    def __str__(self) -> str:
        return f"{self.summary}\n{self.timeline()}"


def recorded_schedule(module: ModuleOp) -> tuple[str, Schedule] | None:
    """The stage axis and the schedule a pipelined `module` records (`RECORD`), or None."""
    record = module.attributes.get(RECORD)
    if record is None:
        return None
    fields = record.data if isinstance(record, DictionaryAttr) else {}
    axis, name, rows, microbatches, chunks = (
        fields.get(k) for k in ("axis", "schedule", "table", "microbatches", "virtual_stages")
    )
    if not (
        isinstance(axis, StringAttr)
        and isinstance(name, StringAttr)
        and isinstance(rows, ArrayAttr)
        and isinstance(microbatches, IntegerAttr)
        and isinstance(chunks, IntegerAttr)
    ):
        raise PartirValueError(f"malformed {RECORD} attribute: {record}")
    table = tuple(
        tuple(_action(cell) for cell in row.data.split(" "))
        for row in rows.data
        if isinstance(row, StringAttr)
    )
    stages = len(table[0]) if table else 0
    return axis.data, Schedule(name.data, stages, microbatches.value.data, table, chunks.value.data)


def _action(cell: str) -> Action | None:
    if cell == ".":
        return None
    phase, (microbatch, _, chunk) = cell[0], cell[1:].partition("v")
    if phase not in ("F", "B") or not microbatch.isdigit() or not (chunk or "0").isdigit():
        raise PartirValueError(f"malformed action {cell!r} in a {RECORD} table")
    return Action(int(microbatch), phase, int(chunk or 0))  # type: ignore[arg-type]


def make_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Run each stage's order as early as its inputs allow (one action per
    step): a forward after the previous chunk's forward of its microbatch, a
    backward after the next chunk's backward (the last chunk's, after its
    own forward). A `TacticError` says what does not fit."""
    if name not in WARMUPS:
        raise TacticError(
            f"Pipeline: unknown schedule {name!r}; the schedules are "
            f"{', '.join(repr(n) for n in WARMUPS)}"
        )
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise TacticError(f"Pipeline: virtual_stages is a count of at least 1, got {chunks!r}")
    if name != "interleaved" and chunks != 1:
        raise TacticError(
            f"Pipeline: virtual_stages={chunks} needs schedule='interleaved' (the "
            f"{name!r} schedule runs one chunk of layers per stage)"
        )
    if name == "interleaved" and chunks < 2:
        raise TacticError(
            "Pipeline: schedule='interleaved' needs virtual_stages of at least 2 (the "
            "chunks of layers each stage holds), e.g. virtual_stages=2"
        )
    if name == "interleaved" and microbatches % stages:
        raise TacticError(
            f"Pipeline: the interleaved schedule runs microbatches in groups of the "
            f"{stages} stages; {microbatches} microbatches are not a multiple of {stages}"
        )
    queues = [stage_order(name, s, stages, microbatches, chunks) for s in range(stages)]
    sched = Schedule(name, stages, microbatches, (), chunks)
    done: dict[tuple[int, Action], int] = {}
    table: list[tuple[Action | None, ...]] = []

    def ready(s: int, action: Action) -> bool:
        before = sched.neighbour(s, action, -1 if action.phase == "F" else 1)
        own = (s, Action(action.microbatch, "F", action.chunk)) if action.phase == "B" else None
        return all(done.get(need, len(table)) < len(table) for need in (before, own) if need)

    while any(queues):
        row = tuple(q[0] if q and ready(s, q[0]) else None for s, q in enumerate(queues))
        if not any(row):
            raise AssertionError(f"schedule {name!r} deadlocks at step {len(table)}")
        for s, action in enumerate(row):
            if action is not None:
                queues[s].pop(0)
                done[(s, action)] = len(table)
        table.append(row)
    return Schedule(name, stages, microbatches, tuple(table), chunks)
