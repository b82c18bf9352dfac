"""The passes the schedule driver runs, one per tactic (`partir.partition`):
a tactic's plan, tiled then propagated (`ApplyPlanPass`), or `Automatic`'s
search, then the schedule it chose (`AutomaticPass`). Neither is a CLI pass;
the tactic passes of `partir.passes` run them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from dialects.functions import entry_function
from partir.mesh import Mesh
from partir.plan import Leaf, Plan, ProgramView
from partir.search import search
from partir.tactics import Automatic, Tactic
from partir.tiling import apply_plan, module_mesh
from rewrites.actions import TileAction


@dataclass(frozen=True)
class ApplyPlanPass(ModulePass):
    """Apply one tactic's plan and propagate (what `partir.partition` runs per
    tactic, with the plans it made and checked up front; not a CLI pass)."""

    name = "partir-apply-plan"
    plan: Plan | None = None
    tactic: Tactic | None = None
    """The tactic that made `plan`, planned again on the module as the
    tactics before left it where they split a leaf the plan names (the plan
    made up front saw whole shapes; ZeRO picks its dim per device)."""
    actions: list[TileAction] = field(default_factory=list, init=False, compare=False)
    """The actions taken, filled in by `apply`."""
    applied: list[Plan] = field(default_factory=list, init=False, compare=False)
    """The plan applied (`plan`, or the one made again), filled in by `apply`."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        assert self.plan is not None
        plan = self.plan
        if self.tactic is not None:
            view = ProgramView.of(entry_function(op))
            named = [t.leaf for t in plan] + [p.leaf for p in plan.passed]
            named += [w.leaf for w in plan.whole]
            if any(isinstance(leaf, Leaf) and leaf.name in view.splits for leaf in named):
                mesh = Mesh(module_mesh(op, plan.tactic).axes)
                plan = self.tactic.plan(view, mesh)
        self.applied[:] = [plan]
        self.actions[:] = apply_plan(op, plan)


@dataclass(frozen=True)
class AutomaticPass(ModulePass):
    """Run `Automatic`'s search on the module as the tactics before it left
    it, then apply the schedule it chose (or, for a decided `Automatic`, the
    schedule it chose before: no search). Not a CLI pass: `partir-auto` is."""

    name = "partir-apply-automatic"
    tactic: Automatic | None = None
    actions: list[TileAction] = field(default_factory=list, init=False, compare=False)
    results: list[Any] = field(default_factory=list, init=False, compare=False)
    """The `partir.search.SearchResult`, once `apply` has searched."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        assert self.tactic is not None
        mesh = Mesh(module_mesh(op, self.tactic.name).axes)
        chosen = self.tactic.chosen
        self.actions.clear()
        if chosen is None:
            searched = search(op, mesh, self.tactic)
            self.results[:] = [searched.result]
            if searched.module is not None:  # the pick's IR, as applying it would make it
                adopt(op, searched.module)
                self.actions.extend(searched.actions)
                return
            chosen = searched.result.chosen.schedule
        for tactic in chosen:  # each planned on what the ones before left, as pasted
            view = ProgramView.of(entry_function(op))
            self.actions.extend(apply_plan(op, tactic.plan(view, mesh)))


def adopt(module: ModuleOp, other: ModuleOp) -> None:
    """Make `module` hold `other`'s body and attributes (`other` is a copy of
    `module` some passes have since rewritten; it is left empty)."""
    module.body.detach_block(0).erase()
    module.body.add_block(other.body.detach_block(0))
    module.attributes.clear()
    module.attributes.update(other.attributes)
