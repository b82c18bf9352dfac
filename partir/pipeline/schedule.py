"""Pipeline schedules as data: which stage runs which microbatch, when.

A schedule is a table (time step, stage) -> (microbatch, forward/backward)
or idle. Each stage runs its actions in a fixed order (the schedule's
kind); a time step is the unit an action takes, and an action starts at
the first step after its inputs exist: a forward after the previous stage's
forward of that microbatch, a backward after the next stage's backward (the
last stage's, after its own forward). So a schedule is named by its
per-stage order alone, and others (interleaved, ZeroBubble, as in Shardy's
`mpmd` set) are another order function in `ORDERS`.

From the table follow what the pipelined program needs: the transfers at
each step (one microbatch's activation to the next stage after a forward,
its gradient to the previous stage after a backward: 2 x (stages - 1) x
microbatches in all), and how many microbatches a stage holds at once,
which sizes its buffers (`slots`): every microbatch under GPipe, about
`stages` under 1F1B.
"""

from __future__ import annotations

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
    """One stage's work in one time step: a microbatch's forward or backward."""

    microbatch: int
    phase: Phase

    def __str__(self) -> str:
        return f"{self.phase}{self.microbatch}"


Order = Callable[[int, int, int], list[Action]]
"""(stage, stages, microbatches) -> the stage's actions, in the order it runs them."""


def gpipe_order(stage: int, stages: int, microbatches: int) -> list[Action]:
    """GPipe: every forward, then every backward."""
    del stage, stages
    return [Action(m, "F") for m in range(microbatches)] + [
        Action(m, "B") for m in range(microbatches)
    ]


def one_f_one_b_order(stage: int, stages: int, microbatches: int) -> list[Action]:
    """1F1B (PipeDream-flush): `stages - stage - 1` warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards; a stage
    never holds more than `stages - stage` microbatches' activations."""
    warmup = min(stages - stage - 1, microbatches)
    order = [Action(m, "F") for m in range(warmup)]
    for i in range(microbatches - warmup):
        order += [Action(warmup + i, "F"), Action(i, "B")]
    order += [Action(m, "B") for m in range(microbatches - warmup, microbatches)]
    return order


ORDERS: dict[str, Order] = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order}


