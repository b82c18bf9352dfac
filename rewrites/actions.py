"""Tiling actions: `v ~> loop a [tile d] (\\r -> slice d v[r])`.

An action replaces every use of a value by a loop that rebuilds it from its
parts; the program means the same, and propagation then moves the loop
through the ops around it. Each action's loop carries an `OriginAttr` (its
number in the schedule and the tactic that asked for it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, i64
from xdsl.ir import Attribute, Block, BlockArgument, OpResult, Region, SSAValue, Use

from dialects.escaping import quoted
from dialects.functions import enclosing_function
from dialects.partir import (
    ACTIONS,
    ORIGIN,
    LoopOp,
    MeshOp,
    OriginAttr,
    SliceOp,
    TileAttr,
    YieldOp,
    range_type,
)
from rewrites.conflicts import Conflict, ConflictLog, describe_origin
from rewrites.padding import pad_for_divisibility
from rewrites.projection import range_axis, tilings


class ActionError(ValueError):
    """An action that cannot be applied: unknown axis, bad dim, indivisible size."""


@dataclass(frozen=True)
class TileAction:
    """Tile `value` along `dim` over mesh `axis`; `origin` says who asked."""

    value: SSAValue
    dim: int
    axis: str
    origin: OriginAttr
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or describe_value(self.value)


def take_action_numbers(module: ModuleOp, count: int) -> int:
    """Reserve `count` action numbers; returns the first. The module keeps the
    running count (`partir.actions`), so numbers stay in schedule order across
    passes even when an action's loops have all been fused away."""
    current = module.attributes.get(ACTIONS)
    first = (current.value.data if isinstance(current, IntegerAttr) else 0) + 1
    module.attributes[ACTIONS] = IntegerAttr(first + count - 1, i64)
    return first


def describe_value(value: SSAValue) -> str:
    if value.name_hint:
        return f"%{value.name_hint}"
    if isinstance(value, BlockArgument):
        return f"argument {value.index}"
    assert isinstance(value, OpResult)  # an SSA value is a block argument or an op result
    return f"result of {value.owner.name}"


def check_action(action: TileAction, mesh: MeshOp) -> None:
    """Raise `ActionError` naming the value if the action cannot apply."""
    axes = mesh.axes
    if action.axis not in axes:
        known = ", ".join(quoted(a) for a in axes)
        raise ActionError(
            f"{action.name}: unknown mesh axis {quoted(action.axis)} (the mesh has {known})"
        )
    ty = action.value.type
    if not isinstance(ty, TensorType) or ty.get_num_dims() == 0:
        raise ActionError(f"{action.name}: only a tensor of rank >= 1 can be tiled, got {ty}")
    rank = ty.get_num_dims()
    if not 0 <= action.dim < rank:
        raise ActionError(f"{action.name}: dim {action.dim} is out of range for {ty}")
    check_size(action, ty, axes[action.axis])


def check_size(action: TileAction, ty: TensorType, parts: int) -> None:
    """Raise `ActionError` if `action`'s dim of `ty` (its value's type, or
    its part after the splits decided before) is smaller than its axis."""
    size = ty.get_shape()[action.dim]
    if size < parts:
        raise ActionError(
            f"{action.name}: dim {action.dim} of {ty} has size {size}, smaller than mesh axis "
            f"{quoted(action.axis)} of size {parts} (some devices would hold only padding); "
            "pick another dim or axis"
        )


def _shape(value: SSAValue) -> tuple[int, ...]:
    ty = value.type
    assert isinstance(ty, TensorType)
    return tuple(ty.get_shape())


def existing_tiling(value: SSAValue, axis: str) -> int | None:
    """The dim `value` is already tiled on over `axis`, if it is."""
    for tiling in tilings(value):
        if tiling.axis == axis:
            return tiling.dim
    for use in value.uses:
        op = use.operation
        if isinstance(op, SliceOp) and range_axis(op.index) == axis:
            return op.dim_index
        if isinstance(op, LoopOp | YieldOp):
            continue
    return None


