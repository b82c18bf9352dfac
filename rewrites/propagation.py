"""Propagation: move tile loops through the program until nothing moves.

The rewrites of the PartIR talk, as xDSL patterns run to a fixpoint:

- **forward** (`PushForward`): an op with an operand tiled over axis `a` moves
  into a loop over `a`; its other operands are sliced to match (the
  *sideways* step, `tiling.slice_operands`). Tiling a reduction factor gives a
  `sum` loop. When the tiled operand is a loop used only by this op, the op
  joins that loop instead of starting a new one (a fused chain stays one loop
  and costs O(1) per op).
- **fusion** (`FuseSliceOfTile`): `slice d (loop a [tile d] (\\r -> e))[s]`
  becomes `e{s/r}`, when the loop has no other use or its body is only slices.
- **backward** (`PullSliceIntoProducer`): a value used only through slices
  moves each slice to its operands (the op is recomputed per part, which is
  never more work than computing it whole).
- `PushSliceIntoLoop`: a slice over one axis of a loop over another axis moves
  inside that loop, so a later tactic's loops see through earlier ones.

The earlier action wins a conflict, unless a later one costs fewer bytes by
exchanging rather than gathering (`rewrites.conflicts.cheaper_exchange`);
the loser is recorded in the `ConflictLog` and left for the lowering to
redistribute. The patterns read the
registry only through `rule_for`; nothing here knows about particular ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Attribute, Block, Operation, OpResult, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriterListener,
    PatternRewriteWalker,
    RewritePattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.traits import IsTerminator, SymbolOpInterface

from dialects.heap import paused_gc
from dialects.op_kinds import per_op_kind
from dialects.partir import (
    ORIGIN,
    HaloSliceOp,
    LoopOp,
    MeshOp,
    SliceOp,
    TileAttr,
    YieldOp,
    find_mesh,
    part_type,
)
from rewrites.actions import describe_value
from rewrites.conflicts import (
    Conflict,
    ConflictLog,
    cheaper_exchange,
    describe_origin,
    record_conflicts,
)
from rewrites.control_flow import CARRYING_OPS, TileCarriedValues
from rewrites.projection import (
    Tiling,
    dim_factor,
    enclosing_axes,
    follow,
    nested_loops,
    nests_loop_over,
    range_axis,
    range_size,
    tilings,
)
from rewrites.registry import OpRule, rule_for
from rewrites.tiling import loop_action, part_op, slice_operands, tile_results

STRUCTURAL = (
    LoopOp, SliceOp, HaloSliceOp, YieldOp, MeshOp, func.ReturnOp, func.FuncOp, ModuleOp
)
_STRUCTURAL_TYPES = frozenset(STRUCTURAL)  # exact-type checks: ABC isinstance is slow here


@dataclass(frozen=True)
class _Candidate:
    tiling: Tiling
    operand: int
    factor: int


class RuleCache:
    """`rule_for` memoised per op for one propagation run (an op's types and
    attributes do not change while it exists; rewrites make new ops)."""

    def __init__(self) -> None:
        self._rules: dict[Operation, OpRule | None] = {}

    def __call__(self, op: Operation) -> OpRule | None:
        if op in self._rules:
            return self._rules[op]
        rule = self._rules[op] = rule_for(op)
        return rule


def _operand_tilings(op: Operation) -> list[tuple[int, Tiling]]:
    """(operand index, tiling) pairs over axes `op` is not already looping over."""
    found = [
        (i, t)
        for i, v in enumerate(op.operands)
        if type(v.owner) in _TILED_PRODUCERS
        for t in tilings(v)
    ]
    if not found:
        return found  # most visits: operands sliced from untiled values
    busy = enclosing_axes(op)
    return [(i, t) for i, t in found if t.axis not in busy]


_TILED_PRODUCERS = (LoopOp, SliceOp, HaloSliceOp)


def _candidates(
    rule: OpRule, operand_tilings: list[tuple[int, Tiling]], mesh: dict[str, int]
) -> list[_Candidate]:
    """Operand tilings this op could follow, earliest action first."""
    found = []
    for i, tiling in operand_tilings:
        factor = follow(rule, i, tiling.dim, mesh[tiling.axis])
        if isinstance(factor, int):
            found.append(_Candidate(tiling, i, factor))
    found.sort(key=lambda c: (c.tiling.order, c.operand))
    return found


def wake_users(rewriter: PatternRewriter, values: list[SSAValue]) -> None:
    """Re-queue the users that read how a value is used, after a rewrite changed it.

    Fusion, backward propagation and dedupe look at a slice's source's uses,
    and joining a loop needs its sole user; no other pattern reads uses. So
    only a value's slices and its sole user are woken: waking every user made
    a value used everywhere (Adam's bias-correction scalars, by every update)
    cost O(N) per rewrite of one of them. A rank-0 value has no slices.
    """
    for value in values:
        sole = _sole_user(value)
        if sole is not None:
            rewriter.notify_op_modified(sole)
        ty = value.type
        if isinstance(ty, TensorType) and not ty.get_shape():
            continue
        for use in value.uses:
            if type(use.operation) is SliceOp:
                rewriter.notify_op_modified(use.operation)


def wake_body(rewriter: PatternRewriter, ops: list[Operation]) -> None:
    """Queue ops placed inside a new loop: xDSL queues an inserted op, not
    the ops nested in it."""
    for op in ops:
        rewriter.notify_op_modified(op)


def _sole_user(value: SSAValue) -> Operation | None:
    """The one op using `value` (maybe more than once), or None; stops at a
    second user rather than reading every use."""
    use = value.first_use
    if use is None:
        return None
    user = use.operation
    for use in value.uses:
        if use.operation is not user:
            return None
    return user


@dataclass
class PushForward(RewritePattern):
    """`op(.., x tiled on a, ..)` -> `loop a [tile | sum] (\\r -> op(parts))`."""

    mesh: dict[str, int]
    log: ConflictLog
    rules: RuleCache

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if type(op) in _STRUCTURAL_TYPES or not op.results:
            return
        tilings = _operand_tilings(op)
        if not tilings:
            return
        rule = self.rules(op)
        if rule is None:
            return
        candidates = _candidates(rule, tilings, self.mesh)
        if not candidates:
            self._regroup(op, rule, tilings, rewriter)
            return
        chosen, others, why = self._choose(op, rule, candidates)
        self._record_conflicts(op, chosen, others, why)
        loop = chosen.tiling.loop
        operands = list(op.operands)
        if self._can_join(op, rule, chosen, loop):
            self._join_loop(op, rule, chosen, loop, rewriter)
        else:
            attrs: dict[str, Attribute] = (
                {ORIGIN: chosen.tiling.origin} if chosen.tiling.origin else {}
            )
            loops = tile_results(
                op, rule, chosen.factor, chosen.tiling.axis, self.mesh[chosen.tiling.axis], attrs
            )
            rewriter.replace(op, loops, [loop.result for loop in loops])
            for new in loops:
                wake_body(rewriter, list(new.body.block.ops))
        wake_users(rewriter, operands)

    def _regroup(
        self,
        op: Operation,
        rule: OpRule,
        tilings: list[tuple[int, Tiling]],
        rewriter: PatternRewriter,
    ) -> None:
        """An operand split along a factor the op can regroup (`OpRule.regroupable`:
        an argmax along a split dim): the op becomes the op on each part and
        the op again over the parts' picks, which then propagate as any ops
        (where the parts' picks are fewer than the whole: not the final op)."""
        if rule.regroup is None:
            return
        for i, tiling in sorted(tilings, key=lambda it: (it[1].order, it[0])):
            factor = dim_factor(rule, i, tiling.dim)
            parts = self.mesh[tiling.axis]
            if factor not in rule.regroupable:
                continue
            regrouped = rule.regroup(op, factor, parts)
            if regrouped is not None:
                new_ops, results = regrouped
                rewriter.replace(op, new_ops, list(results))
                return

    @staticmethod
    def _can_join(op: Operation, rule: OpRule, chosen: _Candidate, loop: LoopOp) -> bool:
        """`op` (of one result) is the loop's only user, and uses it only
        where its part fits."""
        if len(op.results) != 1:
            return False
        if loop.result is not op.operands[chosen.operand] or _sole_user(loop.result) is not op:
            return False
        if any(rule.factors[chosen.factor].halo) and op.operands[0] is loop.result:
            return False  # its part with a halo reads the neighbours' elements too
        dims = rule.operand_dims(chosen.factor)
        return all(
            dims[i] == chosen.tiling.dim for i, v in enumerate(op.operands) if v is loop.result
        )

    def _join_loop(
        self,
        op: Operation,
        rule: OpRule,
        chosen: _Candidate,
        loop: LoopOp,
        rewriter: PatternRewriter,
    ) -> None:
        """Move `op` into the loop producing its tiled operand (its only user).

        The loop is kept (moved to `op`'s place, where all of `op`'s operands
        are defined) and only its body, action and result type change:
        building a new loop per joined op made a fused chain cost a loop each."""
        block = loop.body.block
        old_yield = block.last_op
        assert isinstance(old_yield, YieldOp)
        part = old_yield.values[0]
        new_ops, operands = slice_operands(
            rule,
            chosen.factor,
            list(op.operands),
            block.args[0],
            {(loop.result, chosen.tiling.dim): part},
        )
        body_op = part_op(op, rule, chosen.factor, self.mesh[chosen.tiling.axis], operands)
        rewriter.insert(
            [*new_ops, body_op, YieldOp(body_op.results[0])], InsertPoint.before(old_yield)
        )
        rewriter.erase(old_yield)
        loop.detach()
        rewriter.insert(loop, InsertPoint.before(op))
        loop.properties["action"] = loop_action(rule, chosen.factor)
        result = rewriter.replace_value_with_new_type(loop.result, op.results[0].type)
        result.name_hint = None  # it is `op`'s value now, no longer what the loop made
        rewriter.replace_all_uses_with(op.results[0], result)
        rewriter.erase(op)

    def _choose(
        self, op: Operation, rule: OpRule, candidates: list[_Candidate]
    ) -> tuple[_Candidate, list[_Candidate], str]:
        """The candidate to follow (the earliest action's, unless a later one
        costs fewer bytes to reconcile: `cheaper_exchange`), the others, and
        the bytes that decided it, where they did."""
        first = candidates[0]
        rivals = [c for c in candidates if c.tiling.axis == first.tiling.axis]
        if len({c.factor for c in rivals}) < 2:
            return first, candidates[1:], ""
        parts = self.mesh[first.tiling.axis]
        tiled = [(c.operand, c.factor) for c in rivals]
        k, why = cheaper_exchange(rule, op, tiled, parts)
        chosen = rivals[k]
        return chosen, [c for c in candidates if c is not chosen], why

    def _record_conflicts(
        self, op: Operation, chosen: _Candidate, others: list[_Candidate], why: str = ""
    ) -> None:
        for other in others:
            if other.tiling.axis != chosen.tiling.axis or other.factor == chosen.factor:
                continue
            self.log.record(
                Conflict(
                    op=op.name,
                    values=(
                        self.log.value_of(
                            chosen.tiling.origin, describe_value(op.operands[chosen.operand])
                        ),
                        self.log.value_of(
                            other.tiling.origin, describe_value(op.operands[other.operand])
                        ),
                    ),
                    axis=chosen.tiling.axis,
                    winner=describe_origin(chosen.tiling.origin),
                    loser=describe_origin(other.tiling.origin),
                    detail=(
                        f"operand {chosen.operand} is tiled on dim {chosen.tiling.dim}, "
                        f"operand {other.operand} on dim {other.tiling.dim}; "
                        + (why or "the loser is redistributed")
                    ),
                )
            )


class DedupeSlice(RewritePattern):
    """`slice d v[s]` twice in one block is one value, so a loop sliced twice
    the same way is single-use and fuses. The kept slice moves to the start of
    the block (its source and range are defined outside it, so that is always
    valid), which avoids finding which of the two comes first."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, SliceOp):
            return
        src, index = op.operands  # IRDL's accessors are slow on this hot path
        if not src.has_more_than_one_use():
            return
        block = op.parent_block()
        source = src.owner
        defined_here = source is block or (
            isinstance(source, Operation) and source.parent_block() is block
        )
        if block is None or defined_here:
            return
        dim = op.dim_index
        for use in src.uses:
            other = use.operation
            if (
                other is not op
                and type(other) is SliceOp
                and other.parent_block() is block
                and other.operands[1] is index
                and other.dim_index == dim
            ):
                first = block.first_op
                if other is not first:
                    assert first is not None  # `other` is in the block
                    other.detach()
                    block.insert_op_before(other, first)
                rewriter.replace(op, [], [other.results[0]])
                wake_users(rewriter, [other.results[0], op.src])
                return


def _only_slices(loop: LoopOp) -> bool:
    for op in loop.body.block.ops:
        if type(op) is not SliceOp and type(op) is not YieldOp:
            return False
    return True


class FuseSliceOfTile(RewritePattern):
    """`slice d (loop a [tile d] (\\r -> e))[s]` -> `e{s/r}`.

    Not when `e` holds a loop over an axis the slice is already inside (the
    axis would be nested twice)."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, SliceOp):
            return
        loop = op.operands[0].owner
        if type(loop) is not LoopOp:
            return
        action = loop.properties["action"]
        if type(action) is not TileAttr or action.dim.data != op.dim_index:
            return
        if loop.axis_name != range_axis(op.operands[1]):
            return
        if loop.result.uses.get_length() == 1:
            if nests_loop_over(loop, enclosing_axes(op)):
                return
            block = loop.body.block
            yielded = loop.yielded
            moved = list(block.ops)
            rewriter.inline_block(block, InsertPoint.before(op), [op.index])
            wake_body(rewriter, moved[:-1])
            terminator = op.prev_op
            assert isinstance(terminator, YieldOp)
            rewriter.erase(terminator)
            rewriter.replace(op, [], [yielded])
            rewriter.erase(loop)
        elif _only_slices(loop):
            mapping: dict[SSAValue, SSAValue] = {loop.range_arg: op.index}
            clones = [
                o.clone(value_mapper=mapping)
                for o in loop.body.block.ops
                if not isinstance(o, YieldOp)
            ]
            rewriter.insert(clones, InsertPoint.before(op))
            rewriter.replace(op, [], [mapping[loop.yielded]])


@dataclass
class PullSliceIntoProducer(RewritePattern):
    """`slice d (op(xs))[s]` -> `op(parts of xs)` when the op is only sliced."""

    rules: RuleCache

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, SliceOp):
            return
        src = op.operands[0]
        producer = src.owner
        if not isinstance(producer, Operation) or isinstance(producer, STRUCTURAL):
            return
        # Of an op with several results, every result is only sliced: each
        # slice then makes its own part (one part op per slice, as one loop
        # per result), and the whole op dies.
        if not all(
            isinstance(use.operation, SliceOp) for r in producer.results for use in r.uses
        ):
            return
        rule = self.rules(producer)
        if rule is None:
            return
        assert isinstance(src, OpResult)
        k = src.index  # of an op with several results, only this one is sliced
        factor = rule.result_factor(k, op.dim_index)
        parts = range_size(op.index)
        if factor is None or rule.why_not_tileable(factor, parts) is not None:
            return
        slices, operands = slice_operands(rule, factor, list(producer.operands), op.index)
        part = part_op(producer, rule, factor, parts, operands)
        last_use = sum(r.uses.get_length() for r in producer.results) == 1
        rewriter.replace(op, [*slices, part], [part.results[k]])
        if last_use:  # the producer is dead now; its operands lose a use
            wake_users(rewriter, list(producer.operands))


def _nests_unfusable(loop: LoopOp, op: SliceOp, around: set[str]) -> bool:
    """Whether moving `loop` inside `op`'s loops would nest an axis twice for
    good: a loop over one of `around` in its body, other than the yielded tile
    loop the moved slice `op` fuses with (`FuseSliceOfTile`)."""
    fuses = loop.yielded.owner
    for inner in nested_loops(loop, around):
        if not (
            inner is fuses
            and isinstance(inner.action, TileAttr)
            and inner.action.dim.data == op.dim_index
            and inner.axis_name == range_axis(op.index)
            and inner.result.uses.get_length() == 1
        ):
            return True
    return False


class PushSliceIntoLoop(RewritePattern):
    """`slice d (loop b (\\q -> e))[s]` -> `loop b (\\q -> slice d e[s])` for b != s's axis.

    The loop moves to the slice (its only user) and computes only that part;
    not when its body holds a loop over an axis the slice is inside (the axis
    would be nested twice), unless that loop is the one yielded and the moved
    slice fuses with it. A loop that is only slices (an identity tiling, such
    as a loop-carried value tiled after its uses were sliced over another
    axis) moves as a copy per user, so every use slices the value itself.
    """

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, SliceOp):
            return
        loop = op.operands[0].owner
        if type(loop) is not LoopOp:
            return
        axis = range_axis(op.operands[1])
        if loop.axis_name == axis:
            return
        if isinstance(loop.action, TileAttr) and loop.action.dim.data == op.dim_index:
            return
        shared = loop.result.uses.get_length() != 1
        if shared and not _only_slices(loop):
            return
        around = enclosing_axes(op)
        if loop.axis_name in around or _nests_unfusable(loop, op, around):
            return
        if shared:  # this use gets its own copy, which moves in below
            loop = loop.clone()
            rewriter.insert(loop, InsertPoint.before(op))
            rewriter.replace_uses_with_if(op.src, loop.result, lambda use: use.operation is op)
        region = rewriter.move_region_contents_to_new_regions(loop.body)
        block = region.block
        old_yield = block.last_op
        assert isinstance(old_yield, YieldOp)
        inner = SliceOp(old_yield.values[0], op.dim_index, op.index)
        rewriter.insert([inner, YieldOp(inner.result)], InsertPoint.before(old_yield))
        rewriter.erase(old_yield)
        parts = range_size(op.index)
        new = LoopOp(
            loop.axis,
            loop.action,
            region,
            part_type(loop.result.type, op.dim_index, parts),
            dict(loop.attributes),
        )
        rewriter.replace(op, new)
        rewriter.erase(loop)
        wake_body(rewriter, list(new.body.block.ops))


