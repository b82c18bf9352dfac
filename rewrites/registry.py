"""The equivalence registry: how each StableHLO op commutes with tiling.

Every rule is stated with *factors*, as in Shardy: the op's iteration space
has factors, and each operand and result dimension names the factors it runs
over, major to minor (a reshape merges or splits them). From one rule both of
PartIR's tables follow:

- tiling a factor that appears in the result gives a `tile` loop on that result
  dimension (PartIR's `tile_mappings`);
- tiling an add-reduction factor (dot_general's contracting dims, `reduce`
  with an `add` body and a zero init) gives a `sum` loop (`sum_mappings`).

A reduction that is not a sum (`reduce` with a max/min/and/or body) is
*blocked*: a per-part maximum is not a sum, and partir has no max loop, so the
reduced dimension stays whole and propagation stops there. Other blocked
factors have their own reasons (an iota's counting dimension, a dimension a
slice cuts, ...), each stated where the rule is built. A blocked factor may
be *regroupable* (`OpRule.regroupable`: an argmax's or a top_k's): the op
is rewritten as the op on each part and the op again over the parts' picks.

An op with several results (a sort of several operands, an argmax's
reduce, `chlo.top_k`) runs them all over the same factors; tiling it gives
one loop per result (`tiling.tile_results`).

An op with no rule at all is *opaque*: `OPAQUE_REASONS` says why, propagation
stops at it and it stays replicated. Nothing here knows about passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

from xdsl.dialects.builtin import I64, DenseIntOrFPElementsAttr, IntegerAttr, TensorType, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.xdsl_extras.traits import Elementwise

from dialects.attributes import ints
from dialects.chlo import BINARY_CLASSES, UNARY_CLASSES, TopKOp
from dialects.convolution import ConvolutionOp
from dialects.names import op_name
from dialects.regions import combiner_name
from dialects.sdy import ShardingConstraintOp
from dialects.stablehlo_ext import (
    CompareOp,
    DynamicUpdateSliceOp,
    PadOp,
    ReduceOp,
    ReduceWindowOp,
    ReverseOp,
    SelectAndScatterOp,
    SliceOp,
    SortOp,
)

Dims = tuple[tuple[int, ...], ...]
"""Per tensor dimension, the factor ids it runs over, major to minor."""


class FactorKind(Enum):
    PARALLEL = "parallel"  # appears in the result: tiling it gives a tile loop
    SUM = "sum"  # an add-reduction: tiling it gives a sum loop
    BLOCKED = "blocked"  # may not be tiled; `Factor.reason` says why


@dataclass(frozen=True)
class Factor:
    size: int
    kind: FactorKind
    reason: str = ""
    halo: tuple[int, int] = (0, 0)
    """Elements before and after its part that the op's first operand (a
    window op's input) must also read along its dim over this factor (a
    convolution's windows reaching into the neighbouring parts): tiling the
    factor slices that operand with its halo."""
    stride: int = 1
    """Operand elements per result element along the factor (a strided window)."""


Resize = Callable[[int], int]
"""A dim size over a factor -> its size in the rebuilt op: a part's
(`size // parts`, tiling) or a padded whole's (padding for divisibility)."""

Localizer = Callable[[Operation, "OpRule", int, Resize], dict[str, Attribute]]
"""(op, its rule, factor, resize) -> properties to replace in the op rebuilt
with the factor's dims resized (the per-part op; the padded op). The rule is
the op's as read before any resize: a builder splitting several factors
resizes the properties one factor at a time, and an op whose properties are
resized for one factor may read as another rule (a slice's cut dim)."""

Regroup = Callable[[Operation, int, int], tuple[list[Operation], list[SSAValue]] | None]
"""(op, factor, parts) -> new ops and the values replacing `op`'s results: the op
again with the factor's dims regrouped as [parts, size / parts] (a new
parallel factor of `parts`, major), the op on each group, and the op once
more over the groups' picks (`OpRule.regroupable`); None where `parts`
does not divide the factor, or the parts' picks are not fewer than the
whole (the op over the picks is that op already)."""


@dataclass(frozen=True)
class OpRule:
    """Which factor each operand and result dimension runs over."""

    factors: tuple[Factor, ...]
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    localize: Localizer | None = field(default=None, compare=False)
    unplaced: frozenset[int] = frozenset()
    regroupable: frozenset[int] = frozenset()
    """Blocked factors a selection of the whole's can still be split: the
    op on each part picks its own (an argmax of a part, with the part's
    indices global), then the op again over the parts' few picks
    (`regroup`): a sharded argmax gathers one (value, index) pair per part
    instead of the whole input. Propagation rewrites the op so (on a
    factor whose size `parts` divides) where an operand arrives split on
    one, and the new ops propagate as any others."""
    regroup: Regroup | None = field(default=None, compare=False)
    """Factors whose place in the *global* shapes these (local) shapes do not
    fix: a reshape's size-1 dim just major to the factor may be a dim some
    enclosing loop split down to 1, so a split of the factor's dims on one
    side may sit on that dim on the other. Tiling the op itself is fine (its
    shapes are the shapes at its level); reading its dims as the global
    layout across enclosing loops is not. Likewise a factor with a halo: a
    part of the result is the op on a part of the operand *and its halo*."""

    def operand_factor(self, operand: int, dim: int) -> int | None:
        """The factor a tiling of `operand`'s `dim` would tile (its major one)."""
        factors = self.operands[operand][dim]
        return factors[0] if factors else None

    def result_factor(self, result: int, dim: int) -> int | None:
        factors = self.results[result][dim]
        return factors[0] if factors else None

    def why_not_tileable(self, factor: int, parts: int) -> str | None:
        """None if `factor` may be split into `parts`; otherwise the reason."""
        f = self.factors[factor]
        if f.kind is FactorKind.BLOCKED:
            return f.reason
        if f.size % parts:
            return f"the dimension has {f.size} elements, which {parts} parts do not divide"
        for dims in (*self.operands, *self.results):
            for factors in dims:
                if factor in factors[1:]:
                    return "the dimension is the minor part of a reshape (a strided split)"
        if f.kind is FactorKind.PARALLEL and self.result_dim(factor) is None:
            return "the factor is not a result dimension"
        block = f.size * f.stride // parts
        if max(f.halo) > block:
            return (
                f"the window reaches {max(f.halo)} elements past a part of {block}: "
                "further than the neighbouring part"
            )
        return None

    def result_dim(self, factor: int, result: int = 0) -> int | None:
        """The dimension of result `result` that runs over `factor` (an op with
        several results, a sort or an argmax, runs them all over the same
        factors: each result gets a loop of its own, `tiling.tile_op`)."""
        return self.result_majors[result].get(factor)

    def operand_dims(self, factor: int) -> list[int | None]:
        """Per operand, the dimension that runs over `factor` (None: used whole)."""
        return [majors.get(factor) for majors in self.operand_majors]

    @cached_property
    def operand_majors(self) -> tuple[dict[int, int], ...]:
        """Per operand, factor -> the first dim it is the major factor of
        (propagation asks this for every operand it looks at)."""
        return tuple(_majors(dims) for dims in self.operands)

    @cached_property
    def result_majors(self) -> tuple[dict[int, int], ...]:
        """Per result, factor -> the first dim it is the major factor of."""
        return tuple(_majors(dims) for dims in self.results)

    @cached_property
    def windowed(self) -> bool:
        """Whether a factor has a halo (a convolution's window): a part of
        the result reads its operand 0's part and its neighbours' edges."""
        return any(any(f.halo) for f in self.factors)

    @cached_property
    def splittable(self) -> tuple[bool, ...]:
        """Per factor, whether some number of parts may split it: the part of
        `why_not_tileable` that does not depend on the sizes (propagation
        asks it for every split it considers)."""
        return tuple(self._splittable(f) for f in range(len(self.factors)))

    def _splittable(self, factor: int) -> bool:
        f = self.factors[factor]
        if f.kind is FactorKind.BLOCKED:
            return False
        for dims in (*self.operands, *self.results):
            for factors in dims:
                if factor in factors[1:]:
                    return False
        return not (f.kind is FactorKind.PARALLEL and self.result_dim(factor) is None)

    def tileable_factors(self, parts: int) -> list[int]:
        return [f for f in range(len(self.factors)) if self.why_not_tileable(f, parts) is None]


