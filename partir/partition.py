"""The schedule driver: plan every tactic once, then run their passes in order.

`partition` is the one driver: `partir.jit` calls it, and `partir-opt` runs
the same `ApplyPlanPass` inside each tactic pass. Every tactic is planned
(and so checked) before anything changes; by default the plans' tiles are
then decided together in plain data and the core IR built once
(`partition_decided`), or, with `engine="rewrite"` (and where the builder
hands over), run as an xDSL `PassPipeline`, each tile followed by
propagation.

Stages are the IR as it was after each step, keyed by name ("import", a
tactic's name, "ZeRO#2" for the second tactic of one class) or by index. A
stage holds a snapshot of the module (cloning is ~3x cheaper than printing)
and prints it only when its text is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass, PassPipeline

from dialects.context import make_context
from dialects.errors import PartirValueError, UnsupportedError
from dialects.functions import entry_function, return_whole_over
from dialects.heap import paused_gc
from dialects.locations import located_text
from dialects.partir import MeshOp
from partir.annotation_conflicts import split_whole_dims
from partir.annotations import annotation_ops, holds_annotations, remove_annotations
from partir.mesh import Mesh
from partir.plan import AnnotatedValue
from partir.plan_passes import ApplyPlanPass, AutomaticPass, adopt
from partir.search import SearchResult, decided
from partir.selections import record_selections
from partir.tactics import Annotations, Automatic, Plan, ProgramView, Tactic, ZeRO
from partir.tiling import declare_mesh, plan_seeds, tactic_error, take_annotations
from rewrites.actions import (
    ActionError,
    TileAction,
    check_action,
    check_size,
    take_action_numbers,
)
from rewrites.build_core import build_core
from rewrites.buildable import buildable, needs_rewriting
from rewrites.conflicts import Conflict, record_conflicts, recorded_conflicts
from rewrites.factor_propagation import Decision, Seed, decide


@dataclass(frozen=True, eq=False)
class Stage:
    """The IR after one step of the schedule. `module` is a snapshot nothing
    rewrites afterwards; `text` prints it on first read."""

    name: str
    module: ModuleOp

    @cached_property
    def text(self) -> str:
        return str(self.module)

    @cached_property
    def located_text(self) -> str:
        """`text` with each op's location, `loc(...)` after it, as
        `partir-opt --print-debuginfo` prints it (`dialects.locations`)."""
        return located_text(self.module)

    @staticmethod
    def snapshot(name: str, module: ModuleOp) -> Stage:
        with paused_gc():
            return Stage(name, module.clone())


def stage_names(tactics: Sequence[Tactic]) -> list[str]:
    """A stage name per tactic: its name, with `#k` from the second of one name
    on (`["ZeRO", "Megatron", "ZeRO#2"]`)."""
    seen: dict[str, int] = {}
    names = []
    for tactic in tactics:
        seen[tactic.name] = seen.get(tactic.name, 0) + 1
        count = seen[tactic.name]
        names.append(tactic.name if count == 1 else f"{tactic.name}#{count}")
    return names


def find_stage(stages: Sequence[Stage], key: str | int) -> Stage:
    """The stage named `key`, or at index `key`."""
    if isinstance(key, int):
        if -len(stages) <= key < len(stages):
            return stages[key]
        raise IndexError(f"no stage {key}; there are {len(stages)} stages")
    for stage in stages:
        if stage.name == key:
            return stage
    raise KeyError(f"no stage {key!r}; the stages are {[s.name for s in stages]}")


@dataclass
class Partitioned:
    module: ModuleOp
    plans: list[Plan] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    actions: list[TileAction] = field(default_factory=list)
    searches: list[SearchResult] = field(default_factory=list)
    """What each `Automatic` of the schedule searched and chose (`partir.search`)."""
    decided: list[Tactic] = field(default_factory=list)
    """The schedule with each `Automatic` holding what it chose: replaying it
    applies the same tactics without searching again."""

    def stage(self, key: str | int) -> str:
        """The IR text of a stage, by name or index (see `find_stage`)."""
        return find_stage(self.stages, key).text


def with_annotations(module: ModuleOp, tactics: Sequence[Tactic]) -> list[Tactic]:
    """The schedule to run on `module`: `Annotations` first when the program
    states shardings of its own and the schedule does not place it (user
    annotations win, as in PartIR and Shardy). A program with none is rid
    of JAX's trivial ones (a scalar's `@empty_mesh`, JAX's mesh declarations)
    here, so no later stage sees them."""
    if any(isinstance(t, Annotations) for t in tactics):
        return list(tactics)
    found = annotation_ops(module)
    if holds_annotations(module, found):
        return [Annotations(), *tactics]
    remove_annotations(module, found)
    return list(tactics)


def plan_schedule(module: ModuleOp, mesh: Mesh, tactics: Sequence[Tactic]) -> list[Plan]:
    """Each tactic's plan against the module's entry function (raises
    `TacticError` naming the tactic before anything is rewritten)."""
    view = ProgramView.of(entry_function(module))
    return [tactic.plan(view, mesh) for tactic in tactics]


@paused_gc()  # planning, rewrites and snapshots: a collection walks the whole IR
def partition(
    module: ModuleOp,
    mesh: Mesh,
    tactics: Sequence[Tactic],
    *,
    keep_stages: bool = False,
    verify: bool = False,
    engine: str = "decided",
) -> Partitioned:
    """Apply `tactics` to `module` (in place), each followed by propagation
    (`Annotations` first where the program holds any: `with_annotations`).

    With `keep_stages`, `stages` holds "import" and one stage per tactic (see
    `stage_names`); with `verify`, the dialect verifier runs after each tactic.
    The default engine, "decided", decides every sharding in plain data and
    builds the core IR once (`partition_decided`); `engine="rewrite"` runs the
    tactics as rewrite passes, one tile and its propagation at a time (the
    reference the decided path is checked against, and what `partir-opt`'s
    tactic passes run).
    """
    if engine == "decided":
        return partition_decided(module, mesh, tactics, keep_stages=keep_stages, verify=verify)
    if engine != "rewrite":
        raise PartirValueError(f"partition: engine={engine!r}; use 'rewrite' or 'decided'")
    tactics = with_annotations(module, tactics)
    plans = plan_schedule(module, mesh, tactics)
    return _rewrite(module, mesh, tactics, plans, keep_stages=keep_stages, verify=verify)


def _rewrite(
    module: ModuleOp,
    mesh: Mesh,
    tactics: Sequence[Tactic],
    plans: list[Plan],
    *,
    keep_stages: bool,
    verify: bool,
) -> Partitioned:
    """The rewrite engine: each planned tactic as a pass, each tile followed
    by propagation (`tactics` with their annotations, planned as `plans`)."""
    declare_mesh(module, mesh)
    result = Partitioned(module, plans)
    passes: list[ModulePass] = [
        AutomaticPass(tactic) if isinstance(tactic, Automatic) else ApplyPlanPass(plan, tactic)
        for tactic, plan in zip(tactics, plans, strict=True)
    ]
    names = iter(stage_names(tactics))  # the pipeline runs the passes in order
    schedule = iter(tactics)

    def after(done: ModulePass | None, module: ModuleOp, _next: ModulePass | None) -> None:
        if done is None:
            if keep_stages:
                result.stages.append(Stage.snapshot("import", module))
            return
        assert isinstance(done, ApplyPlanPass | AutomaticPass)
        result.actions += done.actions
        if isinstance(done, ApplyPlanPass):  # planned again after the tactics before
            result.plans[len(result.decided)] = done.applied[0]
        tactic = next(schedule)
        if isinstance(done, AutomaticPass) and isinstance(tactic, Automatic) and done.results:
            result.searches += done.results
            tactic = decided(tactic, done.results[0])
        result.decided.append(tactic)
        if verify:
            module.verify()
        if keep_stages:
            result.stages.append(Stage.snapshot(next(names), module))

    PassPipeline(tuple(passes), after).apply(make_context(), module)
    result.conflicts = recorded_conflicts(module)
    return result


def decide_partition(module: ModuleOp, mesh: Mesh, tactics: Sequence[Tactic]) -> Decision:
    """Every value's sharding under `tactics`, decided in plain data
    (`rewrites.factor_propagation`); `module` is not rewritten (its mesh is
    declared). Not with `Automatic`, whose search partitions candidates by
    rewriting: decide its schedule with `partition` first (`Partitioned.decided`)."""
    if any(isinstance(t, Automatic) for t in tactics):
        raise PartirValueError(
            "decide_partition: Automatic searches by rewriting; pass the schedule it chose "
            "(partition(...).decided) instead"
        )
    plans = plan_schedule(module, mesh, tactics)
    declare_mesh(module, mesh)
    return decide(module, dict(mesh.axes), plan_seeds(module, plans))


def partition_decided(
    module: ModuleOp,
    mesh: Mesh,
    tactics: Sequence[Tactic],
    *,
    keep_stages: bool = False,
    verify: bool = False,
) -> Partitioned:
    """`partition`, decided in plain data and built once
    (`rewrites.factor_propagation`, `rewrites.build_core`). With
    `keep_stages`, tactic k's stage is the first k tactics' decision built on
    a copy of the imported module (what the rewrite engine's IR is after
    tactic k). An `Automatic` searches by rewriting (on a copy); the schedule
    it chose is then built here as its pasted schedule would be, so pasting
    it gives the same program. A dim the first tactic pads for divisibility
    is padded first, an argmax along a split dim regrouped and a split op of
    several used results copied per result, then decided again
    (`rewrites.buildable`). What the builder does not build yet (a later
    tactic's padding, a window or a pick split over two axes) and what only
    `apply_plan` does go to the rewrite engine, with the same result."""
    tactics = with_annotations(module, tactics)
    with paused_gc():
        plans = plan_schedule(module, mesh, tactics)
        searching = any(isinstance(t, Automatic) and t.chosen is None for t in tactics)
        if searching and not keep_stages:
            # The search partitions its candidates by rewriting (on a copy);
            # what it chose is then built as a pasted schedule would be.
            searched = _rewrite(
                module.clone(), mesh, tactics, plans, keep_stages=False, verify=False
            )
            result = partition_decided(module, mesh, searched.decided, verify=verify)
            result.searches = searched.searches
            return result
        chosen = _with_choices(tactics)
        if chosen != tactics:
            plans_built = plan_schedule(module, mesh, chosen)
        else:
            plans_built = plans
        if (
            (keep_stages and chosen != tactics)  # an Automatic's stage is its own
            or searching
            or any(p.removes_annotations for p in plans_built[1:])
        ):
            # `Annotations` after another tactic (its values may be parts of
            # that tactic's loops already) is the rewrite engine's alone yet
            return _rewrite(module, mesh, tactics, plans, keep_stages=keep_stages, verify=verify)
        declare_mesh(module, mesh)
        imported = Stage.snapshot("import", module) if keep_stages else None
        # taking JAX's shardings out changes the module before the builder
        # may refuse: the rewrite engine then starts from a copy
        annotated = module.clone() if plans_built and plans_built[0].removes_annotations else None
        try:
            result = _decide_and_build(module, mesh, chosen, plans_built)
        except UnsupportedError:
            if annotated is not None:
                adopt(module, annotated)
            result = _rewrite(
                module, mesh, chosen, plans_built, keep_stages=keep_stages, verify=verify
            )
            if chosen != tactics:  # stages are kept only without an Automatic
                result.decided = list(tactics)
            return result
        result.decided = list(tactics)  # an Automatic as it chose, for replays
        if verify:
            module.verify()
        if imported is not None:
            result.stages = _decided_stages(imported, module, mesh, tactics, plans)
    return result


def _with_choices(tactics: list[Tactic]) -> list[Tactic]:
    """The schedule with each `Automatic` that has chosen replaced by the
    tactics it chose (what pasting its schedule gives)."""
    out: list[Tactic] = []
    for tactic in tactics:
        if isinstance(tactic, Automatic) and tactic.chosen is not None:
            out += tactic.chosen
        else:
            out.append(tactic)
    return out


def _decided_stages(
    imported: Stage, module: ModuleOp, mesh: Mesh, tactics: Sequence[Tactic], plans: list[Plan]
) -> list[Stage]:
    """ "import" and, per tactic, the first k tactics' decision built on a copy
    of the import (`module` is the last)."""
    names = stage_names(tactics)
    stages = [imported]
    if not names:
        return stages
    for k, name in enumerate(names[:-1], start=1):
        prefix = imported.module.clone()
        try:
            _decide_and_build(prefix, mesh, tactics[:k], plans[:k])
        except UnsupportedError:  # a prefix the builder leaves to the engine
            replayed = partition(
                imported.module.clone(), mesh, tactics, keep_stages=True, engine="rewrite"
            )
            return [imported, *replayed.stages[1:-1], Stage.snapshot(names[-1], module)]
        stages.append(Stage(name, prefix))
    return [*stages, Stage.snapshot(names[-1], module)]


def _planned_again(
    module: ModuleOp,
    mesh: Mesh,
    tactics: Sequence[Tactic],
    plans: list[Plan],
    seeds: list[list[Seed]],
    decision: Decision,
) -> list[Plan] | None:
    """The plans again where a ZeRO after other tactics plans otherwise on
    the per-device shapes they leave (as the rewrite engine's
    `ApplyPlanPass` plans it after them): its dims picked from the local
    shapes, a parameter those tactics split over its axis returned as it
    came. None where every plan stands. A split an earlier tactic decided
    carries an action number below the ZeRO's first (priorities are never
    overridden), so the decision of the whole schedule tells what the
    tactics before left, without deciding them again."""
    entry = entry_function(module)
    ret = entry.body.block.last_op
    assert ret is not None
    view: ProgramView | None = None
    again = list(plans)
    for k, tactic in enumerate(tactics):
        if k == 0 or not isinstance(tactic, ZeRO) or not seeds[k]:
            continue
        first = seeds[k][0].origin.action.data
        if view is None:
            view = ProgramView.of(entry)
        returned_whole = {(w.leaf.index, w.axis) for plan in plans[:k] for w in plan.whole}
        splits = {}
        for leaf, arg in zip(view.arguments, entry.body.block.args, strict=True):
            if earlier := _split_before(decision, arg, first, argument=True):
                splits[leaf.name] = earlier
        for leaf, value in zip(view.results, ret.operands, strict=True):
            earlier = _split_before(decision, value, first, argument=False)
            if earlier := tuple(s for s in earlier if (leaf.index, s[1]) not in returned_whole):
                splits[leaf.name] = earlier
        if _reads(plans[k], tactic, view, splits):
            again[k] = tactic.plan(replace(view, splits=splits), mesh)
    return again if again != plans else None


def _reads(plan: Plan, tactic: ZeRO, view: ProgramView, splits: dict[str, tuple]) -> bool:
    """Whether planning `tactic` on `splits` may plan otherwise than `plan`:
    a leaf it names (tiled, passed, returned whole) is split, or an
    argument is split over its axis while it returns parameters whole (a
    parameter that came split returns split)."""
    named = {t.leaf.name for t in plan} | {p.leaf.name for p in plan.passed}
    named |= {w.leaf.name for w in plan.whole}
    if any(name in named for name in splits):
        return True
    arguments = {leaf.name for leaf in view.arguments}
    return bool(plan.whole) and any(
        name in arguments and any(axis == tactic.axis for _, axis in split)
        for name, split in splits.items()
    )


def _split_before(
    decision: Decision, value: SSAValue, first: int, *, argument: bool
) -> tuple[tuple[int, str], ...]:
    """The (dim, axis) splits of `value` that actions numbered below `first`
    decided: an argument's as its uses read it, a result's as it is made."""
    graph = decision.graph
    v = graph.ids.get(value)
    if v is None:
        return ()
    if not argument:
        return tuple(
            (dim, axis)
            for axis, dim in decision.split_of(v).items()
            if (p := decision.value_priority_of(v, axis)) is not None and p[0] < first
        )
    found: dict[str, int] = {}
    for o, i in graph.uses[v]:
        for axis, dim in decision.wanted(o, i).items():
            if decision.use_priority(o, axis)[0] < first:
                found.setdefault(axis, dim)
    return tuple((dim, axis) for axis, dim in found.items())


def _checked_actions(
    plans: list[Plan], seeds: list[list[Seed]], mesh_op: MeshOp
) -> list[list[TileAction]]:
    """Each plan's seeds as tile actions, checked as the rewrite engine
    checks them before anything changes (its errors, naming the tactic
    and, for an annotation, the annotation)."""
    actions = []
    for plan, planned in zip(plans, seeds, strict=True):
        actions.append([TileAction(s.value, s.dim, s.axis, s.origin, s.label) for s in planned])
        for tile, action in zip(plan, actions[-1], strict=True):
            try:
                check_action(action, mesh_op)
            except ActionError as err:
                if not isinstance(tile.leaf, AnnotatedValue):
                    raise
                raise tactic_error(plan, tile, err) from None
    return actions


def _decide_and_build(
    module: ModuleOp, mesh: Mesh, tactics: Sequence[Tactic], plans: list[Plan]
) -> Partitioned:
    """Decide `plans`' seeds on `module` (its mesh declared) and build its
    core IR once, recording the actions' numbers, selections and conflicts
    as the rewrite engine's passes do."""
    mesh_op = declare_mesh(module, mesh)  # declared already: the module's own
    annotated = {}
    if plans and plans[0].removes_annotations:
        annotated = take_annotations(module, plans[0])
    seeds = plan_seeds(module, plans, annotated)
    actions = _checked_actions(plans, seeds, mesh_op)
    decision = decide(module, dict(mesh.axes), seeds)
    again = _planned_again(module, mesh, tactics, plans, seeds, decision)
    if again is not None:  # decided once more, with the plans made after the tactics before
        plans = again
        seeds = plan_seeds(module, plans, annotated)
        actions = _checked_actions(plans, seeds, mesh_op)
        decision = decide(module, dict(mesh.axes), seeds)
    for plan, planned in zip(plans, actions, strict=True):
        for tile, action in zip(plan, planned, strict=True):  # a dim split too finely before
            try:
                check_size(
                    action,
                    decision.part_type(action.value, action.dim, action.axis),
                    mesh.axes[action.axis],
                )
            except ActionError as err:
                raise tactic_error(plan, tile, err) from None
    # what the builder does not build is rewritten first (padded, regrouped),
    # and decided again; the engine gets the module as it was if it refuses
    original = module.clone() if needs_rewriting(decision) else None
    try:
        if original is not None:
            decision = buildable(module, dict(mesh.axes), seeds, decision)
        build_core(module, decision)  # checks what it builds before changing anything
    except UnsupportedError:
        if original is not None:
            adopt(module, original)
        raise
    entry = entry_function(module)
    for plan in plans:
        for kept in plan.whole:
            return_whole_over(entry, kept.leaf.index, kept.axis)
    result = Partitioned(module, list(plans), decided=list(tactics))
    for plan, planned_seeds in zip(plans, seeds, strict=True):
        take_action_numbers(module, len(plan))
        dims = {(t.leaf.name, t.dim): s.dim for t, s in zip(plan, planned_seeds, strict=True)}
        record_selections(
            module,
            [
                replace(s, dim=dims.get((s.leaf, s.dim), s.dim)) if s.dim is not None else s
                for s in plan.selections()
            ],
        )
    for planned in actions:
        result.actions += planned
    conflicts = list(decision.conflicts)
    if plans and plans[0].removes_annotations:
        conflicts += split_whole_dims(entry_function(module))  # what an annotation keeps whole
    record_conflicts(module, conflicts)
    result.conflicts = conflicts
    return result