@dataclass
class Propagation(RewritePattern):
    """All propagation rewrites behind one type check per visited op."""

    mesh: MeshOp
    log: ConflictLog
    rules: RuleCache = field(default_factory=RuleCache)

    def __post_init__(self) -> None:
        self.slice_patterns = (
            DedupeSlice(),
            FuseSliceOfTile(),
            PullSliceIntoProducer(self.rules),
            PushSliceIntoLoop(),
        )
        self.forward = PushForward(self.mesh.axes, self.log, self.rules)
        self.carried = TileCarriedValues(self.mesh, self.log)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        kind = type(op)
        if kind is SliceOp:
            for pattern in self.slice_patterns:
                pattern.match_and_rewrite(op, rewriter)
                if rewriter.has_done_action:
                    return
            source = op.operands[0].owner
            if isinstance(source, Operation) and type(source) in CARRYING_OPS:
                self.carried.match_and_rewrite(source, rewriter)  # a loop's result, sliced
        elif kind in CARRYING_OPS:
            self.carried.match_and_rewrite(op, rewriter)
        elif kind not in _STRUCTURAL_TYPES:
            self.forward.match_and_rewrite(op, rewriter)


def propagate(module: ModuleOp, log: ConflictLog | None = None) -> list[Conflict]:
    """Run forward, backward and fusion rewrites to a fixpoint over `module`.

    The conflicts found (and any already in `log`) are recorded on the module
    (`rewrites.conflicts.record_conflicts`), whichever pass runs propagation;
    returns them."""
    log = log if log is not None else ConflictLog()
    mesh = find_mesh(module)
    if mesh is not None:
        applier = GreedyRewritePatternApplier([Propagation(mesh, log)])
        with paused_gc():
            _Walker(applier).rewrite_module(module)
    record_conflicts(module, log.conflicts)
    return list(log.conflicts)


