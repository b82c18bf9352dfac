"""The `Automatic` tactic's search: partitioning actions, judged by the cost model.

PartIR's Automap searches over actions that tile a function's arguments and
lets propagation carry each through the program; DistIR ranks strategies
with its simulator. This search does both, with one evaluation per
candidate: apply the action to the program the manual tactics left (a
clone of the previous state's IR, so only the new action propagates), lower
it to SPMD and `estimate` it on a profile.

The actions are tactics appended to the schedule:

- the named tactics on each searched axis (`BatchParallel`, `Megatron`,
  `ZeRO` 1/2/3) whose plans apply: an action of many tiles each, as a user
  would write them (and how the result is recognised as "BatchParallel +
  Megatron": it is made of them);
- one tile of one argument leaf (a `ManualPartition` of it) for each dim
  the axis divides: the data and the parameters (their optimizer state
  follows them through the update; the ZeRO actions split it alone). The
  same leaf of every repeated layer is one action (`layer_groups`: Automap's
  grouping), so a deeper stack has no more actions than one layer;
- one tile of a value inside the program where propagation stopped, named
  by its `@`-reference (`partir.values`): the largest value of each of the
  largest stretches of ops left whole (`internal_actions`). A reference
  names a value of the state it was read on, so these are read afresh on
  each step's state, once the other actions stop gaining.

The method is lazy greedy (Minoux's accelerated greedy), coarse to fine:
every named tactic is evaluated once against the starting state; from then
on the action with the largest known gain is re-evaluated against the
current state and taken if it still beats every other action's last known
gain, else put back with its new gain. When no named tactic gains any
more, the one-leaf actions join, evaluated against the state the named
tactics reached (where propagation has already placed many of their
tiles, so they are dropped unevaluated), and the same loop refines it;
when those stop gaining, the internal values' actions join the same way.
Gains mostly shrink as the schedule grows (an axis can only be used once
per dim; propagation already spread what earlier actions implied), so
after a sweep a step costs a few evaluations rather than a sweep. They do
not always (ZeRO-1 pays once the batch is split), so before stopping, the
named tactics are measured again once per step.

A greedy first step can shut out the best path (ZeRO-3 over "batch" may
predict a hair faster than the batch split, after which the batch split
cannot use that axis), so when the climb converges with budget left, it
climbs again from the runner-up first step, and keeps the better end.

Why lazy greedy rather than Automap's MCTS or a beam: each evaluation
propagates, lowers and estimates the whole program (about 1 ms per op on
a shared 2-core host: 0.3-1 s for a transformer block's training step), so
a minute buys tens of evaluations. MCTS spends most of
its episodes on rollouts whose ends the cost model must still evaluate,
and a beam of width k multiplies every step's sweep by k; lazy greedy
spends one sweep, then a few evaluations per step, and every candidate it
evaluated is a schedule that runs, so whenever the budget ends it returns
the best one seen. An ILP over per-value choices would need the costs of all pairs of
choices, which only an evaluation of the whole program gives here.

Two prunings keep the one-leaf sweep short: an action whose tiles the
current state already has (propagation put them there) is dropped, and a
one-leaf action whose tile appeared in the result of one evaluated earlier
in the same sweep is taken to reach a subset of that result and skipped (a
`wk` column split when the `wq` one propagated to it). The order of the
actions is the named tactics first, then leaves by size, largest first;
`seed` shuffles ties, so a result is the same for the same seed (when the
search ends before its budget: a search cut short stops where the clock
stopped it).

Memory: a candidate whose predicted peak per device exceeds the limit is
never returned. The search first climbs as if there were no limit (a
limit does not make ZeRO-3 a better first step than the batch split, and
after ZeRO-3 on an axis the batch split no longer fits there); if where it
ends does not fit, it climbs on from there with actions ranked by how much
memory they save while over the limit, and by time once under it.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TextIO

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation
from xdsl.traits import ConstantLike

from dialects.dtypes import tensor_bytes
from dialects.errors import PartirError
from dialects.escaping import readable
from dialects.functions import entry_function
from dialects.spmd import DTensorType
from lowering.to_spmd import lower_to_spmd
from partir.cost.estimate import Estimate, estimate
from partir.cost.machine import SHIPPED_FALLBACK, machine_profile
from partir.cost.profile import Profile
from partir.mesh import Mesh
from partir.plan import Leaf, Plan, ProgramView, TacticError
from partir.roles import Roles
from partir.selections import recorded_selections
from partir.selectors import KEY_SLASH, argument_root, exact_selector, select, slash_path
from partir.tactics import (
    Automatic,
    BatchParallel,
    ManualPartition,
    Megatron,
    Tactic,
    ZeRO,
)
from partir.tiling import apply_plan
from partir.values import is_reference, references
from rewrites.actions import TileAction
from rewrites.registry import rule_for

Tile = tuple[int, int, str]
"""(argument index, dim, mesh axis): one argument dim split over one axis."""


@dataclass(frozen=True)
class Candidate:
    """One evaluated schedule (the tactics after the manual ones) and its prediction."""

    schedule: tuple[Tactic, ...]
    seconds: float
    peak_bytes: int
    bytes_moved: int
    """Per device and step, over every collective (each counted as often as it runs)."""
    collectives: int
    fits: bool
    tiles: frozenset[Tile] = field(default=frozenset(), compare=False, repr=False)
    """Where propagation left the arguments: the strategy, whatever the schedule's spelling."""

    @staticmethod
    def of(schedule: tuple[Tactic, ...], found: Estimate, tiles: frozenset[Tile],
           limit: int | None) -> Candidate:
        moved = sum(c.bytes_per_device * c.count for c in found.collectives)
        count = sum(c.count for c in found.collectives)
        fits = limit is None or found.peak_bytes <= limit
        return Candidate(schedule, found.seconds, found.peak_bytes, moved, count, fits, tiles)

    def score(self, limit: int | None) -> float:
        """Lower is better: the step's seconds where it fits, else far above
        any fitting candidate and ordered by its peak."""
        if self.fits or limit is None:
            return self.seconds
        return 1e9 * (1 + self.peak_bytes / limit)

    @property
    def source(self) -> str:
        return schedule_source(self.schedule)


