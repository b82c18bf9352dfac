"""Padding for divisibility: tile a dimension the mesh axis does not divide.

Tiling dim `d` of `x` (size n) over an axis of k devices needs k | n. When it
does not, as Shardy's pad-for-divisibility does, the dimension is padded to
P, the next multiple of k, *everywhere it flows*: the values whose dims run
over the same factor (the registry's rules, as tiling follows them) form one
component, and every op in it is rebuilt on the padded shapes (its rule's
`localize` resizes the sizes its properties hold). The loops then tile P
evenly and nothing downstream changes. The padding never reaches a result:

- a *sum* factor (dot_general's contraction, an add-`reduce`, a gradient's
  scatter-add) sums zeros there: each operand is masked
  (`select(iota < n, x, 0)`), so sums, and means (which divide by the
  program's own constant n), see only the true elements;
- wherever the component meets an op that cannot run over padding (a
  blocked factor: a max/min-`reduce`, a sort, a reverse, a cut, a window, an
  iota's counting dim, a gather's indexed dim; an op without a rule; the
  function's return) the value is sliced back to n first, so that op sees
  exactly the original value. Max/min, softmax's max and the results get the
  true elements by construction.
- a value entering the component from outside it (an argument, a constant,
  an iota) is padded with zeros; padded elements of a gather's indices are 0,
  a valid row whose result is dropped or masked like any padding.

The pads the rewrite inserts carry `PADDED` (the multiple), so a second
action on a value already padded reuses its pad. The IR shows all of it: the
pads, the masks and the slices back are ordinary StableHLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects.builtin import (
    ComplexType,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, OpResult, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.dialects.stablehlo.attributes import ComparisonDirection

from dialects.carried import carried_feeds, carried_index, carried_places, fed_index
from dialects.dtypes import tensor_type
from dialects.locations import give_location
from dialects.stablehlo_ext import CompareOp, PadOp, SliceOp
from rewrites.registry import FactorKind, OpRule, rule_for

PADDED = "partir.padded"
"""On a pad this rewrite inserted: the multiple it pads its dims to."""


def padded_size(size: int, parts: int) -> int:
    """The next multiple of `parts` from `size`."""
    return -(-size // parts) * parts


@dataclass
class _Component:
    """The (value, dim) pairs that run over one factor of size `n`, and the ops
    rebuilt on it (with the factors of theirs that run over it)."""

    n: int
    padded: int
    dims: dict[SSAValue, set[int]] = field(default_factory=dict)
    shapes: dict[SSAValue, tuple[int, ...]] = field(default_factory=dict)
    """Each value's shape before padding."""
    factors: dict[Operation, set[int]] = field(default_factory=dict)
    carried: dict[Operation, dict[int, set[int]]] = field(default_factory=dict)
    """Carrier (a while, a barrier, a conditional) -> carried value -> dims:
    every place of a carried value is padded alike (`dialects.carried`)."""
    rules: dict[Operation, OpRule | None] = field(default_factory=dict)

    def rule(self, op: Operation) -> OpRule | None:
        if op not in self.rules:
            self.rules[op] = rule_for(op)
        return self.rules[op]

    def safe_factor(self, op: Operation, factors: tuple[int, ...]) -> int | None:
        """The factor a dim over `factors` runs over in `op`, if `op` can run
        over it padded: the dim's only or major factor, of size n, parallel
        (the padding passes through) or a sum (masked); no halo, no stride,
        and never a minor part of a reshape. (An `unplaced` factor is fine:
        padding resizes the op's own dims, whatever loops enclose it.)"""
        rule = self.rule(op)
        if rule is None or not factors:
            return None
        f = factors[0]
        factor = rule.factors[f]
        if (
            factor.kind is FactorKind.BLOCKED
            or factor.size != self.n
            or any(factor.halo)
            or factor.stride != 1
        ):
            return None
        for dims in (*rule.operands, *rule.results):
            if any(f in fs[1:] for fs in dims):
                return None
        if factor.kind is FactorKind.PARALLEL and rule.result_dim(f) is None:
            return None
        return f

    def grow(self, value: SSAValue, dim: int) -> None:
        """Add `value`'s `dim` and everything that must be padded with it."""
        todo = [(value, dim)]
        while todo:
            v, d = todo.pop()
            seen = self.dims.setdefault(v, set())
            if d in seen:
                continue
            seen.add(d)
            self.shapes.setdefault(v, _shape(v))
            if (place := carried_index(v)) is not None:
                self._carry(*place, d, todo)
            owner = v.owner
            if isinstance(owner, Operation) and (rule := self.rule(owner)) is not None:
                assert isinstance(v, OpResult)
                f = self.safe_factor(owner, rule.results[v.index][d])
                if f is not None:
                    self._join(owner, f, todo)
            for use in v.uses:
                user = use.operation
                if (fed := fed_index(user, use.index)) is not None:
                    self._carry(*fed, d, todo)
                elif (rule := self.rule(user)) is not None:
                    f = self.safe_factor(user, rule.operands[use.index][d])
                    if f is not None:
                        self._join(user, f, todo)

    def _join(self, op: Operation, f: int, todo: list[tuple[SSAValue, int]]) -> None:
        joined = self.factors.setdefault(op, set())
        if f in joined:
            return
        joined.add(f)
        rule = self.rule(op)
        assert rule is not None
        for operand, dims in zip(op.operands, rule.operands, strict=True):
            todo += [(operand, d) for d, fs in enumerate(dims) if fs and fs[0] == f]
        for result, dims in zip(op.results, rule.results, strict=True):  # all alike
            todo += [(result, d) for d, fs in enumerate(dims) if fs and fs[0] == f]

    def _carry(self, carrier: Operation, k: int, d: int, todo: list[tuple[SSAValue, int]]) -> None:
        dims = self.carried.setdefault(carrier, {}).setdefault(k, set())
        if d in dims:
            return
        dims.add(d)
        todo += [(place, d) for place in carried_places(carrier, k)]
        todo += [(op.operands[i], d) for op, i in carried_feeds(carrier, k)]

    def accepted(self, op: Operation, index: int) -> frozenset[int]:
        """The dims of `op`'s operand `index` that the rebuilt op reads padded."""
        if (fed := fed_index(op, index)) is not None:
            carrier, k = fed
            return frozenset(self.carried.get(carrier, {}).get(k, ()))
        joined = self.factors.get(op)
        rule = self.rule(op)
        if not joined or rule is None:
            return frozenset()
        return frozenset(d for d, fs in enumerate(rule.operands[index]) if fs and fs[0] in joined)

    def produced(self, value: SSAValue) -> frozenset[int]:
        """The dims of `value` its rebuilt producer makes padded."""
        owner = value.owner
        joined = self.factors.get(owner) if isinstance(owner, Operation) else None
        rule = self.rule(owner) if isinstance(owner, Operation) else None
        if not joined or rule is None:
            return frozenset()
        assert isinstance(value, OpResult)
        dims = rule.results[value.index]
        return frozenset(d for d, fs in enumerate(dims) if fs and fs[0] in joined)