def _idle(op: Operation) -> bool:
    """Whether visiting `op` would do nothing: it is not dead (a result is used,
    or it is a terminator) and no propagation pattern can match it (exactly
    `Propagation`'s and `PushForward`'s early exits). Most visits end here."""
    kind = type(op)
    if kind is SliceOp:
        # The slice patterns need a second slice of the source (dedupe) or a
        # source made by a loop (fusion, moving in) or by a rule's op (backward).
        src = op.operands[0]
        source = type(src.owner)
        return (
            op.results[0].first_use is not None
            and src.has_one_use()
            and (source is Block or (source in _STRUCTURAL_TYPES and source is not LoopOp))
        )
    if kind in CARRYING_OPS:  # a while, or a region's return: carry a tiled value?
        return not _reads_tiled(op)
    results = op.results
    if not results:
        return _never_dead(op)
    for result in results:
        if result.first_use is not None:
            break
    else:
        return False  # dead code: the applier erases it
    if kind in _STRUCTURAL_TYPES:
        return True
    return not _reads_tiled(op)


def _reads_tiled(op: Operation) -> bool:
    """Whether an operand of `op` is tiled (plain loops: most visits ask this)."""
    for value in op.operands:
        if type(value.owner) in _TILED_PRODUCERS and tilings(value):
            return True
    return False


