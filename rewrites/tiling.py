"""Building the loop an op's rule promises: `op == loop a [tile d | sum] (\\r -> op_r)`.

`op_r` is the op on the parts of its operands (each sliced on the dimension
that runs over the tiled factor, with the factor's halo if it has one;
operands without it are used whole), with shapes divided by the axis size.
Propagation and the property tests build loops only through these functions,
so what is tested is what runs. The part, and the slices made for it, keep
`op`'s location (`dialects.locations`): the emitted statement and any
collective a slice needs point at the user's line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from dialects.locations import give_location
from dialects.partir import (
    HaloSliceOp,
    LoopOp,
    SliceOp,
    SumAttr,
    TileAttr,
    YieldOp,
    part_type,
    range_type,
)
from rewrites.registry import OpRule


def loop_action(rule: OpRule, factor: int, result: int = 0) -> TileAttr | SumAttr:
    dim = rule.result_dim(factor, result)
    return _tile(dim) if dim is not None else _SUM


@lru_cache(maxsize=64)
def _tile(dim: int) -> TileAttr:
    return TileAttr(dim)  # attributes are immutable values: build each once


_SUM = SumAttr()


def part_op(
    op: Operation, rule: OpRule, factor: int, parts: int, operands: Sequence[SSAValue]
) -> Operation:
    """`op` applied to `operands` (its operands' parts) with part-sized results;
    the slices made for it that have no location yet take its location."""
    result_types = []
    for k, result in enumerate(op.results):
        dim = rule.result_dim(factor, k)
        ty = result.type
        result_types.append(part_type(ty, dim, parts) if dim is not None else ty)
    properties = dict(op.properties)
    if rule.localize is not None:
        properties.update(rule.localize(op, rule, factor, lambda size: size // parts))
    give_location([v.owner for v in operands if isinstance(v.owner, _SLICES)], op.location)
    return type(op).create(
        operands=list(operands),
        result_types=result_types,
        properties=properties,
        attributes=dict(op.attributes),
        location=op.location,
        regions=[region.clone() for region in op.regions],
    )


_SLICES = (SliceOp, HaloSliceOp)


def slice_operands(
    rule: OpRule,
    factor: int,
    operands: Sequence[SSAValue],
    index: SSAValue,
    parts: Mapping[tuple[SSAValue, int], SSAValue] | None = None,
) -> tuple[list[Operation], list[SSAValue]]:
    """Slices of the operands that run over `factor` (the sideways step); an
    operand used twice (`x * x`) is sliced once, and one whose part is already
    at hand (`parts`, by operand and dim) is not sliced. A factor with a halo
    (a convolution's window) slices the first operand with it
    (`partir.halo_slice`)."""
    new_ops: list[Operation] = []
    values: list[SSAValue] = []
    made: dict[tuple[SSAValue, int], SSAValue] = dict(parts or {})
    halo = rule.factors[factor].halo
    for i, (operand, dim) in enumerate(zip(operands, rule.operand_dims(factor), strict=True)):
        if dim is None:
            values.append(operand)
        elif i == 0 and any(halo):  # the window op's input (`Factor.halo`)
            s: Operation = HaloSliceOp(operand, dim, index, halo)
            new_ops.append(s)
            values.append(s.results[0])
        elif (operand, dim) in made:
            values.append(made[operand, dim])
        else:
            s = SliceOp(operand, dim, index)
            new_ops.append(s)
            values.append(made.setdefault((operand, dim), s.results[0]))
    return new_ops, values


def tile_op(
    op: Operation,
    rule: OpRule,
    factor: int,
    axis: str,
    parts: int,
    attributes: dict[str, Attribute] | None = None,
) -> LoopOp:
    """The loop equal to `op` (of one result) with `factor` split over
    `axis` (not inserted)."""
    assert len(op.results) == 1, f"{op.name} has several results: use tile_results"
    return tile_results(op, rule, factor, axis, parts, attributes)[0]


def tile_results(
    op: Operation,
    rule: OpRule,
    factor: int,
    axis: str,
    parts: int,
    attributes: dict[str, Attribute] | None = None,
) -> list[LoopOp]:
    """Per result of `op`, the loop equal to it with `factor` split over
    `axis` (not inserted). A loop has one result, so an op with several (a
    sort, an argmax's reduce, a top_k) gets one loop per result, each with
    the op on the parts in its body: the copies are the same pure op on the
    same parts, which the compiler of the emitted program merges, and one
    whose result is unused is erased as dead code."""
    loops = []
    for k, result in enumerate(op.results):
        block = Block(arg_types=[range_type(parts)])
        slices, operands = slice_operands(rule, factor, list(op.operands), block.args[0])
        body = part_op(op, rule, factor, parts, operands)
        block.add_ops([*slices, body, YieldOp(body.results[k])])
        action = loop_action(rule, factor, k)
        loop = LoopOp(axis, action, Region(block), result.type, dict(attributes or {}))
        loop.location = op.location
        loops.append(loop)
    return loops