def _majors(dims: Dims) -> dict[int, int]:
    found: dict[int, int] = {}
    for d, factors in enumerate(dims):
        if factors:
            found.setdefault(factors[0], d)
    return found


class _Builder:
    """Accumulates factors while a rule is being stated."""

    def __init__(self) -> None:
        self.factors: list[Factor] = []

    def new(
        self,
        size: int,
        kind: FactorKind = FactorKind.PARALLEL,
        reason: str = "",
        halo: tuple[int, int] = (0, 0),
        stride: int = 1,
    ) -> int:
        self.factors.append(Factor(size, kind, reason, halo, stride))
        return len(self.factors) - 1

    def blocked(self, size: int, reason: str) -> tuple[int, ...]:
        return (self.new(size, FactorKind.BLOCKED, reason),) if size > 1 else ()

    def rule(
        self,
        operands: Sequence[Dims],
        results: Sequence[Dims],
        localize: Localizer | None = None,
        unplaced: frozenset[int] = frozenset(),
        regroupable: frozenset[int] = frozenset(),
        regroup: Regroup | None = None,
    ) -> OpRule:
        return OpRule(
            tuple(self.factors), tuple(operands), tuple(results), localize, unplaced,
            regroupable, regroup,
        )


def shape(value_or_type: object) -> tuple[int, ...]:
    ty = getattr(value_or_type, "type", value_or_type)
    assert isinstance(ty, TensorType), f"expected a ranked tensor, got {ty}"
    return tuple(ty.get_shape())


def _same_shape_dims(b: _Builder, dims_shape: Sequence[int]) -> Dims:
    # Size-1 dims get a factor too (never tileable: no axis divides 1), so
    # dimension correspondences can still be traced through the op.
    return tuple((b.new(n),) for n in dims_shape)


# --- rules ---------------------------------------------------------------------


def elementwise_rule(op: Operation) -> OpRule:
    """All operands and the result run over the same factors; scalars over none."""
    b = _Builder()
    out = shape(op.results[0])
    dims = _same_shape_dims(b, out)
    operands = [
        dims if len(shape(v)) == len(out) else tuple(() for _ in shape(v)) for v in op.operands
    ]
    return b.rule(operands, [dims])


def broadcast_in_dim_rule(op: shlo.BroadcastInDimOp) -> OpRule:
    """Operand dim i runs over result dim bdims[i]'s factor unless it is size 1
    (an expanded dim); result dims the operand lacks are result-only factors."""
    b = _Builder()
    src, out = shape(op.operand), shape(op.result)
    mapped = ints(op.broadcast_dimensions)
    result: list[tuple[int, ...]] = [(b.new(n),) for n in out]
    operand = tuple(result[r] if src[i] == out[r] else () for i, r in enumerate(mapped))
    return b.rule([operand], [tuple(result)])


def transpose_rule(op: shlo.TransposeOp) -> OpRule:
    b = _Builder()
    operand = _same_shape_dims(b, shape(op.operand))
    perm = ints(op.permutation)
    return b.rule([operand], [tuple(operand[p] for p in perm)])


def reshape_rule(op: shlo.ReshapeOp) -> OpRule:
    """Split the two shapes into common factors, left to right by gcd.

    `[B, T, C] -> [B, T, H, D]` gives factors B, T, H, D with operand dim 2
    running over (H, D): tiling H, the major part of the merged group, passes
    through; tiling D would be a strided split and is refused. Where the shapes
    stop sharing factors (e.g. [2, 3] -> [3, 2]) the remaining dims are blocked.
    A factor that starts a dim on one side right after size-1 dims were skipped
    on the other is `unplaced` (see `OpRule.unplaced`).
    """
    b = _Builder()
    src, out = shape(op.operand), shape(op.result)
    src_dims: list[list[int]] = [[] for _ in src]
    out_dims: list[list[int]] = [[] for _ in out]
    unplaced: set[int] = set()
    skipped_src = skipped_out = False
    i = j = 0
    ri = src[0] if src else 1
    rj = out[0] if out else 1
    while i < len(src) and j < len(out):
        if ri == 1:
            skipped_src |= not src_dims[i]
            i += 1
            ri = src[i] if i < len(src) else 1
            continue
        if rj == 1:
            skipped_out |= not out_dims[j]
            j += 1
            rj = out[j] if j < len(out) else 1
            continue
        g = math.gcd(ri, rj)
        if g == 1:
            reason = "reshape mixes these dimensions in a way no tiling survives"
            for k in range(i, len(src)):
                src_dims[k].extend(b.blocked(src[k], reason))
            for k in range(j, len(out)):
                out_dims[k].extend(b.blocked(out[k], reason))
            break
        f = b.new(g)
        if (skipped_out and not src_dims[i]) or (skipped_src and not out_dims[j]):
            unplaced.add(f)
        skipped_src = skipped_out = False
        src_dims[i].append(f)
        out_dims[j].append(f)
        ri //= g
        rj //= g
    return b.rule(
        [tuple(map(tuple, src_dims))], [tuple(map(tuple, out_dims))], unplaced=frozenset(unplaced)
    )


def dot_general_rule(op: shlo.DotGeneralOp) -> OpRule:
    """Batch dims in all three, free dims in one operand and the result,
    contracting dims in both operands and summed: `[i,k] x [k,j] -> [i,j]`."""
    b = _Builder()
    dn = op.dot_dimension_numbers
    lhs_s, rhs_s = shape(op.lhs), shape(op.rhs)
    lb, rb = ints(dn.lhs_batching_dimensions), ints(dn.rhs_batching_dimensions)
    lc, rc = ints(dn.lhs_contracting_dimensions), ints(dn.rhs_contracting_dimensions)
    lhs: list[tuple[int, ...]] = [()] * len(lhs_s)
    rhs: list[tuple[int, ...]] = [()] * len(rhs_s)
    result: list[tuple[int, ...]] = []
    for dl, dr in zip(lb, rb, strict=True):
        f = (b.new(lhs_s[dl]),)
        lhs[dl] = rhs[dr] = f
        result.append(f)
    for dl, dr in zip(lc, rc, strict=True):
        f = (b.new(lhs_s[dl], FactorKind.SUM),)
        lhs[dl] = rhs[dr] = f
    for side, side_shape, used in ((lhs, lhs_s, lb + lc), (rhs, rhs_s, rb + rc)):
        for d, n in enumerate(side_shape):
            if d not in used:
                side[d] = (b.new(n),)
                result.append(side[d])
    return b.rule([tuple(lhs), tuple(rhs)], [tuple(result)])