@per_op_kind
def _never_dead(op: Operation) -> bool:
    """Terminators and symbols are never trivially dead (a per-type trait)."""
    return op.has_trait(IsTerminator, value_if_unregistered=False) or op.has_trait(
        SymbolOpInterface, value_if_unregistered=False
    )


class _Walker(PatternRewriteWalker):
    """xDSL's walker with the same worklist, listener and visit order, except
    that visits `_idle` says would do nothing are skipped before the rewriter
    is reset for them (which costs more than the check), and that erasing an
    op with regions also queues the outer values' producers its body was the
    last user of (xDSL queues only its own operands': a constant read only
    in a dead loop's body stayed until the next round, which then cost a
    whole extra round to confirm)."""

    def _handle_operation_removal(self, op: Operation) -> None:
        if op.regions and self.apply_recursively:
            for producer in _producers_last_read_inside(op):
                self._worklist.push(producer)
        super()._handle_operation_removal(op)

    def _process_worklist(self, listener: PatternRewriterListener) -> bool:
        worklist = self._worklist
        done = False
        rewriter: PatternRewriter | None = None
        pattern = self.pattern
        while worklist:
            op = worklist.pop()
            if _idle(op):
                continue
            if rewriter is None:
                rewriter = PatternRewriter(op)
                rewriter.extend_from_listener(listener)
            rewriter.has_done_action = False
            rewriter.current_operation = op
            rewriter.insertion_point = InsertPoint.before(op)
            rewriter.name_hint = None
            try:
                pattern.match_and_rewrite(op, rewriter)
            except Exception as err:
                op.emit_error(f"Error while applying pattern: {err}", underlying_error=err)
            done |= rewriter.has_done_action
        return done


def _producers_last_read_inside(op: Operation) -> list[Operation]:
    """The ops outside `op` whose result has its every use in `op`'s regions
    (a block argument has no producer to queue)."""
    inside = [inner for region in op.regions for inner in region.walk()]
    nested = set(inside)
    reads: dict[SSAValue, tuple[Operation, int]] = {}
    for inner in inside:
        for value in inner.operands:
            owner = value.owner
            if isinstance(owner, Operation) and owner not in nested:
                reads[value] = (owner, reads[value][1] + 1 if value in reads else 1)
    return [owner for value, (owner, n) in reads.items() if value.uses.get_length() == n]


@dataclass(frozen=True)
class PropagatePass(ModulePass):
    """Propagate tile loops forward, backward and sideways, fusing slices."""

    name = "partir-propagate"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        propagate(op)