def identity_tile_loop(
    value: SSAValue, dim: int, axis: str, parts: int, origin: OriginAttr | None
) -> LoopOp:
    """`loop axis [tile dim] (\\r -> slice dim value[r])`, equal to `value`
    (not inserted)."""
    block = Block(arg_types=[range_type(parts)])
    part = SliceOp(value, dim, block.args[0])
    block.add_ops([part, YieldOp(part.result)])
    attributes: dict[str, Attribute] = {ORIGIN: origin} if origin is not None else {}
    return LoopOp(axis, TileAttr(dim), Region(block), value.type, attributes)


def split_further(action: TileAction) -> list[TileAction]:
    """A tactic's action on a value whose every use takes a part of the same
    dim over another axis (an earlier action split it): the action splits
    each part instead, so the dim is split over both axes, the earlier one
    major (`PartitionSpec(("batch", "model"))`), and a sum over it is one
    collective over both. Otherwise the action itself."""
    uses = [use.operation for use in action.value.uses]
    if not uses or not all(
        isinstance(op, SliceOp)
        and op.dim_index == action.dim
        and range_axis(op.index) not in (None, action.axis)
        for op in uses
    ):
        return [action]
    return [
        further
        for op in dict.fromkeys(uses)
        for further in split_further(replace(action, value=op.results[0]))
    ]


def apply_tactic_action(action: TileAction, mesh: MeshOp, log: ConflictLog) -> None:
    """A tactic's action: on the parts `split_further` finds, else on the value."""
    for part in split_further(action):
        apply_tile_action(part, mesh, log)


def apply_tile_action(action: TileAction, mesh: MeshOp, log: ConflictLog) -> LoopOp | None:
    """Insert the action's loop and redirect the value's uses to it.

    A value already tiled on the axis is left alone: on the same dim the action
    is a no-op; on another dim it is a conflict, and the earlier tiling wins.
    """
    check_action(action, mesh)
    current = existing_tiling(action.value, action.axis)
    if current is not None:
        if current != action.dim:
            log.record(
                Conflict(
                    op="tile action",
                    values=(action.name,),
                    axis=action.axis,
                    winner="the earlier tiling",
                    loser=describe_origin(action.origin),
                    detail=f"already tiled on dim {current}, asked for dim {action.dim}",
                )
            )
        return None
    parts = mesh.axes[action.axis]
    if _shape(action.value)[action.dim] % parts:  # padded for divisibility
        scope = enclosing_function(action.value)
        padded = pad_for_divisibility(action.value, action.dim, parts, scope)
        action = replace(action, value=padded.value)
    return _redirect_uses(action, parts, lambda use: True)


def tile_whole_uses(action: TileAction, mesh: MeshOp) -> LoopOp | None:
    """Redirect the uses of `action.value` that read it whole to the action's
    loop, when its other uses already take parts of it over the action's axis
    on the action's dim (`existing_tiling` then calls it tiled, and
    `apply_tile_action` would leave the whole uses whole).

    A loop-carried value needs this: one distribution in the body, so a body
    argument that is sliced by one user and read whole by another (an LSTM's
    previous state, saved per step for the backward pass) is tiled for both.
    None when there is nothing to redirect, the value is itself a tile loop's
    result, or the dim needs padding (its parts are then padded slices)."""
    if action.axis not in mesh.axes or any(t.axis == action.axis for t in tilings(action.value)):
        return None
    parts = mesh.axes[action.axis]
    if _shape(action.value)[action.dim] % parts:
        return None

    def whole(use: Use) -> bool:
        op = use.operation
        return not (type(op) is SliceOp and range_axis(op.index) == action.axis)

    if not any(whole(use) for use in action.value.uses):
        return None
    return _redirect_uses(action, parts, whole)


def _redirect_uses(action: TileAction, parts: int, chosen: Callable[[Use], bool]) -> LoopOp:
    """Insert the action's identity loop right after the value and make the
    `chosen` uses read it."""
    loop = identity_tile_loop(action.value, action.dim, action.axis, parts, action.origin)
    part = loop.body.block.first_op  # the slice: its use of the value stays
    owner = action.value.owner
    if isinstance(owner, Block):
        first = owner.first_op
        assert first is not None
        owner.insert_op_before(loop, first)
    else:
        parent = owner.parent_block()
        assert parent is not None
        parent.insert_op_after(loop, owner)
    action.value.replace_uses_with_if(
        loop.result, lambda use: use.operation is not part and chosen(use)
    )
    return loop
