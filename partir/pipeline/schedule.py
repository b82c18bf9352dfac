"""Pipeline schedules as data: which stage runs which microbatch, when.

The layers are cut into `stages x chunks` consecutive *chunks*; chunk
`c` lives on stage `c % stages` as its virtual stage `c // stages` (one
chunk per stage, the stage's own layers, unless the schedule interleaves).
A schedule is a table (time step, stage) -> (microbatch, forward/backward,
virtual stage) or idle. Each stage runs its actions in a fixed order (the
schedule's kind); a time step is the unit an action takes, and an action
starts at the first step after its inputs exist: a forward after the
previous chunk's forward of that microbatch, a backward after the next
chunk's backward (the last chunk's, after its own forward). So a schedule
is named by its per-stage order alone, and others (ZeroBubble, as in
Shardy's `mpmd` set) are another order function in `ORDERS`.

From the table follow what the pipelined program needs: the transfers at
each step (one microbatch's activation to the next chunk's stage after a
forward, the last stage's to the first; its gradient back after a
backward: 2 x (stages x chunks - 1) x microbatches in all), and how many
(chunk, microbatch) units a stage holds at once, which sizes its buffers
(`slots`): every microbatch under GPipe, about `stages` under 1F1B.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64

from dialects.errors import PartirValueError

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


Order = Callable[[int, int, int, int], list[Action]]
"""(stage, stages, microbatches, chunks per stage) -> the stage's actions, in
the order it runs them."""


def gpipe_order(stage: int, stages: int, microbatches: int, chunks: int) -> list[Action]:
    """GPipe: every forward, then every backward."""
    del stage, stages, chunks
    return [Action(m, "F") for m in range(microbatches)] + [
        Action(m, "B") for m in range(microbatches)
    ]


def one_f_one_b_order(stage: int, stages: int, microbatches: int, chunks: int) -> list[Action]:
    """1F1B (PipeDream-flush): `stages - stage - 1` warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards; a stage
    never holds more than `stages - stage` microbatches' activations."""
    del chunks
    return _warm_steady_cool(
        min(stages - stage - 1, microbatches),
        [Action(m, "F") for m in range(microbatches)],
        [Action(m, "B") for m in range(microbatches)],
    )


def interleaved_order(stage: int, stages: int, microbatches: int, chunks: int) -> list[Action]:
    """Interleaved 1F1B (Megatron-LM's): a stage holds `chunks` chunks and
    runs the microbatches in groups of `stages`, each group through its
    chunks in turn (backwards in reverse); `2 (stages - stage - 1) + (chunks
    - 1) stages` warm-up forwards, then 1F1B. Each chunk has 1 / chunks of a
    stage's layers, so the bubble is about 1 / chunks of 1F1B's."""
    group = stages * chunks

    def unit(i: int, phase: Phase) -> Action:
        chunk = i % group // stages
        m = i // group * stages + i % stages
        return Action(m, phase, chunk if phase == "F" else chunks - 1 - chunk)

    units = range(microbatches * chunks)
    return _warm_steady_cool(
        min(2 * (stages - stage - 1) + (chunks - 1) * stages, len(units)),
        [unit(i, "F") for i in units],
        [unit(i, "B") for i in units],
    )


def _warm_steady_cool(warmup: int, forwards: list[Action], backwards: list[Action]) -> list[Action]:
    """`warmup` forwards, then a forward and a backward in turn, then the rest."""
    order = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards, strict=False):
        order += [f, b]
    return order + backwards[len(forwards) - warmup :]