def _is_zero_constant(value: object) -> bool:
    owner = getattr(value, "owner", None)
    if not isinstance(owner, shlo.ConstantOp):
        return False
    attr = owner.value
    assert isinstance(attr, DenseIntOrFPElementsAttr)
    return all(v == 0 for v in attr.get_values())


def reduce_rule(op: ReduceOp) -> OpRule | None:
    """Kept dims are parallel; reduced dims are sum factors when the body is
    `add` and the init a zero constant (a sum of per-part sums), else blocked.
    A reduce of several inputs (`argmax`: values and their indices) runs all
    of them over the same factors; its reduced dims are blocked."""
    if len(op.inputs) != 1:
        return _variadic_reduce_rule(op)
    b = _Builder()
    src = shape(op.inputs[0])
    reduced = set(ints(op.dimensions))
    combiner = combiner_name(op.body)
    additive = combiner == "stablehlo.add" and _is_zero_constant(op.init_values[0])
    operand: list[tuple[int, ...]] = []
    result: list[tuple[int, ...]] = []
    for d, n in enumerate(src):
        if d in reduced:
            if additive:
                operand.append((b.new(n, FactorKind.SUM),))
            elif combiner == "stablehlo.add":
                operand.append(b.blocked(n, "an add-reduction whose init is not a zero constant"))
            else:
                kind = combiner.removeprefix("stablehlo.") if combiner else "custom"
                operand.append(b.blocked(n, f"a {kind}-reduction is not a sum of per-part results"))
        else:
            f = (b.new(n),)
            operand.append(f)
            result.append(f)
    init: Dims = ()
    return b.rule([tuple(operand), init], [tuple(result)])


def _variadic_reduce_rule(op: ReduceOp) -> OpRule:
    """An argmax: the reduced dims are blocked, and regroupable (its body is
    a selection of one input set, so a part's winner competes again with
    the other parts'; its index input is the whole's iota, so the indices
    stay global through the regrouping reshape)."""
    b = _Builder()
    src = shape(op.inputs[0])
    reduced = set(ints(op.dimensions))
    reason = "a reduction of several operands (an argmax): a part's winner is not the whole's"
    operand: list[tuple[int, ...]] = []
    result: list[tuple[int, ...]] = []
    regroupable: set[int] = set()
    for d, n in enumerate(src):
        if d in reduced:
            operand.append(b.blocked(n, reason))
            regroupable.update(operand[-1])
        else:
            f = (b.new(n),)
            operand.append(f)
            result.append(f)
    inputs = [tuple(operand)] * len(op.inputs)
    inits: list[Dims] = [()] * len(op.init_values)
    return b.rule(
        [*inputs, *inits], [tuple(result)] * len(op.results),
        regroupable=frozenset(regroupable), regroup=_regroup_reduce,
    )


