"""Where a value carried through a region op appears.

A `stablehlo.while` carries value k through its operand, its body's and its
condition's argument, the value its body returns, and its result; an
`optimization_barrier` through its operand and result; a conditional
(`case`, `if`) through each branch's returned value and its result. Every
rewrite that gives a carried value a property (a tiling, a padded shape)
gives it to all of these places at once.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

BRANCHING_OPS = (shlo.CaseOp, shlo.IfOp)
"""Conditionals: operand 0 picks the region that runs; their results are
what its `stablehlo.return` gives."""

CARRIERS = (shlo.WhileOp, shlo.OptimizationBarrierOp, *BRANCHING_OPS)


def enclosing_carrier(op: Operation) -> Operation | None:
    """The while whose body, or the conditional whose branch, `op` (a
    `stablehlo.return`) ends, if any."""
    parent = op.parent_op()
    if isinstance(parent, shlo.WhileOp) and op.parent_region() is parent.body:
        return parent
    if isinstance(parent, BRANCHING_OPS):
        return parent
    return None


def carried_places(op: Operation, k: int) -> tuple[SSAValue, ...]:
    """Where carried value k appears besides the operands that feed it: a
    while's body and condition arguments and its result; a barrier's or a
    conditional's result."""
    if isinstance(op, shlo.WhileOp):
        return (op.body.block.args[k], op.cond.block.args[k], op.results[k])
    return (op.results[k],)


def carried_feeds(op: Operation, k: int) -> list[tuple[Operation, int]]:
    """The (op, operand index) uses that feed carried value k: the while's or
    barrier's own operand, and the value each body or branch returns."""
    feeds: list[tuple[Operation, int]] = []
    if not isinstance(op, BRANCHING_OPS):
        feeds.append((op, k))
    if isinstance(op, (shlo.WhileOp, *BRANCHING_OPS)):
        regions = [op.body] if isinstance(op, shlo.WhileOp) else list(op.regions)
        for region in regions:
            returned = region.block.last_op
            assert returned is not None
            feeds.append((returned, k))
    return feeds


def carried_index(value: SSAValue) -> tuple[Operation, int] | None:
    """(carrier, k) if `value` is one of `carried_places(carrier, k)`."""
    owner = value.owner
    if isinstance(owner, CARRIERS):
        return owner, value.index  # type: ignore[attr-defined]
    if isinstance(owner, Operation):
        return None
    parent = owner.parent_op()
    if isinstance(parent, shlo.WhileOp):
        return parent, value.index  # type: ignore[attr-defined]
    return None


def fed_index(op: Operation, index: int) -> tuple[Operation, int] | None:
    """(carrier, k) if operand `index` of `op` feeds carried value k."""
    if isinstance(op, shlo.WhileOp | shlo.OptimizationBarrierOp):
        return op, index
    if isinstance(op, shlo.ReturnOp) and (carrier := enclosing_carrier(op)) is not None:
        return carrier, index
    return None