ORDERS: dict[str, Order] = {
    "gpipe": gpipe_order,
    "1f1b": one_f_one_b_order,
    "interleaved": interleaved_order,
}


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

    def forward_sends(self, t: int) -> list[tuple[int, int, Action]]:
        return self.sends(t, "F")

    def backward_sends(self, t: int) -> list[tuple[int, int, Action]]:
        return self.sends(t, "B")

    @property
    def transfers(self) -> int:
        """Point-to-point transfers of one microbatch's activation or gradient."""
        return sum(
            len(self.forward_sends(t)) + len(self.backward_sends(t)) for t in range(self.steps)
        )

    @property
    def bubble(self) -> float:
        """The idle fraction of a stage's time steps: (stages - 1) / (microbatches + stages - 1)
        for GPipe and 1F1B; a time step is a chunk's, 1 / chunks of a stage's layers."""
        idle = sum(a is None for row in self.table for a in row)
        return idle / (self.steps * self.stages)

    def unit(self, action: Action) -> int:
        """A stage's (chunk, microbatch) as one number, its buffers' key: its
        place in the stages-wide groups of microbatches through each chunk in
        turn (the interleaved order; `microbatch` where a stage has one chunk)."""
        m, s = action.microbatch, self.stages
        return (m // s * self.chunks + action.chunk) * s + m % s

    def live(self, stage: int) -> list[tuple[int, int, int]]:
        """(unit, first step, last step) a stage holds each chunk's microbatch:
        from its activation's arrival to its backward."""
        spans = []
        for v in range(self.chunks):
            for m in range(self.microbatches):
                own = Action(m, "F", v)
                before = self.neighbour(stage, own, -1)
                arrival = self.time_of(stage, own) if before is None else self.time_of(*before) + 1
                spans.append((self.unit(own), arrival, self.time_of(stage, Action(m, "B", v))))
        return spans

    @functools.cached_property
    def _slot_of(self) -> tuple[dict[int, int], ...]:
        """Per stage, each unit's buffer: the first one free since its last
        unit's backward, in order of arrival (so as few as the most units a
        stage holds at once)."""
        tables = []
        for stage in range(self.stages):
            free_after: list[int] = []  # per slot, the last step its unit holds it
            table = {}
            for unit, start, end in sorted(self.live(stage), key=lambda span: span[1]):
                slot = next((i for i, last in enumerate(free_after) if last < start), None)
                if slot is None:
                    slot = len(free_after)
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
        return self._slot_of[stage][self.unit(action)]

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
    """The stage axis and the schedule a pipelined `module` records (`RECORD`),
    or None (none recorded, or a pipeline asked for and not scheduled yet: no table)."""
    record = module.attributes.get(RECORD)
    if not isinstance(record, DictionaryAttr) or "table" not in record.data:
        return None
    fields = record.data
    axis, name, rows = fields.get("axis"), fields.get("schedule"), fields.get("table")
    microbatches = fields.get("microbatches")
    chunks = fields.get("virtual_stages", IntegerAttr(1, i64))
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


def schedule_problem(name: str, stages: int, microbatches: int, chunks: int) -> str | None:
    """What is wrong with scheduling `microbatches` under `name` on `stages`
    stages of `chunks` virtual stages each, or None."""
    if name not in ORDERS:
        return (
            f"Pipeline: unknown schedule {name!r}; the schedules are "
            f"{', '.join(repr(n) for n in ORDERS)}"
        )
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        return f"Pipeline: virtual_stages is a count of at least 1, got {chunks!r}"
    if name != "interleaved" and chunks != 1:
        return (
            f"Pipeline: virtual_stages={chunks} needs schedule='interleaved' (the "
            f"{name!r} schedule runs one chunk of layers per stage)"
        )
    if name == "interleaved" and chunks < 2:
        return (
            "Pipeline: schedule='interleaved' needs virtual_stages of at least 2 (the "
            "chunks of layers each stage holds), e.g. virtual_stages=2"
        )
    if name == "interleaved" and microbatches % stages:
        return (
            f"Pipeline: the interleaved schedule runs microbatches in groups of the "
            f"{stages} stages; {microbatches} microbatches are not a multiple of {stages}"
        )
    return None


def make_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Run each stage's order as early as its inputs allow (one action per step)."""
    problem = schedule_problem(name, stages, microbatches, chunks)
    if problem is not None:
        raise PartirValueError(problem)
    queues = [ORDERS[name](s, stages, microbatches, chunks) for s in range(stages)]
    sched = Schedule(name, stages, microbatches, (), chunks)
    done: dict[tuple[int, Action], int] = {}
    table: list[tuple[Action | None, ...]] = []
    t = 0
    while any(queues):
        row: list[Action | None] = []
        for s, queue in enumerate(queues):
            action = queue[0] if queue else None
            row.append(action if action is not None and _ready(sched, s, action, done, t) else None)
        if not any(row):
            raise AssertionError(f"schedule {name!r} deadlocks at step {t}")
        for s, action in enumerate(row):
            if action is not None:
                queues[s].pop(0)
                done[(s, action)] = t
        table.append(tuple(row))
        t += 1
    return Schedule(name, stages, microbatches, tuple(table), chunks)


def _ready(
    sched: Schedule, s: int, action: Action, done: dict[tuple[int, Action], int], t: int
) -> bool:
    """Whether `action`'s inputs exist before step `t`: the previous chunk's
    forward; the next chunk's backward (the last chunk: its own forward)."""
    before = sched.neighbour(s, action, -1 if action.phase == "F" else 1)
    needs = [before] if before is not None else []
    if action.phase == "B":
        needs.append((s, Action(action.microbatch, "F", action.chunk)))
    return all(done.get(need, t) < t for need in needs)
