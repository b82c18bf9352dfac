"""Make a decision buildable: rewrite in the module, as the rewrite engine
does while it tiles, what `rewrites.build_core` does not build, then decide
again (`buildable`).

- **padding** (`pad_seeds`): a dim the schedule's first tactic splits over
  a size its axis does not divide is padded for divisibility
  (`rewrites.padding`: its component rebuilt on padded shapes, sums
  masked, sliced back where it must be whole), as the engine pads it before
  any loop exists; deciding again splits only even sizes. A later tactic's
  padding meets its loops in the engine (a smaller component: it moved
  fewer bytes on an uneven vocabulary or hidden size), and stays the
  engine's.
- **regrouping** (`regroup_ops`): an argmax or top_k reading an operand
  split along the dim it picks along becomes the op on each part and once
  more over the parts' picks (`OpRule.regroup`), as the engine's
  `PushForward._regroup`.
- **a copy per result** (`one_result_each`): a split op of several used
  results (a sort, a top_k) gets a copy per used result, as the engine's
  `tiling.tile_results` builds a loop per result; each op the builder
  builds then yields one result.

Each raises `UnsupportedError` where the engine would do otherwise (a
later tactic's padding, a pick along a dim split over two axes, a seed
naming a value a rewrite replaced); `partition` then restores the module
and hands it to the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument, OpResult, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from dialects.errors import UnsupportedError
from dialects.functions import entry_function
from rewrites.factor_propagation import _COMPUTE, _LAST, Decision, Seed, decide
from rewrites.padding import pad_for_divisibility
from rewrites.registry import OpRule


def buildable(
    module: ModuleOp, mesh: dict[str, int], seeds: list[list[Seed]], decision: Decision
) -> Decision:
    """The decision of `seeds` once what `decision` splits that the builder
    does not build is rewritten in `module` (padded, then regrouped and
    copied per result, each followed by deciding again); `decision` itself
    where nothing needs it (`needs_rewriting`)."""
    if decision.padded:
        seeds = pad_seeds(module, decision, seeds)
        decision = decide(module, mesh, seeds)
    for _ in range(_REWRITINGS):
        if not (regroup_ops(decision) or one_result_each(decision)):
            break
        check_seeds(seeds)  # a seed on a regrouped op's result is gone
        decision = decide(module, mesh, seeds)
    return decision


_REWRITINGS = 4
"""Rounds of rewriting: an op regrouped makes ops that pick again over the
parts' picks, which are never regrouped (the engine's `Regroup`), and may
then be copied per result."""


def needs_rewriting(decision: Decision) -> bool:
    """Whether `decision` splits a dim over a padded size, an argmax or
    top_k's operand along the dim it picks along, or an op of several used
    results (what `buildable` rewrites)."""
    if decision.padded:
        return True
    graph = decision.graph
    masks = decision.op_mask
    for o, rule in enumerate(graph.rules):
        if rule is None or (rule.regroup is None and len(rule.results) < 2):
            continue  # most ops: one result, nothing to regroup
        if (  # (where the regroup would give no fewer picks, the copies per result may)
            rule.regroup is not None
            and rule.regroupable
            and any(decision.value_mask[v] for v in graph.operands[o])
            and regroup_candidates(decision, o, rule)
        ):
            return True
        if masks[o] and graph.used_result(o) < 0:
            return True
    return False


def pad_seeds(
    module: ModuleOp, decision: Decision, schedule: Sequence[Sequence[Seed]]
) -> list[list[Seed]]:
    """`schedule` with each seed `decision` split over a padded size (a dim
    its axis does not divide) on its value padded for divisibility in
    `module` (see the module doc). Only the first tactic's seeds; raises
    `UnsupportedError` before changing anything where a later tactic or an
    earlier axis on the same dim pads, and after, where a seed names a
    value the padding rebuilt."""
    graph = decision.graph
    padded = [
        [
            (v := graph.ids[s.value], s.dim) in decision.padded
            and graph.shapes[v][s.dim] % decision.mesh[s.axis] != 0
            for s in seeds
        ]
        for seeds in schedule
    ]
    for k, (seeds, pads) in enumerate(zip(schedule, padded, strict=True)):
        for seed, pad in zip(seeds, pads, strict=True):
            if pad and (k or decision.nesting_of(graph.ids[seed.value])[seed.dim][0] != seed.axis):
                raise UnsupportedError(
                    f"build_core: {seed.label or 'a value'} is padded on dim {seed.dim} after "
                    "an earlier tactic's splits; use the rewrite engine"
                )
    scope = entry_function(module)
    values: dict[tuple[int, int], SSAValue] = {}
    for k, (seeds, pads) in enumerate(zip(schedule, padded, strict=True)):
        for j, (seed, pad) in enumerate(zip(seeds, pads, strict=True)):
            if pad:
                _check_alive(seed)
                parts = decision.mesh[seed.axis]
                values[k, j] = pad_for_divisibility(seed.value, seed.dim, parts, scope).value
    out = [
        [replace(s, value=values.get((k, j), s.value)) for j, s in enumerate(seeds)]
        for k, seeds in enumerate(schedule)
    ]
    check_seeds(out)  # a later padding may have rebuilt an earlier one's pad too
    return out


def check_seeds(schedule: Sequence[Sequence[Seed]]) -> None:
    """Raise `UnsupportedError` where a seed names a value a rewrite of the
    module (`pad_seeds`, `regroup_ops`) replaced."""
    for seeds in schedule:
        for seed in seeds:
            _check_alive(seed)


def regroup_ops(decision: Decision) -> bool:
    """Regroup, in the module, each op `decision` keeps whole that reads an
    operand split along a factor it can regroup (`OpRule.regroupable`: an
    argmax or top_k along a split dim), as the engine's
    `PushForward._regroup` does when that split reaches it: the op on each
    part, then once more over the parts' picks. Whether any op was (decide
    again then: the new ops split as any others). Raises `UnsupportedError`
    where two axes split the regrouped dim (the engine regroups that part
    inside the first's loop)."""
    g = decision.graph
    changed = False
    for o, rule in enumerate(g.rules):
        if rule is None or rule.regroup is None or not rule.regroupable:
            continue
        for factor, parts in regroup_candidates(decision, o, rule):
            regrouped = rule.regroup(g.ops[o], factor, parts)
            if regrouped is not None:
                new_ops, results = regrouped
                Rewriter.replace_op(g.ops[o], new_ops, results)
                changed = True
                break
    return changed


def one_result_each(decision: Decision) -> bool:
    """Give each op `decision` splits that has several results with uses (a
    sort, a top_k, an argmax's reduce read for both) a copy per such
    result, right after it, which that result's uses read: as the engine's
    `tiling.tile_results` builds one loop per result, each with the op on
    the parts, so that each op the builder builds yields one result. Whether
    any op was copied (decide again then)."""
    g = decision.graph
    changed = False
    for o, op in enumerate(g.ops):
        results = g.results[o]
        if len(results) < 2 or not decision.op_mask[o] or g.kinds[o] != _COMPUTE:
            continue
        used = [k for k, v in enumerate(results) if g.uses[v]]
        for k in used[1:]:
            copy = op.clone()
            Rewriter.insert_op(copy, InsertPoint.after(op))
            op.results[k].replace_all_uses_with(copy.results[k])
            changed = True
    return changed


def would_regroup(decision: Decision, o: int, rule: OpRule) -> bool:
    """Whether `regroup_ops` regroups op `o` (`rule` its rule): an operand
    arrives split along a factor it regroups (`OpRule.regroupable`), where
    the parts' picks are fewer than the whole (not the op over the picks of
    a regrouped op: the engine reads its operand whole then)."""
    if rule.regroup is None or not rule.regroupable:
        return False
    if not any(decision.value_mask[v] for v in decision.graph.operands[o]):
        return False
    op = decision.graph.ops[o]
    for factor, parts in regroup_candidates(decision, o, rule):
        regrouped = rule.regroup(op, factor, parts)
        if regrouped is not None:
            # made only to ask: they would stay uses of the op's operands
            for made in reversed(regrouped[0]):
                made.erase(safe_erase=False)
            return True
    return False


def regroup_candidates(decision: Decision, o: int, rule: OpRule) -> list[tuple[int, int]]:
    """(factor, parts) of each regroupable factor op `o`'s operands arrive
    split along, in the order the engine tries them (by the split's
    priority, then operand)."""
    g, width = decision.graph, len(decision.axes)
    found: list[tuple[int, int, int, int]] = []
    for i, v in enumerate(g.operands[o]):
        nesting = decision.nesting_of(v)
        for a in decision.value_axes[v]:
            dim = decision.value_dim[v * width + a]
            fs = rule.operands[i][dim] if dim < len(rule.operands[i]) else ()
            if not fs or fs[0] not in rule.regroupable:
                continue
            if len(nesting[dim]) > 1:
                raise UnsupportedError(
                    f"build_core: {g.ops[o].name} picks along a dim split over two axes; "
                    "use the rewrite engine"
                )
            priority = decision.value_priority[v * width + a]
            order = priority[0] if priority is not None else _LAST
            found.append((order, i, fs[0], decision.sizes[a]))
    return [(f, parts) for _, _, f, parts in sorted(found)]


def _check_alive(seed: Seed) -> None:
    if _rebuilt(seed.value):
        raise UnsupportedError(
            f"build_core: {seed.label or 'a seed'} names a value the module's rewriting replaced; "
            "use the rewrite engine"
        )


def _rebuilt(value: SSAValue) -> bool:
    """Whether `value` is gone from the program (its op erased, or its block
    argument replaced by one of a padded type)."""
    if isinstance(value, OpResult):
        return value.op.parent is None
    assert isinstance(value, BlockArgument)
    block = value.block
    return value.index >= len(block.args) or block.args[value.index] is not value
