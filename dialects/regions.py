"""Recognising the small regions StableHLO ops carry (reduce bodies, scatter
update computations): registry, interpreter and emitter all ask the same
question, so it is answered once, here."""

from __future__ import annotations

from xdsl.ir import Operation, Region


def binary_combiner(region: Region) -> Operation | None:
    """The op if `region` is `^bb0(%a, %b): return op(%a, %b)` (either operand
    order), as JAX writes add/max/min/... reductions and scatter-adds."""
    block = region.block
    ops = list(block.ops)
    if len(block.args) != 2 or len(ops) != 2:
        return None
    combine, ret = ops
    if ret.name != "stablehlo.return" or list(ret.operands) != list(combine.results):
        return None
    if len(combine.results) != 1 or len(combine.operands) != 2:
        return None
    return combine if set(combine.operands) == set(block.args) else None


def combiner_name(region: Region) -> str | None:
    """The name of the op a `binary_combiner` region applies (`stablehlo.add`, ...)."""
    combine = binary_combiner(region)
    return combine.name if combine is not None else None


def returns_update(region: Region) -> bool:
    """Whether `region` is `^bb0(%current..., %update...): return %update...`
    (a scatter that replaces), for one or more scattered inputs."""
    block = region.block
    ops = list(block.ops)
    count = len(block.args) // 2
    return (
        count > 0
        and len(block.args) == 2 * count
        and len(ops) == 1
        and ops[0].name == "stablehlo.return"
        and list(ops[0].operands) == list(block.args[count:])
    )