@dataclass
class SearchResult:
    """What `Automatic` chose, and what it weighed."""

    chosen: Candidate
    baseline: Candidate
    """The manual tactics alone (the search's start)."""
    top: list[Candidate]
    """The best distinct strategies evaluated, best first."""
    evaluated: int
    rejected: int
    """Candidates over the memory limit, or that the tactics refused."""
    seconds: float
    finished: bool
    """False where the time budget ended the search."""
    profile: str
    profile_note: str
    axes: tuple[str, ...]

    @staticmethod
    def unsearched(ops: int, expected: float, tactic: Automatic, axes: tuple[str, ...],
                   profile: str, note: str) -> SearchResult:
        """A search the budget cannot start: the manual tactics alone, unevaluated."""
        nothing = Candidate((), float("nan"), 0, 0, 0, True)
        return SearchResult(
            chosen=nothing, baseline=nothing, top=[], evaluated=0, rejected=0, seconds=0.0,
            finished=False, profile=profile,
            profile_note=(
                f"{note}; not searched: one evaluation of this {ops}-op program is expected "
                f"to take about {expected:.0f} s, more than time_budget_s={tactic.time_budget_s}"
            ),
            axes=axes,
        )

    @property
    def schedule_source(self) -> str:
        """The chosen tactics as Python, to paste in place of `Automatic(...)`."""
        return self.chosen.source

    def message(self) -> str:
        if self.evaluated == 0:
            return (
                f"Automatic({', '.join(readable(a) for a in self.axes)}): evaluated 0 "
                "candidates (the time budget does not cover one); paste: []"
            )
        why = "converged" if self.finished else "time budget reached, best so far"
        return (
            f"Automatic({', '.join(readable(a) for a in self.axes)}): evaluated "
            f"{self.evaluated} candidates in {self.seconds:.1f} s ({why}; {self.rejected} "
            f"rejected) on profile {readable(self.profile)}: "
            f"{self.chosen.seconds * 1e3:.3f} ms predicted vs {self.baseline.seconds * 1e3:.3f} ms "
            f"without it; paste: {self.schedule_source}"
        )

    def table(self) -> str:
        """The top candidates, one line each."""
        lines = ["rank | predicted ms | peak MiB | MB moved | collectives | schedule"]
        for i, c in enumerate(self.top, 1):
            lines.append(
                f"{i} | {c.seconds * 1e3:.3f} | {c.peak_bytes / 2**20:.2f} | "
                f"{c.bytes_moved / 1e6:.3f} | {c.collectives} | {c.source}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.message()}\n{self.profile_note}\n{self.table()}"


def schedule_source(schedule: Sequence[Tactic]) -> str:
    """`schedule` as Python you can paste: `[partir.BatchParallel('batch'), ...]`
    (user names as Python string literals, `repr`)."""
    return "[" + ", ".join(_tactic_source(t) for t in schedule) + "]"


def _tactic_source(tactic: Tactic) -> str:
    if isinstance(tactic, BatchParallel):
        return f"partir.BatchParallel({tactic.axis!r})"
    if isinstance(tactic, Megatron):
        return f"partir.Megatron({tactic.axis!r})"
    if isinstance(tactic, ZeRO):
        return f"partir.ZeRO({tactic.axis!r}, stage={tactic.stage})"
    if isinstance(tactic, ManualPartition):
        entries = ", ".join(
            f"{selector!r}: {{{', '.join(f'{d}: {a!r}' for d, a in dims.items())}}}"
            for selector, dims in tactic.spec.items()
        )
        return f"partir.ManualPartition({{{entries}}})"
    return repr(tactic)


CALIBRATED = "calibrated"
"""The `profile=` that asks for this machine's measured profile
(`partir.cost.machine.machine_profile`)."""


def resolve_profile(profile: str | Profile | None) -> tuple[Profile, str]:
    """The profile to search on, and a note saying which it is: the one
    given, else the shipped default; this machine's calibrated one only when
    asked (`CALIBRATED`), so a file another process writes never changes a pick."""
    if isinstance(profile, Profile):
        return profile, f"profile {readable(profile.name)} (given)"
    if profile == CALIBRATED:
        return machine_profile()
    if profile is not None:
        return Profile.load(profile), f"profile {readable(str(profile))}"
    return Profile.load(SHIPPED_FALLBACK), (
        f"profile {readable(SHIPPED_FALLBACK)} (the default; profile={CALIBRATED!r} for this "
        "machine's, as partir.calibrate() measured it)"
    )


def _planned(action: Tactic, module: ModuleOp, mesh: Mesh) -> Plan:
    """`action`'s plan on `module` as the schedule so far left it (ZeRO
    picks its dims per device), as `partir.partition` applies it when the
    schedule is pasted."""
    return action.plan(ProgramView.of(entry_function(module)), mesh)


def argument_tiles(spmd: ModuleOp) -> frozenset[Tile]:
    """Each argument dim split over a mesh axis in the SPMD `spmd`."""
    found: set[Tile] = set()
    for index, arg in enumerate(entry_function(spmd).body.block.args):
        if isinstance(arg.type, DTensorType):
            for dim, axes in enumerate(arg.type.distribution.dims):
                found.update((index, dim, axis) for axis in axes)
    return frozenset(found)


@dataclass
class _State:
    module: ModuleOp
    """The core IR after the schedule (never lowered: each evaluation
    lowers a clone; the one taken is applied again to a clone, rather than
    every evaluated candidate's core IR being kept)."""
    candidate: Candidate
    step: int
    actions: tuple[TileAction, ...] = ()
    """The tiling actions the schedule took on `module`, in order."""


@dataclass
class Searched:
    """A search's result and, when the pick is the state the search ended
    in, that state's core IR and actions: what applying the pick again to
    the module would make (`partir.plan_passes.AutomaticPass` adopts it rather
    than spend the time twice)."""

    result: SearchResult
    module: ModuleOp | None = None
    actions: tuple[TileAction, ...] = ()


def candidate_actions(
    view: ProgramView, mesh: Mesh, axes: Sequence[str], seed: int
) -> list[tuple[Tactic, frozenset[Tile]]]:
    """The actions (see the module docstring), each with the tiles its plan
    takes, in search order."""
    roles = Roles.of(view.arguments, view.results)
    named: list[Tactic] = []
    for axis in axes:
        named += [BatchParallel(axis), Megatron(axis)]
        named += [ZeRO(axis, stage) for stage in (1, 2, 3)]
    actions: list[tuple[Tactic, frozenset[Tile]]] = []
    for tactic in named:
        try:
            plan = tactic.plan(view, mesh)
        except (TacticError, PartirError):
            continue  # no Megatron names, no optimizer state, ...
        tiles = frozenset(
            (t.leaf.index, t.dim, t.axis)
            for t in plan
            if isinstance(t.leaf, Leaf) and t.leaf.kind == "argument"
        )
        if tiles:
            actions.append((tactic, tiles))
    leaves = [
        leaf for leaf in view.arguments
        if leaf.shape and roles.optimizer_of(leaf) is None
    ]
    single: list[tuple[int, Tactic, frozenset[Tile]]] = []
    names = [leaf.name for leaf in view.arguments]
    for selector, group in layer_groups(leaves, names):
        shape = group[0].shape
        size = len(group) * math.prod(shape)
        for dim, n in enumerate(shape):
            for axis in axes:
                parts = mesh.axes[axis]
                if n >= parts and n % parts == 0:
                    tactic = ManualPartition({s: {dim: axis} for s in selector})
                    tiles = frozenset((leaf.index, dim, axis) for leaf in group)
                    single.append((size, tactic, tiles))
    order = random.Random(seed)
    order.shuffle(single)  # ties (equal sizes) in the seed's order
    single.sort(key=lambda s: -s[0])
    return actions + [(tactic, tiles) for _, tactic, tiles in single]


INTERNAL_STRETCHES = 4
"""How many stretches of whole ops (the largest) each step of the internal
tier tries (`internal_actions`): each costs an evaluation per dim and axis."""


def internal_actions(
    module: ModuleOp, mesh: Mesh, axes: Sequence[str], stretches: int = INTERNAL_STRETCHES
) -> list[Tactic]:
    """Tiles of values inside the program where propagation stopped, on the
    state `module` is: one `ManualPartition` of an `@`-reference
    (`partir.values`) per dim and axis, for the largest value of each of the
    `stretches` largest stretches of whole ops (ops outside every loop,
    connected through the non-scalar values they pass each other; by the
    bytes they make). Tiling one value of a stretch tiles the stretch:
    propagation runs backward through its producers and forward through
    its users."""
    entry = entry_function(module)
    refs = references(entry)
    members: dict[Operation, int] = {}
    parent: list[int] = []

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for op in refs:
        if not _sized(op) or op.has_trait(ConstantLike) or rule_for(op) is None:
            continue  # a constant is a literal: splitting it computes nothing less
        index = members[op] = len(parent)
        parent.append(index)
        for value in op.operands:
            producer = value.owner
            if isinstance(producer, Operation) and producer in members:
                parent[find(index)] = find(members[producer])
    groups: dict[int, list[Operation]] = {}
    for op, index in members.items():
        groups.setdefault(find(index), []).append(op)
    ranked = sorted(groups.values(), key=lambda ops: -sum(_bytes(op) for op in ops))
    actions: list[Tactic] = []
    for ops in ranked[:stretches]:
        largest = max(_bytes(op) for op in ops)
        value_op = [op for op in ops if _bytes(op) == largest][-1]  # the last: downstream
        for dim, n in enumerate(_shape(value_op)):
            for axis in axes:
                parts = mesh.axes[axis]
                if n >= parts and n % parts == 0:
                    actions.append(ManualPartition({refs[value_op]: {dim: axis}}))
    return actions


def _shape(op: Operation) -> tuple[int, ...]:
    ty = op.results[0].type
    return tuple(ty.get_shape()) if isinstance(ty, TensorType) else ()


def _sized(op: Operation) -> bool:
    """One tensor result of rank >= 1 (a scalar links every stretch and splits nowhere)."""
    return len(op.results) == 1 and len(_shape(op)) >= 1


def _bytes(op: Operation) -> int:
    ty = op.results[0].type
    assert isinstance(ty, TensorType)
    return tensor_bytes(ty)


def layer_groups(
    leaves: Sequence[Leaf], names: Sequence[str]
) -> list[tuple[list[str], list[Leaf]]]:
    """`leaves` grouped as Automap groups repeated layers: leaves whose paths
    differ only in list indices below their root (`params/blocks/3/attn/wq`)
    and share a shape are decided together, so a deeper stack does not
    multiply the actions. Each group comes with the selectors that select
    exactly it among `names`: one glob with `*` for the index
    (`params/blocks/*/attn/wq`), or each leaf's exact selector where no
    glob does."""
    groups: dict[tuple[str, tuple[int, ...]], list[Leaf]] = {}
    for leaf in leaves:
        segments = slash_path(leaf.name).split("/")
        keep = argument_root(leaf.name).count("/") + 1  # the root (and `args/i`) stay
        if any(KEY_SLASH in seg for seg in segments):
            key = exact_selector(leaf.name)
        else:
            key = "/".join(
                "*" if i >= keep and seg.isdigit() else exact_selector(seg)
                for i, seg in enumerate(segments)
            )
        groups.setdefault((key, leaf.shape), []).append(leaf)
    found = []
    for (key, _), group in groups.items():
        if select([key], names) == [leaf.index for leaf in group]:
            found.append(([key], group))
        else:  # another leaf matches the glob (a different shape): name each
            found.append(([exact_selector(leaf.name) for leaf in group], group))
    return found


class _Progress:
    """A one-line bar of the time budget, with the best prediction so far."""

    def __init__(self, budget: float, out: TextIO | None):
        self.budget, self.out, self.start = budget, out, time.perf_counter()
        self.shown = -1.0

    def show(self, evaluated: int, best: Candidate) -> None:
        if self.out is None:
            return
        spent = time.perf_counter() - self.start
        if spent - self.shown < 0.5:
            return
        self.shown = spent
        width = 30
        filled = min(width, int(width * spent / self.budget))
        bar = "#" * filled + " " * (width - filled)
        self.out.write(
            f"\rsearching [{bar}] {spent:4.0f}/{self.budget:.0f} s, {evaluated} candidates, "
            f"best {best.seconds * 1e3:.3f} ms"
        )
        self.out.flush()

    def done(self) -> None:
        if self.out is not None:
            self.out.write("\n")
            self.out.flush()


def search(module: ModuleOp, mesh: Mesh, tactic: Automatic) -> Searched:
    """Search the schedule `tactic` stands for, on `module` as the tactics
    before it left it (not modified).

    The budget covers the search: an evaluation starts only if the time
    left covers it and one more (what may follow it: taking its action, the
    second climb's start, or making a pick that is not the state the search
    ended in), each at the cost of the last evaluations."""
    start = time.perf_counter()
    deadline = start + tactic.time_budget_s
    view = ProgramView.of(entry_function(module))
    used = {s.axis for s in recorded_selections(module) if s.dim is not None}
    axes = tactic.search_axes(mesh, used)
    profile, note = resolve_profile(tactic.profile)
    limit = tactic.memory_limit_bytes
    progress = _Progress(tactic.time_budget_s, sys.stderr if tactic.progress else None)
    evaluated, rejected = 0, 0
    # per strategy: where the arguments are split, and which inner values were
    seen: dict[tuple[frozenset[Tile], frozenset[str]], Candidate] = {}
    costs: list[float] = []

    def evaluate(state_module: ModuleOp, schedule: tuple[Tactic, ...], action: Tactic | None
                 ) -> Candidate | None:
        nonlocal evaluated, rejected
        began = time.perf_counter()
        try:
            found, tiles = _evaluate(state_module, action, mesh, profile)
        except (PartirError, ValueError):  # e.g. a dim split over more devices than it has
            rejected += 1
            evaluated += 1
            costs.append(time.perf_counter() - began)
            return None
        evaluated += 1
        costs.append(time.perf_counter() - began)
        candidate = Candidate.of(schedule, found, tiles, limit)
        if not candidate.fits:
            rejected += 1
        strategy = (candidate.tiles, _references_in(schedule))
        previous = seen.get(strategy)
        if previous is None or candidate.score(limit) < previous.score(limit):
            seen[strategy] = candidate
        progress.show(evaluated, min(seen.values(), key=lambda c: c.score(limit)))
        return candidate

    ops = sum(1 for _ in module.walk())
    expected = ops * SECONDS_PER_OP
    if start + expected > deadline:  # not even the start fits: say so, change nothing
        progress.done()
        skipped = SearchResult.unsearched(ops, expected, tactic, axes, profile.name, note)
        print(skipped if tactic.progress else skipped.message(), file=sys.stderr)
        return Searched(skipped)
    first = evaluate(module, (), None)
    if first is None:
        raise TacticError(f"{tactic.name}: the program the tactics before it left does not lower")
    state = _State(module, first, 0)
    baseline = state
    actions = candidate_actions(view, mesh, axes, tactic.seed)
    argument_actions = len(actions)

    def time_left() -> bool:
        return time.perf_counter() + 2 * max(costs[-8:]) < deadline

    def climb(state: _State, active: int | None) -> tuple[_State, bool]:
        """Lazy greedy from `state`, scoring with the limit `active`; the
        state it ends in, and whether it converged (not the budget)."""
        # heap of (-gain, order, step the gain was measured at, action index):
        # the named tactics first; the one-leaf actions join when those stop gaining
        given = actions[:argument_actions]  # not the internal ones an earlier climb named
        heap = [(-float("inf"), i, -1, i) for i, (a, _) in enumerate(given) if _named(a)]
        leaves = [(-float("inf"), i, -1, i) for i, (a, _) in enumerate(given) if not _named(a)]
        fresh: dict[int, Candidate] = {}
        swept: set[Tile] = set()  # tiles reached by the one-leaf actions' first sweep
        sweep_step = -1  # the step of that sweep
        refreshed = state.step  # the last step whose named tactics were measured again
        internal: set[int] = set()  # the internal tier's actions, named on this step's state
        internal_step = -1  # the step they were named on
        while True:
            head = heap[0] if heap else None
            stop = _min_gain(state.candidate, active)
            if head is None or (head[2] == state.step and -head[0] <= stop):
                # Gains are not submodular: a named tactic that did not pay
                # before may now (ZeRO-1 once the batch is split). Measure those
                # again once per step, then bring in the one-leaf actions, then
                # the values inside the program where propagation stopped, then stop.
                stale = [e for e in heap if e[2] < state.step and _named(actions[e[3]][0])]
                if refreshed < state.step and stale:
                    refreshed = state.step
                    heap = [e for e in heap if e not in stale]
                    heap += [(-float("inf"), e[1], -1, e[3]) for e in stale]
                elif leaves:
                    heap += leaves
                    leaves, sweep_step = [], state.step
                elif internal_step < state.step:
                    internal_step = state.step
                    for inner in internal_actions(state.module, mesh, axes):
                        internal.add(len(actions))
                        heap.append((-float("inf"), len(actions), -1, len(actions)))
                        actions.append((inner, frozenset()))
                else:
                    return state, True
                heapq.heapify(heap)
                continue
            if not time_left():
                return state, False
            _, order, measured_at, index = heapq.heappop(heap)
            action, tiles = actions[index]
            if tiles and tiles <= state.candidate.tiles:
                fresh.pop(index, None)
                continue  # propagation already did it
            if measured_at == state.step:
                taken_candidate = fresh.pop(index)
                taken = state.module.clone()  # the candidate's core IR, made again
                made = apply_plan(taken, _planned(action, taken, mesh))
                state = _State(taken, taken_candidate, state.step + 1, (*state.actions, *made))
                fresh.clear()
                # a reference names a value of the state it was read on: drop the
                # others (the next state's are read when the tier comes round again)
                heap = [e for e in heap if e[3] not in internal]
                heapq.heapify(heap)
                internal.clear()
                continue
            if state.step == sweep_step and len(tiles) == 1 and tiles <= swept:
                continue  # a subset of an evaluated one-leaf action's result
            schedule = (*state.candidate.schedule, action)
            evaluated_candidate = evaluate(state.module, schedule, action)
            if evaluated_candidate is None:
                continue
            candidate = evaluated_candidate
            if state.step == sweep_step and not _named(action):
                swept |= candidate.tiles
            gain = state.candidate.score(active) - candidate.score(active)
            if gain > _min_gain(state.candidate, active):
                fresh[index] = candidate
            heapq.heappush(heap, (-gain, order, state.step, index))

    # Fastest first, memory aside (the order a user would take: a memory
    # limit does not make ZeRO-3 a better first step than the batch split);
    # then, if that does not fit, on from there towards less memory.
    def descend(start: _State) -> tuple[_State, bool]:
        end, converged = climb(start, None)
        if converged and limit is not None and not end.candidate.fits:
            end, converged = climb(end, limit)
        return end, converged

    state, finished = descend(state)
    # Greedy's first step decides much (after ZeRO-3 on an axis the batch
    # split cannot use it): climb again from the runner-up first step, as a
    # second start, while the budget lasts.
    firsts = sorted(
        (c for c in seen.values() if len(c.schedule) == 1),
        key=lambda c: c.score(None),
    )
    taken_first = state.candidate.schedule[:1]
    runner_up = next((c for c in firsts if c.schedule != taken_first), None)
    if (finished and runner_up is not None and time_left()
            and baseline.candidate.score(None) - runner_up.score(None)
            > _min_gain(baseline.candidate, None)):
        second = baseline.module.clone()
        made = apply_plan(second, _planned(runner_up.schedule[0], second, mesh))
        other, finished = descend(_State(second, runner_up, 1, tuple(made)))
        if other.candidate.score(limit) < state.candidate.score(limit):
            state = other
    progress.done()
    # Every evaluated candidate is a schedule that runs: the greedy path's
    # end, unless another one beats it by more than an action must save (the
    # budget may end the search before the path reaches the best it saw).
    chosen = min(seen.values(), key=lambda c: (c.score(limit), len(c.schedule)))
    if state.candidate.score(limit) - chosen.score(limit) <= _min_gain(state.candidate, limit):
        chosen = state.candidate
    if not chosen.fits:
        smallest = min(seen.values(), key=lambda c: c.peak_bytes)
        raise TacticError(
            f"{tactic.name}: no candidate fits memory_limit_bytes={limit} "
            f"({evaluated} evaluated in {time.perf_counter() - start:.1f} s; the smallest "
            f"peak found is {smallest.peak_bytes} bytes per device, by {smallest.source}); "
            "raise the limit, the time budget, or add axes"
        )
    top = sorted(
        (c for c in seen.values() if c.fits), key=lambda c: (c.score(limit), len(c.schedule))
    )[: max(tactic.top_k, 1)]
    result = SearchResult(
        chosen=chosen,
        baseline=baseline.candidate,
        top=top,
        evaluated=evaluated,
        rejected=rejected,
        seconds=time.perf_counter() - start,
        finished=finished,
        profile=profile.name,
        profile_note=note,
        axes=axes,
    )
    print(result if tactic.progress else result.message(), file=sys.stderr)
    if chosen is state.candidate and state.step > 0:
        return Searched(result, state.module, state.actions)
    return Searched(result)


MIN_GAIN = 0.02
"""The least an action must save to be taken: 2% of the predicted step (or
of the memory limit, while over it). The cost model ranks strategies well
(Spearman's ρ 0.85 on this host) but not to the last percent, so smaller
predicted gains would grow the schedule on noise."""


def _evaluate(
    state: ModuleOp, action: Tactic | None, mesh: Mesh, profile: Profile
) -> tuple[Estimate, frozenset[Tile]]:
    """`action` applied to a copy of `state`, lowered and estimated; with the
    argument tiles it reached. The copy is garbage after it, cycles and all
    (xDSL's IR links parents and children): the young objects are collected
    here, each evaluation's own, so the search's memory stays one program's
    rather than growing by one per candidate (the collector is paused while
    partitioning)."""
    spmd = state.clone()
    try:
        if action is not None:
            apply_plan(spmd, _planned(action, spmd, mesh))
        lower_to_spmd(spmd)
        return estimate(spmd, profile), argument_tiles(spmd)
    finally:
        del spmd
        gc.collect(0)


def _references_in(schedule: Sequence[Tactic]) -> frozenset[str]:
    """The values inside the program a schedule tiles by reference."""
    return frozenset(
        key
        for tactic in schedule
        if isinstance(tactic, ManualPartition)
        for key in tactic.spec
        if is_reference(key)
    )


def _named(tactic: Tactic) -> bool:
    return isinstance(tactic, BatchParallel | Megatron | ZeRO)


SECONDS_PER_OP = 5e-4
"""What one candidate's evaluation (clone, propagate, lower, estimate) costs
per op of the program, at most: 0.15-0.2 ms per op from 1,000 to 22,000 ops
on this project's 2-core host (`benchmarks/auto.py --scaling`), and up to
2.5 times that while other jobs load it. A search whose budget cannot
cover even one evaluation returns at once rather than overrun it. After
the first evaluation, the measured costs decide."""


def _min_gain(current: Candidate, limit: int | None) -> float:
    if current.fits or limit is None:
        return MIN_GAIN * current.score(limit)
    return MIN_GAIN * 1e9


def decided(tactic: Automatic, result: SearchResult) -> Automatic:
    """`tactic` with the schedule its search chose (what a replay applies)."""
    return replace(tactic, chosen=result.chosen.schedule)