def _regroup_reduce(
    op: Operation, factor: int, parts: int
) -> tuple[list[Operation], list[SSAValue]] | None:
    """`reduce(xs, dims)` -> `reduce(reduce(reshape(xs) to [.., parts, n / parts, ..],
    dims + the inner dim), the parts' dim)`, both with `op`'s body and inits."""
    from xdsl.dialects.builtin import DenseArrayBase

    assert isinstance(op, ReduceOp)
    rule = reduce_rule(op)
    assert rule is not None
    d = rule.operand_dims(factor)[0]
    assert d is not None
    src = shape(op.inputs[0])
    if src[d] % parts or src[d] <= parts:
        return None
    grouped = [*src[:d], parts, src[d] // parts, *src[d + 1 :]]
    reduced = sorted(ints(op.dimensions))
    inner = sorted({r + (r > d) for r in reduced if r != d} | {d + 1})
    kept = [k for k in range(len(grouped)) if k not in inner]
    at = kept.index(d)  # the parts' dim in the inner reduce's results
    ops: list[Operation] = []
    reshaped = [_made(ops, op, _reshape(x, grouped)) for x in op.inputs]
    partial_types = [
        TensorType(r.type.element_type, [grouped[k] for k in kept])  # type: ignore[attr-defined]
        for r in op.results
    ]

    def again(inputs: Sequence[object], dims: list[int], types: list[Attribute]) -> Operation:
        made = type(op).create(
            operands=[*inputs, *op.init_values],  # type: ignore[list-item]
            result_types=types,
            properties={**op.properties, "dimensions": DenseArrayBase.from_list(i64, dims)},
            attributes=dict(op.attributes),
            regions=[region.clone() for region in op.regions],
        )
        made.location = op.location
        return made

    partial = again(reshaped, inner, list(partial_types))
    final = again(list(partial.results), [at], [r.type for r in op.results])
    return [*ops, partial, final], list(final.results)


def _reshape(value: SSAValue, to: Sequence[int]) -> Operation:
    element = value.type.element_type  # type: ignore[attr-defined]
    return shlo.ReshapeOp.create(operands=[value], result_types=[TensorType(element, to)])


def _made(ops: list[Operation], origin: Operation, op: Operation, result: int = 0) -> SSAValue:
    """Append `op` (made to replace `origin`, whose location it takes) to `ops`."""
    op.location = origin.location
    ops.append(op)
    return op.results[result]


def _pass_through_or_blocked(
    b: _Builder, src: Sequence[int], out: Sequence[int], keep: Sequence[bool], reason: str
) -> tuple[Dims, Dims]:
    operand: list[tuple[int, ...]] = []
    result: list[tuple[int, ...]] = []
    for d, (n, m) in enumerate(zip(src, out, strict=True)):
        if keep[d]:  # m parts of n // m elements each (a window op's stride)
            f: tuple[int, ...] = (b.new(m, stride=n // m),)
            operand.append(f)
            result.append(f)
        else:
            operand.append(b.blocked(n, reason))
            result.append(b.blocked(m, reason))
    return tuple(operand), tuple(result)


def _slice_localizer(
    op: Operation, rule: OpRule, factor: int, resize: Resize
) -> dict[str, Attribute]:
    """A kept dim's limit is the part's size (the bounds are sizes, not a view)."""
    from xdsl.dialects.builtin import DenseArrayBase, i64

    assert isinstance(op, SliceOp)
    d = rule.operand_dims(factor)[0]
    assert d is not None
    limits = list(ints(op.limit_indices))
    limits[d] = resize(shape(op.operand)[d])
    return {"limit_indices": DenseArrayBase.from_list(i64, limits)}


def slice_rule(op: SliceOp) -> OpRule:
    """Dims kept whole pass through (each part's limit is its own size); a cut
    dim is blocked: each part's window would start at its own offset."""
    b = _Builder()
    src, out = shape(op.operand), shape(op.result)
    starts, limits, strides = ints(op.start_indices), ints(op.limit_indices), ints(op.strides)
    keep = [starts[d] == 0 and limits[d] == src[d] and strides[d] == 1 for d in range(len(src))]
    operand, result = _pass_through_or_blocked(
        b, src, out, keep, "a slice cuts this dimension; each part would need its own window"
    )
    return b.rule([operand], [result], _slice_localizer)


def _dynamic_slice_localizer(
    op: Operation, rule: OpRule, factor: int, resize: Resize
) -> dict[str, Attribute]:
    """A dim the window spans whole: each part's window spans the part."""
    from xdsl.dialects.builtin import DenseArrayBase, i64

    assert isinstance(op, shlo.DynamicSliceOp)
    d = rule.operand_dims(factor)[0]
    assert d is not None
    sizes = list(ints(op.slice_sizes))
    sizes[d] = resize(shape(op.operand)[d])
    return {"slice_sizes": DenseArrayBase.from_list(i64, sizes)}


def dynamic_slice_rule(op: shlo.DynamicSliceOp) -> OpRule:
    """A dim the window spans whole passes through: its start clamps to 0 in
    every part as in the whole (a scan's per-layer slice keeps the other dims'
    tiling). A dim the window cuts is blocked: its start is a run-time value,
    so no part knows whether the window falls in it."""
    b = _Builder()
    src, out = shape(op.operand), shape(op.result)
    keep = [size == n for size, n in zip(ints(op.slice_sizes), src, strict=True)]
    operand, result = _pass_through_or_blocked(
        b, src, out, keep, "the window's start along this dimension is a run-time value"
    )
    starts: list[Dims] = [() for _ in op.start_indices]
    return b.rule([operand, *starts], [result], _dynamic_slice_localizer)


def dynamic_update_slice_rule(op: DynamicUpdateSliceOp) -> OpRule:
    """A dim the update spans whole passes through operand, update and result
    (its start clamps to 0); a dim the update covers in part is blocked."""
    b = _Builder()
    reason = "the update's start along this dimension is a run-time value"
    operand: list[tuple[int, ...]] = []
    update: list[tuple[int, ...]] = []
    for n, m in zip(shape(op.operand), shape(op.update), strict=True):
        if n == m:
            f = (b.new(n),)
            operand.append(f)
            update.append(f)
        else:
            operand.append(b.blocked(n, reason))
            update.append(b.blocked(m, reason))
    starts: list[Dims] = [() for _ in op.start_indices]
    return b.rule([tuple(operand), tuple(update), *starts], [tuple(operand)])


def pad_rule(op: PadOp) -> OpRule:
    b = _Builder()
    src, out = shape(op.operand), shape(op.result)
    lows, highs = ints(op.edge_padding_low), ints(op.edge_padding_high)
    interior = ints(op.interior_padding)
    keep = [lows[d] == highs[d] == interior[d] == 0 for d in range(len(src))]
    operand, result = _pass_through_or_blocked(
        b, src, out, keep, "padding this dimension puts the pad values in one part only"
    )
    return b.rule([operand, ()], [result])


def reverse_rule(op: ReverseOp) -> OpRule:
    """Dims not reversed pass through; a reversed dim is blocked: part i of the
    result is the reversal of part n-1-i of the operand, not of part i."""
    b = _Builder()
    reversed_dims = set(ints(op.dimensions))
    reason = "reversed: each part of the result is the mirror of another part"
    dims = tuple(
        b.blocked(n, reason) if d in reversed_dims else (b.new(n),)
        for d, n in enumerate(shape(op.operand))
    )
    return b.rule([dims], [dims])


def _convolution_localizer(
    op: Operation, rule: OpRule, factor: int, resize: Resize
) -> dict[str, Attribute]:
    """A tiled group factor (the rule's first, when there are groups): each
    part runs its share of the groups. A tiled spatial factor: each part
    reads its halo instead of the padding, so that dim is no longer padded."""
    assert isinstance(op, ConvolutionOp)
    groups = op.feature_groups * op.batch_groups
    if groups > 1 and factor == 0:
        field = "feature_group_count" if op.feature_groups > 1 else "batch_group_count"
        return {field: IntegerAttr(resize(groups), i64)}
    lhs_dim = rule.operand_dims(factor)[0]
    lhs = op.layouts[0]
    if lhs_dim not in lhs.spatial:
        return {}
    pads = [list(p) for p in op.pads]
    pads[lhs.spatial.index(lhs_dim)] = [0, 0]
    ty = TensorType(i64, [len(pads), 2])
    return {"padding": DenseIntOrFPElementsAttr.from_list(ty, [v for p in pads for v in p])}


def convolution_rule(op: ConvolutionOp) -> OpRule:
    """As dot_general: the batch passes through input and output, the output
    features through kernel and output, and the input features are a *sum*
    factor of input and kernel (in a weight gradient, where the batch is the
    contracted "feature", data parallelism becomes a sum). A group count
    splits a dim into (groups, per group), major to minor; the groups pass
    through. A spatial dim passes through where the output splits evenly with
    the input (`_output_halo`): each part of the input is read with a halo of
    its neighbours' elements (the `halo` of its factor, none for a 1x1 window
    or a patch embedding), and the kernel's window is used whole. Where the
    window spans the input instead (a kernel's gradient: the output's
    gradient is the window), the window is a sum factor (`_window_halo`): each
    part of it meets its part of the input, with a halo."""
    b = _Builder()
    lhs_l, kernel_l, out_l = op.layouts
    src, win, out = shape(op.lhs), shape(op.rhs), shape(op.result)
    lhs: list[tuple[int, ...]] = [()] * len(src)
    rhs: list[tuple[int, ...]] = [()] * len(win)
    result: list[tuple[int, ...]] = [()] * len(out)

    def split(group: int | None, size: int, kind: FactorKind = FactorKind.PARALLEL):
        """(group factor, per-group factor), each dropped where it has size 1."""
        inner = (b.new(size, kind),) if size > 1 else ()
        return ((group,) if group is not None else ()) + inner

    groups = op.feature_groups * op.batch_groups
    group = b.new(groups) if groups > 1 else None  # factor 0, see _group_localizer
    feature_group = group if op.feature_groups > 1 else None
    batch_group = group if op.batch_groups > 1 else None
    batch = split(batch_group, src[lhs_l.major] // op.batch_groups)
    lhs[lhs_l.major] = batch
    result[out_l.major] = batch[1:] if batch_group is not None else batch
    outputs = split(group, win[kernel_l.minor] // groups)
    rhs[kernel_l.minor] = result[out_l.minor] = outputs
    summed = split(None, win[kernel_l.major], FactorKind.SUM)
    rhs[kernel_l.major] = summed
    lhs[lhs_l.minor] = ((feature_group,) if feature_group is not None else ()) + summed
    halos: set[int] = set()
    for k, (d, kd, od) in enumerate(
        zip(lhs_l.spatial, kernel_l.spatial, out_l.spatial, strict=True)
    ):
        by_output = _output_halo(op, k, src[d], win[kd])
        by_window = _window_halo(op, k, src[d], win[kd])
        if not isinstance(by_output, str):
            f = b.new(out[od], halo=by_output, stride=op.strides[k])
            lhs[d] = result[od] = (f,)
            rhs[kd] = b.blocked(win[kd], "the kernel's window: every part applies all of it")
        elif not isinstance(by_window, str):
            f = b.new(win[kd], FactorKind.SUM, halo=by_window, stride=op.rhs_dilations[k])
            lhs[d] = rhs[kd] = (f,)
            result[od] = b.blocked(out[od], "every output element sums over the whole window")
        else:
            lhs[d] = b.blocked(src[d], by_output)
            rhs[kd] = b.blocked(win[kd], by_output)
            result[od] = b.blocked(out[od], by_output)
            continue
        if any(b.factors[f].halo):
            halos.add(f)  # a part of the result is not the op on a part of the input
    return b.rule(
        [tuple(lhs), tuple(rhs)], [tuple(result)], _convolution_localizer, frozenset(halos)
    )


def _output_halo(op: ConvolutionOp, k: int, n: int, window: int) -> tuple[int, int] | str:
    """The halo a part of spatial dim `k` reads when the output is split
    evenly with it (each part's windows start in the part: output size
    n / stride, the padding adding up to the window's reach beyond one
    stride), or why the dim cannot split."""
    stride, (lo, hi) = op.strides[k], op.pads[k]
    reach = (window - 1) * op.rhs_dilations[k] + 1
    if op.lhs_dilations[k] != 1:
        return "a dilated input (a transposed convolution): parts would interleave"
    if lo < 0 or hi < 0 or lo + hi != reach - stride or n % stride:
        return (
            "the output is not the input split evenly by the stride (padding "
            f"{(lo, hi)} for a window of {reach} and stride {stride}): parts would not align"
        )
    return (lo, hi)


def _window_halo(op: ConvolutionOp, k: int, n: int, window: int) -> tuple[int, int] | str:
    """The halo a part of spatial dim `k` reads when its window (spanning the
    input: the output's gradient in a kernel's gradient, dilated by the
    forward stride) is split with it: output element o sums window elements
    j with input elements o + j * dilation - lo, so the part of the input
    under a part of the window reads `lo` before it and `hi` after."""
    stride, (lo, hi) = op.strides[k], op.pads[k]
    if n != window * op.rhs_dilations[k] or (stride, op.lhs_dilations[k]) != (1, 1):
        return "the window does not span the input with stride 1"
    if lo < 0 or hi < 0:
        return f"negative padding {(lo, hi)} crops the input"
    return (lo, hi)


def _windows_tile(n: int, window: int, stride: int, pads: tuple[int, int]) -> bool:
    """Whether a dim's windows tile it: each inside its own `stride` elements
    (its reach at most the stride), unpadded, the stride dividing the dim. A
    part of the operand then makes its own part of the result (a 1x1 window;
    2x2 pooling with stride 2)."""
    return pads == (0, 0) and window <= stride and n % stride == 0


def reduce_window_rule(op: ReduceWindowOp) -> OpRule | None:
    """A dim whose windows tile it (`_windows_tile`) passes through; any
    other window dim is blocked: a part's windows reach into its neighbours'
    elements, and the padding (the init value) cannot come from them."""
    if len(op.inputs) != 1:
        return None
    b = _Builder()
    src = shape(op.inputs[0])
    keep = [
        base == 1 and _windows_tile(n, (w - 1) * dilation + 1, s, pad)
        for n, w, s, base, dilation, pad in zip(
            src, op.window, op.strides, op.base_dilation, op.window_dilation, op.pads,
            strict=True,
        )
    ]
    reason = "a window dim: each part's windows would need its neighbours' elements"
    operand, result = _pass_through_or_blocked(b, src, shape(op.results[0]), keep, reason)
    return b.rule([operand, ()], [result])


def select_and_scatter_rule(op: SelectAndScatterOp) -> OpRule:
    """A dim whose windows tile it (`_windows_tile`) passes through operand,
    source and result (the batch and channels of a pooled image, and the
    rows of 2x2 pooling with stride 2); any other window dim is blocked: a
    part's windows reach into its neighbours' elements, and where they
    overlap, neighbouring windows scatter into the same element."""
    b = _Builder()
    src = shape(op.operand)
    keep = [
        _windows_tile(n, w, s, pad)
        for n, w, s, pad in zip(src, op.window, op.strides, op.pads, strict=True)
    ]
    reason = "a window dim: each part's windows would need its neighbours' elements"
    operand, source = _pass_through_or_blocked(b, src, shape(op.source), keep, reason)
    return b.rule([operand, source, ()], [operand])


def sort_rule(op: SortOp) -> OpRule:
    """Dims other than the sorted one pass through (each lane sorts alone),
    in every input and result alike (an argsort sorts values and indices
    together); the sorted dim is blocked: a part's order depends on the
    other parts."""
    b = _Builder()
    src = shape(op.inputs[0])
    axis = op.axis % len(src)
    keep = [d != axis for d in range(len(src))]
    operand, result = _pass_through_or_blocked(
        b, src, src, keep, "the sorted dim: each part's order depends on the other parts"
    )
    return b.rule([operand] * len(op.inputs), [result] * len(op.results))


def top_k_rule(op: TopKOp) -> OpRule:
    """`chlo.top_k` along the last dim: the others pass through the operand
    and both results (each row picks its own k); the last dim is blocked:
    a part's k largest are not the whole row's, but regroupable: the k
    largest of the parts' k largest are (`_regroup_top_k`)."""
    b = _Builder()
    src = shape(op.operand)
    reason = "the dim top_k picks along: a part's k largest are not the whole row's"
    lanes = tuple((b.new(n),) for n in src[:-1])
    picked = b.blocked(src[-1], reason)
    operand = (*lanes, picked)
    result = (*lanes, b.blocked(op.count, reason))
    return b.rule(
        [operand], [result, result], regroupable=frozenset(picked), regroup=_regroup_top_k
    )


def _regroup_top_k(
    op: Operation, factor: int, parts: int
) -> tuple[list[Operation], list[SSAValue]] | None:
    """`top_k(x, k)` along [n] -> with x regrouped [parts, n / parts]: each
    group's k largest (`top_k` again, its indices made global by adding the
    group's offset), then the k largest of the parts * k picks and the
    global indices at their places (`take_along_axis`, a gather). Ties keep
    index order: the picks are in group order, and each group's in its own."""
    from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase

    assert isinstance(op, TopKOp)
    src = shape(op.operand)
    *lanes, n = src
    k = op.count
    if n % parts or n // parts < k or parts * k >= n:
        return None
    r = len(src)
    index_type = op.indices.type
    assert isinstance(index_type, TensorType)
    value_type = op.values.type
    assert isinstance(value_type, TensorType)
    element, index = value_type.element_type, index_type.element_type
    ops: list[Operation] = []
    grouped = _made(ops, op, _reshape(op.operand, [*lanes, parts, n // parts]))
    picks = [*lanes, parts, k]
    per_group = TopKOp.create(
        operands=[grouped], result_types=[TensorType(element, picks), TensorType(index, picks)],
        properties=dict(op.properties),
    )
    values = _made(ops, op, per_group, 0)
    local = per_group.results[1]
    scalar = DenseIntOrFPElementsAttr.from_list(TensorType(index, []), [n // parts])  # type: ignore[type-var]
    size = _made(ops, op, shlo.ConstantOp(scalar))  # type: ignore[arg-type]
    sizes = _made(ops, op, shlo.BroadcastInDimOp.create(
        operands=[size], result_types=[TensorType(index, picks)],
        properties={"broadcast_dimensions": DenseArrayBase.from_list(i64, [])},
    ))
    group = _made(ops, op, shlo.IotaOp.create(
        properties={"iota_dimension": IntegerAttr(r - 1, i64)},
        result_types=[TensorType(index, picks)],
    ))
    offset = _made(ops, op, shlo.MultiplyOp(group, sizes))
    found = _made(ops, op, shlo.AddOp(local, offset))
    flat = [*lanes, parts * k]
    values = _made(ops, op, _reshape(values, flat))
    found = _made(ops, op, _reshape(found, flat))
    best = TopKOp.create(
        operands=[values], result_types=[op.values.type, op.indices.type],
        properties=dict(op.properties),
    )
    _made(ops, op, best)
    at = _made(ops, op, _reshape(best.results[1], [*lanes, k, 1]))

    def dims(values: Sequence[int]) -> ArrayAttr[IntegerAttr[I64]]:
        return ArrayAttr([IntegerAttr(v, i64) for v in values])

    numbers = shlo.GatherDimensionNumbers(
        dims([]), dims([r - 1]), dims(range(r - 1)), dims(range(r - 1)), dims([r - 1]),
        IntegerAttr(r, i64),
    )
    take = shlo.GatherOp.create(
        operands=[found, at], result_types=[op.indices.type],
        properties={"dimension_numbers": numbers,
                    "slice_sizes": DenseArrayBase.from_list(i64, [1] * r)},
    )
    _made(ops, op, take)
    return ops, [best.results[0], take.results[0]]


def concatenate_rule(op: shlo.ConcatenateOp) -> OpRule:
    """Dims other than the concatenated one pass through all operands."""
    b = _Builder()
    axis = int(op.dimension.value.data)
    out = shape(op.result)
    reason = "the concatenated dimension: parts would mix pieces of different operands"
    shared: list[tuple[int, ...]] = [(b.new(n),) if d != axis else () for d, n in enumerate(out)]
    operands = []
    for v in op.inputs:
        dims = list(shared)
        dims[axis] = b.blocked(shape(v)[axis], reason)
        operands.append(tuple(dims))
    result = list(shared)
    result[axis] = b.blocked(out[axis], reason)
    return b.rule(operands, [tuple(result)])


def iota_rule(op: shlo.IotaOp) -> OpRule:
    b = _Builder()
    counting = int(op.iota_dimension.value.data)
    result = tuple(
        b.blocked(n, "the iota counts along this dimension; each part would need an offset")
        if d == counting
        else (b.new(n),)
        for d, n in enumerate(shape(op.results[0]))
    )
    return b.rule([], [result])


def _splat_localizer(
    op: Operation, rule: OpRule, factor: int, resize: Resize
) -> dict[str, Attribute]:
    assert isinstance(op, shlo.ConstantOp)
    value = op.value
    ty = value.type
    local_shape = list(ty.get_shape())
    d = rule.result_dim(factor)
    assert d is not None
    local_shape[d] = resize(local_shape[d])
    local = TensorType(ty.element_type, local_shape)
    first = value.get_values()[0]
    return {"value": DenseIntOrFPElementsAttr.from_list(local, [first] * math.prod(local_shape))}


def constant_rule(op: shlo.ConstantOp) -> OpRule | None:
    """A splat constant of any shape is a smaller splat in each part."""
    value = op.value
    if not isinstance(value, DenseIntOrFPElementsAttr) or not value.is_splat():
        return None
    b = _Builder()
    return b.rule([], [_same_shape_dims(b, shape(op.results[0]))], _splat_localizer)


def _gather_localizer(
    op: Operation, rule: OpRule, factor: int, resize: Resize
) -> dict[str, Attribute]:
    from xdsl.dialects.builtin import DenseArrayBase, i64

    assert isinstance(op, shlo.GatherOp)
    sizes = list(ints(op.slice_sizes))
    d = rule.operand_dims(factor)[0]
    if d is not None and sizes[d] == shape(op.operand)[d]:
        sizes[d] = resize(sizes[d])
    return {"slice_sizes": DenseArrayBase.from_list(i64, sizes)}


def gather_rule(op: shlo.GatherOp) -> OpRule:
    """Batch dims (shared by operand, indices and result), index dims (indices
    and result) and whole-slice offset dims (operand and result) pass through;
    indexed operand dims are blocked: which rows a part needs depends on data."""
    b = _Builder()
    dn = op.dimension_numbers
    src, idx, out = shape(op.operand), shape(op.start_indices), shape(op.result)
    offset_dims = ints(dn.offset_dims)
    collapsed = set(ints(dn.collapsed_slice_dims))
    operand_batch = ints(dn.operand_batching_dims)
    indices_batch = ints(dn.start_indices_batching_dims)
    start_map = set(ints(dn.start_index_map))
    ivd = int(dn.index_vector_dim.value.data)
    sizes = ints(op.slice_sizes)
    reason = "gathered along this dimension: which part holds a row depends on the indices"

    operand: list[tuple[int, ...]] = [()] * len(src)
    indices: list[tuple[int, ...]] = [()] * len(idx)
    result: list[tuple[int, ...]] = [()] * len(out)
    batch_result_dims = [d for d in range(len(out)) if d not in offset_dims]
    index_dims = [d for d in range(len(idx)) if d != ivd]
    for k, d in enumerate(index_dims):
        f = (b.new(idx[d]),)
        indices[d] = result[batch_result_dims[k]] = f
        if d in indices_batch:
            operand[operand_batch[indices_batch.index(d)]] = f
    offset_operand_dims = [
        d for d in range(len(src)) if d not in collapsed and d not in operand_batch
    ]
    for k, d in enumerate(offset_operand_dims):
        r = offset_dims[k]
        if d not in start_map and sizes[d] == src[d]:
            f = (b.new(src[d]),)
            operand[d] = result[r] = f
        else:
            operand[d] = b.blocked(src[d], reason)
            result[r] = b.blocked(out[r], reason)
    for d in range(len(src)):
        if d in collapsed and d not in operand_batch:
            operand[d] = b.blocked(src[d], reason)
    return b.rule([tuple(operand), tuple(indices)], [tuple(result)], _gather_localizer)


def _is_zero(value: object) -> bool:
    """A zero constant, or a broadcast of one (how JAX builds gradient bases)."""
    owner = getattr(value, "owner", None)
    if isinstance(owner, shlo.BroadcastInDimOp):
        return _is_zero(owner.operand)
    return _is_zero_constant(value)


def scatter_rule(op: shlo.ScatterOp) -> OpRule | None:
    """Scatter-add into zeros (a gradient of a gather): the updates' scatter
    dims, with the index dims they pair with, are *sum* factors: the scatter
    of all updates is the sum of the scatters of each part's updates. Whole
    update windows pass through to the operand's dims. Indexed operand dims,
    and every dim of any other scatter, are blocked: where an update lands
    depends on the index values."""
    if len(op.inputs) != 1 or len(op.updates) != 1:
        return None
    b = _Builder()
    dn = op.scatter_dimension_numbers
    src, idx, upd = shape(op.inputs[0]), shape(op.scatter_indices), shape(op.updates[0])
    window_dims = ints(dn.update_window_dims)
    inserted = set(ints(dn.inserted_window_dims))
    operand_batch = ints(dn.input_batching_dims)
    indices_batch = ints(dn.scatter_indices_batching_dims)
    indexed = set(ints(dn.scatter_dims_to_operand_dims))
    ivd = int(dn.index_vector_dim.value.data)
    summable = combiner_name(op.update_computation) == "stablehlo.add" and _is_zero(op.inputs[0])
    reason = "where an update lands depends on the index values"

    operand: list[tuple[int, ...]] = [()] * len(src)
    indices: list[tuple[int, ...]] = [()] * len(idx)
    updates: list[tuple[int, ...]] = [()] * len(upd)
    scatter_update_dims = [d for d in range(len(upd)) if d not in window_dims]
    index_dims = [d for d in range(len(idx)) if d != ivd]
    for k, d in enumerate(index_dims):
        u = scatter_update_dims[k]
        f: tuple[int, ...]
        if d in indices_batch:
            f = (b.new(idx[d]),)
            operand[operand_batch[indices_batch.index(d)]] = f
        elif summable:
            f = (b.new(idx[d], FactorKind.SUM),)
        else:
            f = b.blocked(idx[d], reason)
        indices[d] = updates[u] = f
    window_operand_dims = [
        d for d in range(len(src)) if d not in inserted and d not in operand_batch
    ]
    for k, d in enumerate(window_operand_dims):
        u = window_dims[k]
        if d not in indexed and upd[u] == src[d]:
            operand[d] = updates[u] = (b.new(src[d]),)
        else:
            operand[d] = b.blocked(src[d], reason)
            updates[u] = b.blocked(upd[u], reason)
    for d in range(len(src)):
        if not operand[d]:
            operand[d] = b.blocked(src[d], reason)
    return b.rule([tuple(operand), tuple(indices), tuple(updates)], [tuple(operand)])


def bitcast_convert_rule(op: shlo.BitcastConvertOp) -> OpRule | None:
    if len(shape(op.input)) != len(shape(op.results[0])):
        return None
    return elementwise_rule(op)


def map_rule(op: shlo.MapOp) -> OpRule:
    return elementwise_rule(op)


# --- the registry ----------------------------------------------------------------

RuleBuilder = Callable[..., OpRule | None]
"""A rule: called with an op of the name it is registered under, which its
signature names as that op's class (so the type checker checks the fields it
reads); the table is keyed by name, so the class cannot be stated here."""

RULES: dict[str, RuleBuilder] = {
    "stablehlo.broadcast_in_dim": broadcast_in_dim_rule,
    "stablehlo.transpose": transpose_rule,
    "stablehlo.reshape": reshape_rule,
    "stablehlo.dot_general": dot_general_rule,
    "stablehlo.convolution": convolution_rule,
    "stablehlo.reduce": reduce_rule,
    "stablehlo.slice": slice_rule,
    "stablehlo.dynamic_slice": dynamic_slice_rule,
    "stablehlo.dynamic_update_slice": dynamic_update_slice_rule,
    "stablehlo.pad": pad_rule,
    "stablehlo.reverse": reverse_rule,
    "stablehlo.concatenate": concatenate_rule,
    "stablehlo.iota": iota_rule,
    "stablehlo.constant": constant_rule,
    "stablehlo.gather": gather_rule,
    "stablehlo.bitcast_convert": bitcast_convert_rule,
    "stablehlo.map": map_rule,
    "stablehlo.scatter": scatter_rule,
    "stablehlo.reduce_window": reduce_window_rule,
    "stablehlo.select_and_scatter": select_and_scatter_rule,
    "stablehlo.sort": sort_rule,
    "chlo.top_k": top_k_rule,
    "stablehlo.select": elementwise_rule,
    "stablehlo.clamp": elementwise_rule,
    "sdy.sharding_constraint": elementwise_rule,  # the identity, until `Annotations` runs
}
for _cls in (*UNARY_CLASSES.values(), *BINARY_CLASSES.values()):
    RULES[_cls.name] = elementwise_rule

OPAQUE_REASONS: dict[str, str] = {
    "sdy.manual_computation": "a nested jax.shard_map: kept per device as written; its operands "
    "enter split as its in_specs say and its results leave as its out_specs say (Annotations)",
    "stablehlo.scatter(multi-input)": "a loop has one result; this scatter has several",
    "stablehlo.dynamic_broadcast_in_dim": "the result shape is a run-time value",
    "stablehlo.while": "a loop: every device runs it on its parts of the carried values, "
    "whose tiling rewrites.control_flow carries through (the loop itself is not split)",
    "stablehlo.if": "a conditional: every device takes the same branch, on its parts of the "
    "values the branches read; rewrites.control_flow carries its results' tiling",
    "stablehlo.case": "a conditional: every device takes the same branch, on its parts of the "
    "values the branches read; rewrites.control_flow carries its results' tiling",
    "stablehlo.custom_call": "an opaque call into the backend; its semantics are unknown",
    "stablehlo.optimization_barrier": "a fence: each value passes through with the "
    "distribution it arrives with, whose tiling rewrites.control_flow carries through",
    "stablehlo.after_all": "a token op: no tensor to tile",
    "sdy.sharding_constraint(reshard)": "a reshard the program states (Annotations): its "
    "result is split as it says whatever its operand is; the SPMD lowering redistributes",
    "stablehlo.return": "a region terminator, not a computation",
    "stablehlo.reduce_window(multi-input)": "a loop has one result; this reduce_window has "
    "several",
    "stablehlo.rng_bit_generator": "random bits: a part's bits are not a slice of the "
    "whole's bits, so every device draws them all (replicated) and takes its part",
    "stablehlo.constant(non-splat)": "a literal array: each part slices it at run time",
    "stablehlo.bitcast_convert(rank-changing)": "changing the bit width changes the rank",
}


# --- linearity: which operands a partial sum passes through -------------------------

Linear = tuple[frozenset[int], ...]
"""The sets of operands an op is linear in, jointly: when exactly the operands
of one set are partial sums over the same axes (each device holding a part
that sums to the value) and the others are whole, the op on each device's
parts gives parts that sum to the op's result (DistPar's P passing through).
`add` is linear in both operands together (parts of a + parts of b), a
product in either one alone (a part times a whole), never in both."""


def _float_to_float(op: Operation) -> bool:
    """Its first operand and its result are floats (a float divide; a convert
    between float types; integer division and rounding are not linear)."""
    from xdsl.dialects.builtin import AnyFloat, ComplexType

    def floating(value: object) -> bool:
        ty = getattr(value, "type", None)
        return isinstance(ty, TensorType) and isinstance(ty.element_type, AnyFloat | ComplexType)

    return floating(op.operands[0]) and floating(op.results[0])


def _add_into_zero(op: Operation) -> bool:
    assert isinstance(op, ReduceOp)
    return (
        len(op.inputs) == 1
        and combiner_name(op.body) == "stablehlo.add"
        and _is_zero_constant(op.init_values[0])
    )


_FIRST: Linear = (frozenset({0}),)
_EITHER: Linear = (frozenset({0}), frozenset({1}))
_BOTH: Linear = (frozenset({0, 1}),)


def _zeros(value: object) -> bool:
    """Whether `value` is all zeros: a zero constant, or a broadcast or a
    loop's part (`partir.slice`) of one."""
    from dialects.partir import SliceOp

    owner = getattr(value, "owner", None)
    while isinstance(owner, SliceOp | shlo.BroadcastInDimOp) and owner.operands:
        owner = owner.operands[0].owner  # (an op the lowering erased has none: not known zeros)
    return isinstance(owner, shlo.ConstantOp) and _is_zero_constant(owner.results[0])


def _select(op: Operation) -> Linear:
    """Linear in both branches together, and in one alone where the other is
    zeros (a mask: where a padded dim's sum operand is zeroed)."""
    sets = [frozenset({1, 2})]
    sets += [frozenset({b}) for b, other in ((1, 2), (2, 1)) if _zeros(op.operands[other])]
    return tuple(sets)


def _when(sets: Linear, condition: Callable[[Operation], bool]) -> Callable[[Operation], Linear]:
    return lambda op: sets if condition(op) else ()


LINEAR: dict[str, Callable[[Operation], Linear]] = {
    "stablehlo.add": lambda op: _BOTH,
    "stablehlo.subtract": lambda op: _BOTH,
    "stablehlo.negate": lambda op: _FIRST,
    "stablehlo.multiply": lambda op: _EITHER,
    "stablehlo.divide": _when(_FIRST, _float_to_float),
    "stablehlo.dot_general": lambda op: _EITHER,
    "stablehlo.convert": _when(_FIRST, _float_to_float),
    "stablehlo.reshape": lambda op: _FIRST,
    "stablehlo.transpose": lambda op: _FIRST,
    "stablehlo.broadcast_in_dim": lambda op: _FIRST,
    "stablehlo.slice": lambda op: _FIRST,
    "stablehlo.dynamic_slice": lambda op: _FIRST,
    "stablehlo.gather": lambda op: _FIRST,
    "stablehlo.reduce": _when(_FIRST, _add_into_zero),
    "stablehlo.select": _select,
    "stablehlo.dynamic_update_slice": lambda op: _BOTH,
    "stablehlo.concatenate": lambda op: (frozenset(range(len(op.operands))),),
    "stablehlo.real": lambda op: _FIRST,
    "stablehlo.imag": lambda op: _FIRST,
    "sdy.sharding_constraint": lambda op: _FIRST,
}
"""Per op name: its `Linear` sets (none where a condition fails: a convert or
a divide that is not on floats, a reduce that does not add into zero)."""


def linear_operands(op: Operation) -> Linear:
    """The operand sets `op` is linear in (none if it is not linear)."""
    sets = LINEAR.get(op.name)
    return sets(op) if sets is not None and len(op.results) == 1 else ()


def _register_elementwise() -> None:
    from dialects.stablehlo_ext import StableHLO

    for op_class in StableHLO.operations:
        if op_class.has_trait(Elementwise) and op_class.name not in RULES:
            RULES[op_class.name] = elementwise_rule
    RULES[CompareOp.name] = elementwise_rule


_register_elementwise()


def rule_for(op: Operation) -> OpRule | None:
    """The op's factor rule, or None if it is opaque (see `opaque_reason`).

    Memoised by signature (`_RULES_BY_SIGNATURE`): a stack of N layers has the same few
    hundred signatures whatever N, and every rewrite makes new ops."""
    builder = RULES.get(op.name)
    if builder is None or (type(op) is ShardingConstraintOp and op.is_reshard):
        return None
    operand_types = [v.type for v in op.operands]
    result_types = [r.type for r in op.results]
    body: tuple[object, ...] = ()
    if op.regions or (type(op) is shlo.ConstantOp and not _is_splat(op.value)):
        # the rule reads a body or an init; a literal array (which may be
        # large) is not kept by the memo: it has no rule
        if not _all_tensors(operand_types, result_types):
            return None
        if type(op) is not ReduceOp or len(op.inputs) != 1:
            return builder(op)
        # what `reduce_rule` reads of its body and init (a stack's
        # reductions are a few signatures)
        body = (combiner_name(op.body), _is_zero_constant(op.init_values[0]))
    properties = tuple(op.properties.items())
    key = (
        op.name,
        builder,  # a rule registered anew (or patched) is not answered by the old one's memo
        len(operand_types),
        *map(id, operand_types),
        *map(id, result_types),
        *[(name, id(value)) for name, value in properties],
        *body,
    )
    found = _RULES_BY_SIGNATURE.get(key)
    if found is None:
        if len(_RULES_BY_SIGNATURE) >= _MAX_SIGNATURES:  # a long-lived process: stay bounded
            _RULES_BY_SIGNATURE.clear()
        # the entry holds the types and properties it names by identity, so
        # that no other object takes their ids while it is kept; a signature
        # with a value that is not a tensor has no rule
        rule = builder(op) if _all_tensors(operand_types, result_types) else None
        found = _RULES_BY_SIGNATURE[key] = (rule, operand_types, result_types, properties)
    return found[0]


def _is_splat(value: Attribute) -> bool:
    """A constant of one value repeated: its rule is its type's (memoised;
    a stack's thousands of constants are a few dozen attributes, so each
    splat is decoded once: by identity, an attribute's hash hashes its
    data). A literal array is not kept (it may be large; it has no rule)."""
    if id(value) in _SPLATS and _SPLATS[id(value)] is value:
        return True
    splat = isinstance(value, DenseIntOrFPElementsAttr) and value.is_splat()
    if splat:
        if len(_SPLATS) >= _MAX_SIGNATURES:  # a long-lived process: stay bounded
            _SPLATS.clear()
        _SPLATS[id(value)] = value  # held (as its rule's memo holds it): its id stays its own
    return splat


_SPLATS: dict[int, Attribute] = {}


def _all_tensors(operand_types: list[Attribute], result_types: list[Attribute]) -> bool:
    return all(isinstance(t, TensorType) for t in (*result_types, *operand_types))


_RULES_BY_SIGNATURE: dict[tuple[object, ...], tuple[OpRule | None, object, object, object]] = {}
"""A region-free op's rule by its signature: its name, its operand and
result types and its properties (no builder reads anything else), each by
identity, and the builder itself; a one-input reduce's with its combiner and whether its init is
zero (all `reduce_rule` reads of its body and init). The importer and
`part_type` share equal types, so identity finds them (hashing the types'
structure cost a third of reading the graph)."""
_MAX_SIGNATURES = 1 << 14
"""Far more than one program's distinct signatures (the 6-layer step has 114)."""


def opaque_reason(op: Operation) -> str:
    """Why propagation stops at `op`: the registry's one-line reason."""
    name = op_name(op)
    if name in OPAQUE_REASONS:
        return OPAQUE_REASONS[name]
    if name == "stablehlo.constant":
        return OPAQUE_REASONS["stablehlo.constant(non-splat)"]
    if isinstance(op, ShardingConstraintOp) and op.is_reshard:
        return OPAQUE_REASONS["sdy.sharding_constraint(reshard)"]
    if name == "stablehlo.scatter":
        return OPAQUE_REASONS["stablehlo.scatter(multi-input)"]
    if name == "stablehlo.reduce_window":
        return OPAQUE_REASONS["stablehlo.reduce_window(multi-input)"]
    if name == "stablehlo.bitcast_convert":
        return OPAQUE_REASONS["stablehlo.bitcast_convert(rank-changing)"]
    if name in RULES:
        return "an operand or result is not a ranked tensor"
    return f"{name} has no tiling rule in partir's registry"
