"""What tiling a value carries, read off the loops that produced it.

After a few rewrites a value is often not a loop result itself but a slice of
one, inside another loop: `slice 0 %y[%r]` where `%y = loop "batch" [tile<0>]
(... yield (loop "model" [tile<1>] ...))` is, for its consumers, a value tiled
on dim 1 over "model". Propagation decides with this view, without rewriting
anything to obtain it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Block, Operation, SSAValue

from dialects.partir import LoopOp, OriginAttr, RangeType, SliceOp, TileAttr


@dataclass(frozen=True)
class Tiling:
    """`value` is the concatenation along `dim` of parts over mesh `axis`."""

    axis: str
    dim: int
    origin: OriginAttr | None
    loop: LoopOp

    @property
    def order(self) -> int:
        """Schedule position of the action behind it (unknown ones come last)."""
        return self.origin.action.data if self.origin is not None else 1 << 30


def visible_tilings(value: SSAValue) -> list[Tiling]:
    """Tilings of `value`, outermost loop first.

    A tile loop contributes its own axis plus whatever its body's value
    carries; a sum loop passes its body's tilings through (a sum of
    concatenations is a concatenation of sums); a slice over an axis the
    value is tiled on peels that tiling off. (Not memoised: rewriting an op
    inside a loop replaces the loop's yielded value in place.)
    """
    owner = value.owner
    kind = type(owner)
    if kind is LoopOp:
        inner = visible_tilings(owner.yielded)  # type: ignore[union-attr]
        action = owner.action  # type: ignore[union-attr]
        if type(action) is TileAttr:
            tiling = Tiling(owner.axis_name, action.dim.data, owner.origin, owner)  # type: ignore[union-attr]
            return [tiling, *inner]
        return inner
    if kind is SliceOp:
        axis = range_axis(owner.index)  # type: ignore[union-attr]
        outer = visible_tilings(owner.src)  # type: ignore[union-attr]
        dim = owner.dim_index  # type: ignore[union-attr]
        if any(t.axis == axis and t.dim == dim for t in outer):
            return [t for t in outer if t.axis != axis]
    return []


def range_axis(index: SSAValue) -> str | None:
    """The mesh axis of the loop whose range `index` is."""
    owner = index.owner
    if isinstance(owner, Block) and isinstance(owner.parent_op(), LoopOp):
        return owner.parent_op().axis_name  # type: ignore[union-attr]
    return None


def range_size(index: SSAValue) -> int:
    assert isinstance(index.type, RangeType)
    return index.type.size.data


def loop_axes(op: Operation) -> list[str]:
    """Axes of the loops `op` is nested in, innermost first."""
    axes: list[str] = []
    parent = op.parent_op()
    while parent is not None:
        if isinstance(parent, LoopOp):
            axes.append(parent.axis_name)
        parent = parent.parent_op()
    return axes


def enclosing_axes(op: Operation) -> set[str]:
    """Axes of the loops `op` is nested in."""
    return set(loop_axes(op))


def enclosing_range(op: Operation, axis: str) -> SSAValue | None:
    """The range of the loop over `axis` that `op` is nested in, if any."""
    parent = op.parent_op()
    while parent is not None:
        if isinstance(parent, LoopOp) and parent.axis_name == axis:
            return parent.range_arg
        parent = parent.parent_op()
    return None
