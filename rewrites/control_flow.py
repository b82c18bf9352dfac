"""Tiling through `stablehlo.while`, `case` / `if` and `optimization_barrier`:
a carried value keeps one tiling.

A loop-carried value (a scan's activations, its stacked parameters, the
buffers it writes per layer) has one distribution on entry, in the body and
on exit; a value passed through an optimization barrier (`jax.checkpoint`'s
rematerialisation fence) has the one it came with; a conditional's result
(`lax.cond`, `lax.switch`) has one whichever branch returns it (branches read
the values around them, so propagation tiles their ops like any other). Tiling it is the identity
action `v ~> loop a [tile d] (r -> slice d v[r])` (`rewrites.actions`)
applied to every place the value appears: the body's and the condition's
argument, the op's result, and its operand. The body is then ordinary code
for propagation, and the SPMD lowering gives the carried value the
distribution its body argument is sliced by (a barrier's result: its
operand's; a conditional's result: what its users slice it by).

The tiling comes from either end, until none adds one (a fixpoint; tilings
are only ever added, once per value and axis, so it ends):

- **entry**: an operand produced tiled (by a tile loop);
- **exit of an iteration** (or of a branch): the value the body returns for
  it, once propagation has tiled it (a scan's per-layer output buffer, tiled
  like the rows written into it);
- **exit of the op**: its result, when every user slices it the same way
  (ZeRO's update slicing the gradients a backward scan accumulates).

A tiling that disagrees with the one the value already has over the same
axis is a conflict, recorded by the action (`apply_tile_action`); the
lowering then redistributes at the loop's boundary, so the numbers stay
right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern
from xdsl.rewriter import InsertPoint
from xdsl_jax.dialects import stablehlo as shlo

from dialects.carried import BRANCHING_OPS, carried_places, enclosing_carrier
from dialects.partir import LoopOp, MeshOp, OriginAttr, SliceOp
from dialects.stablehlo_ext import WhileOp
from rewrites.actions import (
    TileAction,
    apply_tile_action,
    existing_tiling,
    identity_tile_loop,
    tile_whole_uses,
)
from rewrites.conflicts import Conflict, ConflictLog, describe_origin
from rewrites.projection import Tiling, range_axis, tilings

CARRYING_OPS = frozenset(
    {WhileOp, shlo.WhileOp, shlo.ReturnOp, shlo.OptimizationBarrierOp, *BRANCHING_OPS}
)
"""The op types `TileCarriedValues` looks at (a while, a region's return, a
barrier, a conditional)."""


@dataclass
class TileCarriedValues(RewritePattern):
    """Give each value a while carries (or a barrier passes through) the
    tilings its operand, its body's returned value or its result's users
    have, in its body and condition arguments, result and operand."""

    mesh: MeshOp
    log: ConflictLog
    carried: dict[tuple[Operation, int, str], int] = field(default_factory=dict)
    """(op, carried value, axis) -> the dim it is tiled on."""
    _conflicts: set[tuple[Operation, int, str, int]] = field(default_factory=set)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if isinstance(op, shlo.OptimizationBarrierOp):
            for k, operand in enumerate(op.operands):
                for tiling in (*tilings(operand), *_sliced(op.results[k])):
                    self._carry(op, k, tiling, rewriter)
            return
        carrier = op if isinstance(op, (shlo.WhileOp, *BRANCHING_OPS)) else enclosing_carrier(op)
        if isinstance(carrier, shlo.WhileOp):
            returned = carrier.body.block.last_op
            assert returned is not None
            for k, operand in enumerate(carrier.operands):
                ends: tuple[SSAValue, ...] = (operand, returned.operands[k])
                for tiling in (*_tilings_of(ends), *_sliced(carrier.results[k])):
                    self._carry(carrier, k, tiling, rewriter)
        elif carrier is not None:  # a conditional: its branches' returns, its users
            returns = [region.block.last_op for region in carrier.regions]
            for k, result in enumerate(carrier.results):
                ends = tuple(r.operands[k] for r in returns if r is not None)
                for tiling in (*_tilings_of(ends), *_sliced(result)):
                    self._carry(carrier, k, tiling, rewriter)

    def _carry(self, carrier: Operation, k: int, tiling: Tiling, rewriter: PatternRewriter) -> None:
        """Tile carried value k on `tiling`'s dim over its axis, once per axis
        (the wrappers nest, so the places themselves do not show it)."""
        key = (carrier, k, tiling.axis)
        done = self.carried.get(key)
        if done is not None:
            if done != tiling.dim and (*key, tiling.dim) not in self._conflicts:
                self._conflicts.add((*key, tiling.dim))
                self.log.record(
                    Conflict(
                        op=carrier.name,
                        values=(f"carried value {k}",),
                        axis=tiling.axis,
                        winner=f"its tiling on dim {done}",
                        loser=describe_origin(tiling.origin),
                        detail=f"tiled on dim {tiling.dim} at the other end of "
                        + (
                            "an iteration; the loop's boundary redistributes it"
                            if isinstance(carrier, shlo.WhileOp)
                            else "a branch; its result is redistributed"
                            if isinstance(carrier, BRANCHING_OPS)
                            else "the barrier; its result is redistributed"
                        ),
                    )
                )
            return
        self.carried[key] = tiling.dim
        for value in carried_places(carrier, k):
            # An unused place needs no tiling (and a dead op would be erased
            # and made again, for ever).
            if not value.uses:
                continue
            current = existing_tiling(value, tiling.axis)
            if current is None:
                self._tile(value, tiling, rewriter)
            elif current == tiling.dim:  # sliced by some users: the others too
                self._tile_whole_uses(value, tiling, rewriter)
        if isinstance(carrier, BRANCHING_OPS):
            return  # the branches' returns are converted by the lowering
        if not any(t.axis == tiling.axis for t in tilings(carrier.operands[k])):
            self._tile_operand(carrier, k, tiling, rewriter)

    def _tile(self, value: SSAValue, tiling: Tiling, rewriter: PatternRewriter) -> None:
        origin = tiling.origin or OriginAttr(0, "propagation", "a loop-carried value")
        action = TileAction(value, tiling.dim, tiling.axis, origin)
        made = apply_tile_action(action, self.mesh, self.log)
        if made is not None:
            _wake(rewriter, made)

    def _tile_whole_uses(self, value: SSAValue, tiling: Tiling, rewriter: PatternRewriter) -> None:
        origin = tiling.origin or OriginAttr(0, "propagation", "a loop-carried value")
        made = tile_whole_uses(TileAction(value, tiling.dim, tiling.axis, origin), self.mesh)
        if made is not None:
            _wake(rewriter, made)

    def _tile_operand(
        self, carrier: Operation, k: int, tiling: Tiling, rewriter: PatternRewriter
    ) -> None:
        """The carrier's own use of operand k becomes a tile loop over it
        (other users of the value keep it as it is)."""
        operand, parts = carrier.operands[k], self.mesh.axes[tiling.axis]
        made = identity_tile_loop(operand, tiling.dim, tiling.axis, parts, tiling.origin)
        rewriter.insert(made, InsertPoint.before(carrier))
        carrier.operands[k] = made.result
        _wake(rewriter, made)
        rewriter.notify_op_modified(carrier)


def _tilings_of(values: tuple[SSAValue, ...]) -> list[Tiling]:
    return [tiling for value in values for tiling in tilings(value)]


def _sliced(result: SSAValue) -> list[Tiling]:
    """The tiling every use of a carrier's result takes, if they all slice it
    the same way over one axis (ZeRO's updates slicing a scan's gradients)."""
    found: set[tuple[str, int]] = set()
    first: SliceOp | None = None
    for use in result.uses:
        user = use.operation
        if type(user) is not SliceOp or range_axis(user.index) is None:
            return []
        found.add((range_axis(user.index) or "", user.dim_index))
        first = first or user
    if len(found) != 1 or first is None:
        return []
    (axis, dim), loop = found.pop(), first.index.owner.parent_op()
    assert isinstance(loop, LoopOp)  # a range belongs to a loop
    return [Tiling(axis, dim, loop.origin, loop)]


def _wake(rewriter: PatternRewriter, loop: LoopOp) -> None:
    """Queue a tile loop made outside the rewriter, its body and its users."""
    rewriter.notify_op_modified(loop)
    for op in loop.body.block.ops:
        rewriter.notify_op_modified(op)
    for use in loop.result.uses:
        rewriter.notify_op_modified(use.operation)
