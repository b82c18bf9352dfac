"""Conflicts: two actions that want the same mesh axis in incompatible ways.

Propagation never fails on a conflict: the earlier action (in schedule order)
wins, the loser stays as it is, and the lowering redistributes it; except
where the earlier one's tiling would gather an operand whole (or leave a
partial sum) and a later one's is kept by exchanging the others along dims
they have (an all-to-all) for fewer bytes (`cheaper_exchange`): expert
parallelism's choice between gathering the experts' weights and dispatching
tokens to them, which the conflict's detail records with both costs. Each
conflict is recorded so the caller and the report can say what was given up:
in a `ConflictLog` while rewriting, then on the module as typed
`#partir.conflict` attributes (`record_conflicts`), which every later pass,
the CLI and the report read back with `recorded_conflicts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ArrayAttr, ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue

from dialects.dtypes import tensor_bytes
from dialects.escaping import quoted
from dialects.partir import CONFLICTS, ConflictAttr, OriginAttr
from rewrites.registry import FactorKind, OpRule


def describe_origin(origin: OriginAttr | None) -> str:
    return origin.describe() if origin is not None else "an unrecorded action"


@dataclass(frozen=True)
class Conflict:
    """At `op`, `values` wanted `axis` on dims that run over different factors."""

    op: str
    values: tuple[str, ...]
    axis: str
    winner: str
    loser: str
    detail: str

    def __str__(self) -> str:
        return (
            f'{self.op} on axis {quoted(self.axis)}: {self.winner} wins over {self.loser} '
            f"({', '.join(self.values)}): {self.detail}"
        )

    def to_attr(self) -> ConflictAttr:
        return ConflictAttr(self.op, self.axis, self.values, self.winner, self.loser, self.detail)

    @staticmethod
    def of(attr: ConflictAttr) -> Conflict:
        return Conflict(
            attr.op.data,
            tuple(v.data for v in attr.values.data),
            attr.axis.data,
            attr.winner.data,
            attr.loser.data,
            attr.detail.data,
        )


@dataclass
class ConflictLog:
    """Conflicts in the order found, without repeats."""

    conflicts: list[Conflict] = field(default_factory=list)

    @staticmethod
    def value_of(origin: OriginAttr | None, fallback: str) -> str:
        """The name of the value an action tiled (else `fallback`)."""
        return origin.value.data if origin is not None and origin.value.data else fallback

    def record(self, conflict: Conflict) -> None:
        if conflict not in self.conflicts:
            self.conflicts.append(conflict)


def record_conflicts(module: ModuleOp, conflicts: list[Conflict]) -> None:
    """Append `conflicts` to the module's `partir.conflicts`, without repeats."""
    old = module.attributes.get(CONFLICTS)
    entries = list(old.data) if isinstance(old, ArrayAttr) else []
    for conflict in conflicts:
        attr = conflict.to_attr()
        if attr not in entries:
            entries.append(attr)
    if entries:
        module.attributes[CONFLICTS] = ArrayAttr(entries)


def recorded_conflicts(module: ModuleOp) -> list[Conflict]:
    """The conflicts recorded on `module`, in the order found."""
    attr = module.attributes.get(CONFLICTS)
    if not isinstance(attr, ArrayAttr):
        return []
    return [Conflict.of(entry) for entry in attr.data if isinstance(entry, ConflictAttr)]


@dataclass(frozen=True)
class Redistribution:
    """What following `factor` costs: bytes per device (XLA's accounting: an
    all-gather's result, an all-to-all's part, an all-reduce's value) of the
    operands tiled over the same axis on other factors, gathered whole where
    they have no dim over `factor` (`gathers`) or else exchanged, plus, for a
    reduction factor, the partial sum of the result (`partial`), which is
    reduced later."""

    factor: int
    bytes: int
    gathers: bool
    partial: bool

    def describe(self, operands: Sequence[int]) -> str:
        how = "all-gathering" if self.gathers else "exchanging (all-to-all)"
        listed = ", ".join(str(i) for i in operands)
        what = f"{how} operand{'s' if len(operands) > 1 else ''} {listed}"
        return f"{what}{' and summing the result' if self.partial else ''}: {self.bytes} bytes"


def redistribution(
    rule: OpRule,
    op: Operation,
    tiled: Sequence[tuple[int, int]],
    factor: int,
    parts: int,
    sizes: Sequence[int] | None = None,
) -> Redistribution:
    """The cost of `op` following `factor` for the operands of `tiled`
    ((operand, factor) pairs over one axis of `parts` devices) on another
    factor: each is gathered where it has no dim over `factor`, else
    exchanged; a reduction factor also leaves the result a partial sum.
    `sizes`: each operand's bytes then each result's, where the op's types
    are not its part's (a decision made before anything is built)."""
    dims = rule.operand_dims(factor)
    total, gathers = 0, False
    count = len(op.operands)
    for operand in sorted({i for i, f in tiled if f != factor}):
        size = sizes[operand] if sizes is not None else _bytes(op.operands[operand])
        if dims[operand] is None:
            total, gathers = total + size, True
        else:
            total += size // parts
    partial = rule.factors[factor].kind is FactorKind.SUM
    if partial:
        total += (
            sum(sizes[count:]) if sizes is not None else sum(_bytes(r) for r in op.results)
        )
    return Redistribution(factor, total, gathers, partial)


def _bytes(value: SSAValue) -> int:
    ty = value.type
    return tensor_bytes(ty) if isinstance(ty, TensorType) else 0


def cheaper_exchange(
    rule: OpRule,
    op: Operation,
    tiled: Sequence[tuple[int, int]],
    parts: int,
    sizes: Sequence[int] | None = None,
) -> tuple[int, str]:
    """Which of `tiled` ((operand, factor) pairs of `op` over one axis,
    earliest action first) to follow, and, where bytes decided it, why.

    The first (the earlier action wins), unless it would gather an operand
    whole (an expert's weights, which have no token dim) or leave the result
    a partial sum (an expert's weight gradient summed over tokens), and
    another keeps the result tiled (a parallel factor) by exchanging the
    others along dims they have for fewer bytes: the dispatched tokens, which
    have the expert dim, sent to the experts' devices by all-to-all. Where
    such an exchange exists, the reason names both costs, whichever wins."""
    first = redistribution(rule, op, tiled, tiled[0][1], parts, sizes)
    if not (first.gathers or first.partial):
        return 0, ""
    best: tuple[int, Redistribution] | None = None
    for k, (_, factor) in enumerate(tiled[1:], start=1):
        if factor == first.factor or rule.factors[factor].kind is not FactorKind.PARALLEL:
            continue
        cost = redistribution(rule, op, tiled, factor, parts, sizes)
        if not cost.gathers and (best is None or cost.bytes < best[1].bytes):
            best = (k, cost)
    if best is None:
        return 0, ""
    k, cost = best
    kept = cost.describe(sorted({i for i, f in tiled if f != cost.factor}))
    given_up = first.describe(sorted({i for i, f in tiled if f != first.factor}))
    if cost.bytes < first.bytes:
        return k, f"the later action wins by {kept} instead of {given_up}"
    return 0, f"the loser is redistributed by {given_up}, no more than {kept}"