class _Rebuild:
    """Rebuild a component's ops on padded shapes, in program order."""

    def __init__(self, component: _Component, parts: int) -> None:
        self.c = component
        self.parts = parts
        self.base: dict[SSAValue, tuple[SSAValue, frozenset[int]]] = {}
        """Old value -> (its rebuilt value, the dims padded in it)."""
        self.adapted: dict[tuple[SSAValue, frozenset[int]], SSAValue] = {}
        self.masks: dict[tuple[SSAValue, int], SSAValue] = {}

    def resize(self, size: int) -> int:
        return size // self.c.n * self.c.padded

    def run(self, ops: list[Operation]) -> None:
        self._pad_carried()
        for op in ops:
            if op in self.c.factors:
                self._rebuild(op)
            else:
                for use_index, operand in enumerate(op.operands):
                    if operand in self.c.dims:
                        dims = self.c.accepted(op, use_index)
                        op.operands[use_index] = self.value_for(operand, dims)
        for op in reversed(ops):
            if op in self.c.factors:
                Rewriter.erase_op(op)

    def _pad_carried(self) -> None:
        """Give every place of a carried value its padded type (a new value
        taking the place's uses, which the pass then adapts like any other)."""
        for carrier, values in self.c.carried.items():
            for k, dims in values.items():
                for place in carried_places(carrier, k):
                    shape = self.c.shapes.pop(place)
                    self.c.dims.pop(place)
                    padded = [self.resize(n) if d in dims else n for d, n in enumerate(shape)]
                    ty = place.type
                    assert isinstance(ty, TensorType)
                    new = Rewriter.replace_value_with_new_type(
                        place, tensor_type(ty.element_type, padded)
                    )
                    self.c.shapes[new] = tuple(shape)
                    self.c.dims[new] = set(dims)
                    self.base[new] = (new, frozenset(dims))

    def value_for(self, old: SSAValue, dims: frozenset[int]) -> SSAValue:
        """`old` with exactly `dims` padded (slicing back or padding what its
        rebuilt value has otherwise), made once, right after its definition."""
        value, has = self.base.get(old, (old, frozenset()))
        if has == dims:
            return value
        key = (old, dims)
        if key not in self.adapted:
            shape = list(self.c.shapes.get(old) or _shape(old))
            ops: list[Operation] = []
            if has - dims:
                sliced = _slice_to(
                    value, [shape[d] if d in has - dims else -1 for d in range(len(shape))]
                )
                ops.append(sliced)
                value = sliced.results[0]
            if dims - has:
                pad, zero = _pad(
                    value, {d: self.resize(shape[d]) - shape[d] for d in dims - has}, self.parts
                )
                ops += [zero, pad]
                value = pad.results[0]
            _insert_after_definition(self.base.get(old, (old, frozenset()))[0], ops)
            self.adapted[key] = value
        return self.adapted[key]

    def _rebuild(self, op: Operation) -> None:
        rule = self.c.rule(op)
        assert rule is not None
        joined = self.c.factors[op]
        operands: list[SSAValue] = []
        for i, operand in enumerate(op.operands):
            dims = self.c.accepted(op, i)
            value = self.value_for(operand, dims) if operand in self.c.dims else operand
            for f in joined:
                if rule.factors[f].kind is FactorKind.SUM:
                    for d, fs in enumerate(rule.operands[i]):
                        if fs and fs[0] == f:
                            value = self._masked(value, d)
            operands.append(value)
        result_types = []
        for result in op.results:
            produced = self.c.produced(result)
            ty = result.type
            assert isinstance(ty, TensorType)
            shape = [self.resize(n) if d in produced else n for d, n in enumerate(ty.get_shape())]
            result_types.append(tensor_type(ty.element_type, shape))
        properties = _resized_properties(op, rule, joined, self.resize)
        new = type(op).create(
            operands=operands,
            result_types=result_types,
            properties=properties,
            attributes=dict(op.attributes),
            location=op.location,
            regions=[region.clone() for region in op.regions],
        )
        Rewriter.insert_op(new, InsertPoint.before(op))
        for result, made in zip(op.results, new.results, strict=True):
            if result in self.c.dims:
                self.base[result] = (made, self.c.produced(result))
            else:  # a sum factor only: the result keeps its shape
                result.replace_all_uses_with(made)

    def _masked(self, value: SSAValue, dim: int) -> SSAValue:
        """`value` with zeros past the true size along `dim` (a sum's operand),
        made once, right after `value`'s definition."""
        key = (value, dim)
        if key not in self.masks:
            ty = value.type
            assert isinstance(ty, TensorType)
            shape = list(ty.get_shape())
            line = tensor_type(i32, [shape[dim]])
            iota = shlo.IotaOp(
                result_types=[line], properties={"iota_dimension": IntegerAttr(0, i64)}
            )
            bound = splat(line, shape[dim] // self.c.padded * self.c.n)  # its true size
            inside = CompareOp(iota.results[0], bound.results[0], ComparisonDirection.LT)
            pred = shlo.BroadcastInDimOp(
                operands=[inside.results[0]],
                result_types=[tensor_type(IntegerType(1), shape)],
                properties={"broadcast_dimensions": DenseArrayBase.from_list(i64, [dim])},
            )
            zeros = splat(ty, 0)
            select = shlo.SelectOp(
                operands=[pred.results[0], value, zeros.results[0]], result_types=[ty]
            )
            _insert_after_definition(value, [iota, bound, inside, pred, zeros, select])
            self.masks[key] = select.results[0]
        return self.masks[key]


def _resized_properties(
    op: Operation, rule: OpRule, factors: Any, resize: Any
) -> dict[str, Attribute]:
    """`op`'s properties with each factor's dims resized in turn. Each
    localizer reads the properties the factors before it resized (a slice
    padded on two dims keeps both limits) and `op`'s own operand sizes."""
    properties = dict(op.properties)
    if rule.localize is None:
        return properties
    original, op.properties = op.properties, properties
    try:
        for f in factors:
            properties.update(rule.localize(op, rule, f, resize))
    finally:
        op.properties = original
    return properties


def _shape(value: SSAValue) -> tuple[int, ...]:
    ty = value.type
    assert isinstance(ty, TensorType)
    return tuple(ty.get_shape())


def fill_value(element_type: Attribute) -> float:
    """What padding holds before anything reads it: zero. Nothing may depend on
    it (the tests fill with NaN to prove that)."""
    return 0


def splat(ty: TensorType, scalar: float) -> shlo.ConstantOp:
    """A `ty` constant holding `scalar` everywhere."""
    count = math.prod(ty.get_shape())
    value: Any = (scalar, scalar) if isinstance(ty.element_type, ComplexType) else scalar
    typed: Any = ty  # any element type: xDSL's signature lists them one by one
    return shlo.ConstantOp(DenseIntOrFPElementsAttr.from_list(typed, [value] * count))


def _pad(value: SSAValue, high: dict[int, int], parts: int) -> tuple[PadOp, shlo.ConstantOp]:
    """`value` padded with zeros at the end of the dims in `high`."""
    ty = value.type
    assert isinstance(ty, TensorType)
    shape = list(ty.get_shape())
    rank = len(shape)
    zero = splat(tensor_type(ty.element_type, []), fill_value(ty.element_type))
    highs = [high.get(d, 0) for d in range(rank)]
    pad = PadOp.create(
        operands=[value, zero.results[0]],
        result_types=[
            tensor_type(ty.element_type, [n + h for n, h in zip(shape, highs, strict=True)])
        ],
        properties={
            "edge_padding_low": DenseArrayBase.from_list(i64, [0] * rank),
            "edge_padding_high": DenseArrayBase.from_list(i64, highs),
            "interior_padding": DenseArrayBase.from_list(i64, [0] * rank),
        },
        attributes={PADDED: IntegerAttr(parts, i64)},
    )
    return pad, zero


def _slice_to(value: SSAValue, limits: list[int]) -> SliceOp:
    """`value[:limit]` along each dim whose limit is not -1."""
    shape = _shape(value)
    bounds = [n if limit < 0 else limit for n, limit in zip(shape, limits, strict=True)]
    ty = value.type
    assert isinstance(ty, TensorType)
    return SliceOp.create(
        operands=[value],
        result_types=[tensor_type(ty.element_type, bounds)],
        properties={
            "start_indices": DenseArrayBase.from_list(i64, [0] * len(shape)),
            "limit_indices": DenseArrayBase.from_list(i64, bounds),
            "strides": DenseArrayBase.from_list(i64, [1] * len(shape)),
        },
    )


def _insert_after_definition(value: SSAValue, ops: list[Operation]) -> None:
    """`ops` (a pad, mask or cut of `value`) right after `value`'s definition,
    where the user's code made it (its location)."""
    if not ops:
        return
    owner = value.owner
    if isinstance(owner, Block):
        first = owner.first_op
        assert first is not None
        Rewriter.insert_op(ops, InsertPoint.before(first))
    else:
        give_location(ops, owner.location)
        Rewriter.insert_op(ops, InsertPoint.after(owner))


def existing_pad(value: SSAValue, dim: int, parts: int) -> SSAValue | None:
    """The pad this rewrite already made of `value` along `dim` to a multiple
    of `parts` (an earlier action padded its component), if any."""
    for use in value.uses:
        op = use.operation
        if isinstance(op, PadOp) and PADDED in op.attributes:
            padded = _shape(op.result)[dim]
            if padded > _shape(value)[dim] and padded % parts == 0:
                return op.result
    return None


@dataclass(frozen=True)
class Padding:
    """What padding one component did: `value` padded from `n` to `padded`
    along its dim, the ops rebuilt on padded shapes (by name) and the sum
    operands masked."""

    value: SSAValue
    n: int
    padded: int
    rebuilt: tuple[str, ...] = ()
    masked: int = 0


def pad_for_divisibility(value: SSAValue, dim: int, parts: int, scope: Operation) -> Padding:
    """Pad `value`'s `dim`, and the component it runs over in `scope`, to a
    multiple of `parts`; returns `value` padded (to tile in its place)."""
    n = _shape(value)[dim]
    found = existing_pad(value, dim, parts)
    if found is not None:
        return Padding(found, n, _shape(found)[dim])
    component = _Component(n, padded_size(n, parts))
    component.grow(value, dim)
    rebuild = _Rebuild(component, parts)
    rebuild.run([op for op in scope.walk() if op is not scope])
    padded = rebuild.value_for(value, frozenset(component.dims[value]))
    rebuilt = tuple(op.name for op in component.factors)
    return Padding(padded, n, component.padded, rebuilt, len(rebuild.masks))