@dataclass(frozen=True)
class Schedule:
    """The table of a pipelined step: `table[t][s]` is stage `s`'s action at
    time step `t` (None: idle, the bubble)."""

    name: str
    stages: int
    microbatches: int
    table: tuple[tuple[Action | None, ...], ...]

    @property
    def steps(self) -> int:
        return len(self.table)

    def time_of(self, stage: int, action: Action) -> int:
        for t, row in enumerate(self.table):
            if row[stage] == action:
                return t
        raise KeyError((stage, action))

    def forward_sends(self, t: int) -> list[tuple[int, int, int]]:
        """(from stage, to stage, microbatch) of the activations sent after step `t`."""
        return [
            (s, s + 1, a.microbatch)
            for s, a in enumerate(self.table[t])
            if a is not None and a.phase == "F" and s < self.stages - 1
        ]

    def backward_sends(self, t: int) -> list[tuple[int, int, int]]:
        """(from stage, to stage, microbatch) of the gradients sent after step `t`."""
        return [
            (s, s - 1, a.microbatch)
            for s, a in enumerate(self.table[t])
            if a is not None and a.phase == "B" and s > 0
        ]

    @property
    def transfers(self) -> int:
        """Point-to-point transfers of one microbatch's activation or gradient."""
        return sum(
            len(self.forward_sends(t)) + len(self.backward_sends(t)) for t in range(self.steps)
        )

    @property
    def bubble(self) -> float:
        """The idle fraction of a stage's time steps: (stages - 1) / (microbatches + stages - 1)
        for GPipe and 1F1B."""
        idle = sum(a is None for row in self.table for a in row)
        return idle / (self.steps * self.stages)

    def live(self, stage: int) -> list[tuple[int, int, int]]:
        """(microbatch, first step, last step) a stage holds each microbatch: from
        its activation's arrival to its backward."""
        spans = []
        for m in range(self.microbatches):
            own = self.time_of(stage, Action(m, "F"))
            arrival = own if stage == 0 else self.time_of(stage - 1, Action(m, "F")) + 1
            spans.append((m, arrival, self.time_of(stage, Action(m, "B"))))
        return spans

    @property
    def slots(self) -> int:
        """Buffers per stage for in-flight microbatches: the fewest `n` such that
        microbatch `m` in slot `m % n` never meets another live one there."""
        for n in range(1, self.microbatches + 1):
            if all(_fits(self.live(s), n) for s in range(self.stages)):
                return n
        return self.microbatches

    def timeline(self) -> str:
        """The table drawn as one row per stage, one column per time step."""
        width = max(2, len(str(self.microbatches - 1)) + 1)
        head = "stage | " + " ".join(f"{t:>{width}}" for t in range(self.steps))
        rows = [head, "-" * len(head)]
        for s in range(self.stages):
            cells = [f"{str(row[s]) if row[s] else '.':>{width}}" for row in self.table]
            rows.append(f"{s:>5} | " + " ".join(cells))
        return "\n".join(rows)

    def record(self, module: ModuleOp, axis: str) -> None:
        """Record the table on `module` (`RECORD`): one string per time step,
        each stage's action or "." (idle), e.g. `"F1 F0 . ."`."""
        rows = [" ".join(str(a) if a else "." for a in row) for row in self.table]
        module.attributes[RECORD] = DictionaryAttr(
            {
                "axis": StringAttr(axis),
                "schedule": StringAttr(self.name),
                "microbatches": IntegerAttr(self.microbatches, i64),
                "table": ArrayAttr([StringAttr(r) for r in rows]),
            }
        )

    @property
    def summary(self) -> str:
        """One line: the kind, the sizes, the bubble, the slots and the transfers."""
        return (
            f"{self.name} schedule: {self.stages} stages, {self.microbatches} microbatches, "
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
    if not (
        isinstance(axis, StringAttr)
        and isinstance(name, StringAttr)
        and isinstance(rows, ArrayAttr)
        and isinstance(microbatches, IntegerAttr)
    ):
        raise PartirValueError(f"malformed {RECORD} attribute: {record}")
    table = tuple(
        tuple(_action(cell) for cell in row.data.split(" "))
        for row in rows.data
        if isinstance(row, StringAttr)
    )
    stages = len(table[0]) if table else 0
    return axis.data, Schedule(name.data, stages, microbatches.value.data, table)


def _action(cell: str) -> Action | None:
    if cell == ".":
        return None
    phase, microbatch = cell[0], cell[1:]
    if phase not in ("F", "B") or not microbatch.isdigit():
        raise PartirValueError(f"malformed action {cell!r} in a {RECORD} table")
    return Action(int(microbatch), phase)  # type: ignore[arg-type]


def _fits(spans: list[tuple[int, int, int]], slots: int) -> bool:
    for i, (m, start, end) in enumerate(spans):
        for n, other_start, other_end in spans[i + 1 :]:
            if m % slots == n % slots and start <= other_end and other_start <= end:
                return False
    return True


def make_schedule(name: str, stages: int, microbatches: int) -> Schedule:
    """Run each stage's order as early as its inputs allow (one action per step)."""
    order = ORDERS.get(name)
    if order is None:
        raise PartirValueError(
            f"Pipeline: unknown schedule {name!r}; the schedules are "
            f"{', '.join(repr(n) for n in ORDERS)}"
        )
    queues = [order(s, stages, microbatches) for s in range(stages)]
    done: dict[tuple[int, Action], int] = {}
    table: list[tuple[Action | None, ...]] = []
    t = 0
    while any(queues):
        row: list[Action | None] = []
        for s, queue in enumerate(queues):
            action = queue[0] if queue else None
            row.append(
                action if action is not None and _ready(s, action, stages, done, t) else None
            )
        if not any(row):
            raise AssertionError(f"schedule {name!r} deadlocks at step {t}")
        for s, action in enumerate(row):
            if action is not None:
                queues[s].pop(0)
                done[(s, action)] = t
        table.append(tuple(row))
        t += 1
    return Schedule(name, stages, microbatches, tuple(table))


def _ready(
    s: int, action: Action, stages: int, done: dict[tuple[int, Action], int], t: int
) -> bool:
    m = action.microbatch
    if action.phase == "F":
        needs = [(s - 1, Action(m, "F"))] if s > 0 else []
    else:
        needs = [(s, Action(m, "F"))] + ([(s + 1, Action(m, "B"))] if s < stages - 1 else [])
    return all(done.get(need, t) < t for need in needs)
