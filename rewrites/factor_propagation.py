"""Propagation decided in plain data: every value's sharding as a fixpoint.

Shardy's design ("decide first, build once"), for partir's tactics: instead
of rewriting the program once per decision (`rewrites.propagation`), a
worklist over the use-def graph decides, for every SSA value, the mesh axes
that split each of its dims and the axes it is a partial sum over
(`Distribution`), and for every op the axes that split each factor of its
rule. Nothing here builds IR: the graph is read once into integer tables and
the loop runs on ints: mesh axes are numbered (a set of axes is a bit mask),
and a decision is a few flat lists indexed by value or op id and axis
(`Decision`), read against the registry's `OpRule`s.

The decisions follow the rewrite engine's (`rewrites.propagation`):

- **seeds** are the tactics' tile actions, tactic by tactic (each tactic's
  fixpoint before the next tactic's seeds: an earlier decision is never
  overridden); within a tactic, an earlier action's axis wins. A seed on a
  value that already has the axis on another dim is a conflict, as
  `apply_tile_action` records it.
- **forward**: an op with an operand *produced* split over axis `a` (its
  producer has `a` on a parallel factor, or a seed put it there) takes `a`
  on the factor that operand's dim runs over, when the rule lets it split
  (`OpRule.why_not_tileable` on the factor's size left by the axes it has).
  Of several such operands the earliest action wins; one on another factor
  is a conflict naming both actions (`PushForward._record_conflicts`). A
  parallel factor splits the result's dim; a sum factor makes the result a
  partial sum over `a`, which its users read whole (a `sum` loop's result).
- **sideways**: an op's operands are read split like the factor (the slices
  of `slice_operands`): their *wanted* sharding, which splits no value.
- **backward**: a value every use wants split over `a` on one dim (a seed
  counts as such a use) is made split by its producer, when its rule lets it
  (`PullSliceIntoProducer`).
- **carried values** (`stablehlo.while`, `case`/`if`, `optimization_barrier`,
  `rewrites.control_flow`): a carried value takes an axis from the operand
  or the value a body or branch returns, or from its result when every use
  wants it alike; then every place of it (body and condition argument,
  result) has it, and the carrier's own use of the operand wants it. The
  worklist re-visits the carrier until no place changes (a fixpoint on the
  carry).
- **uneven dims**: a seed on a dim its axis does not divide pads it
  (`rewrites.padding`); the factors such a split flows through are split
  over their padded size. `rewrites.buildable` pads the first tactic's such
  dims in the module, so that deciding again splits only even sizes, which
  `rewrites.build_core` builds.
- **order**: the worklist is a stack filled in program order, so a change is
  followed through its users before the next op (the engine's walker visits
  so, and which of two conflicting splits reaches an op first decides it).
  An op made split for its users, or fused into its only user's loop, runs
  in their loops (`Decision.inside`): a later split over one of those axes
  passes it by, as the engine's `busy` axes do.

An op of several results (an argmax's reduce, a sort, `top_k`) splits all
of them alike; it is split for its users only when every use of every
result wants the same split (`_Propagation._demands`).

An argmax or top_k reading an operand split along the dim it picks along
is kept whole here, and its results decided as the engine's; the engine
computes it regrouped (`OpRule.regroupable`): `rewrites.buildable`
rewrites the module so (and gives a split op of several used results a
copy per result, the engine's loop per result), decides again, and
`rewrites.build_core` builds it.

Not yet the engine's (`tests/test_factor_propagation.py` states which):
conflicting splits inside attention under `ManualPartition` (2-4 ops of
~800-1,800, fused in an order this does not replay); ZeRO-3 after Megatron
on the same parameters; Megatron over a hidden size its axis does not divide
(where the engine's padded component ends).

`Decision.distribution(value)` is a value's decided sharding;
`Decision.argument_distribution` what an argument arrives as (the split
every use of it agrees on, as `lowering.to_spmd.input_dist` reads it off
the core IR); `Decision.factors_of`, `split_of`, `nesting_of`,
`priorities_of` ... give its tables by axis name.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Block, Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects.carried import BRANCHING_OPS, enclosing_carrier
from dialects.distribution import Distribution
from dialects.dtypes import tensor_bytes
from dialects.functions import entry_function
from dialects.partir import OriginAttr
from rewrites.actions import describe_value
from rewrites.conflicts import Conflict, ConflictLog, cheaper_exchange, describe_origin
from rewrites.registry import FactorKind, OpRule, rule_for

_COMPUTE, _WHILE, _BRANCH, _BARRIER, _RETURN, _OTHER = range(6)

Priority = tuple[int, OriginAttr | None]
"""(schedule position of the action behind a decision, its origin)."""

_LAST = 1 << 30


class _Candidate(NamedTuple):
    """A split an op could take: over axis number `axis`, of `factor`, because operand
    `operand` is split on `dim` (forward) or, with `operand` one past the
    last, because every use wants its result split on `dim` (backward)."""

    order: int
    operand: int
    axis: int
    factor: int
    dim: int
    priority: Priority
    padded: bool


@dataclass(frozen=True)
class Seed:
    """One tile action, as data: split `value`'s `dim` over `axis`."""

    value: SSAValue
    dim: int
    axis: str
    origin: OriginAttr
    label: str = ""


@dataclass
class _Graph:
    """The use-def graph as integer tables (built once per program)."""

    values: list[SSAValue] = field(default_factory=list)
    ids: dict[SSAValue, int] = field(default_factory=dict)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    producer: list[int] = field(default_factory=list)
    """Per value, the op id making it (-1: a block argument)."""
    result_index: list[int] = field(default_factory=list)
    uses: list[list[tuple[int, int]]] = field(default_factory=list)
    ops: list[Operation] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    rules: list[OpRule | None] = field(default_factory=list)
    operands: list[tuple[int, ...]] = field(default_factory=list)
    results: list[tuple[int, ...]] = field(default_factory=list)
    carrier_of_return: dict[int, int] = field(default_factory=dict)
    """A region's `stablehlo.return` op id -> the while or conditional it ends."""
    returns: list[int] = field(default_factory=list)
    """The ids of the ops that end a carrier's body or branch."""
    returned: set[int] = field(default_factory=set)
    """The values such an op returns."""
    carried_in: set[int] = field(default_factory=set)
    """The values a carrier (a while, a case, a barrier) reads."""
    places: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    """Carrier op id -> per carried value, the value ids it appears as."""
    feeds: dict[int, list[list[int]]] = field(default_factory=dict)
    """Carrier op id -> per carried value, the value ids feeding it."""

    known_shapes: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    """One tuple per shape, shared by the values of that shape."""
    shape_of_type: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """id(type) -> its shape: the importer shares equal types, and the
    module keeps them alive while its graph is read."""

    def value(self, value: SSAValue) -> int:
        found = self.ids.get(value)
        return found if found is not None else self._new(value)

    def _new(self, value: SSAValue, producer: int = -1, index: int = 0) -> int:
        """A new id for `value`, made by op `producer` as its result `index`."""
        n = self.ids[value] = len(self.values)
        self.values.append(value)
        ty = value.type
        shape = self.shape_of_type.get(id(ty))
        if shape is None:
            shape = tuple(ty.get_shape()) if isinstance(ty, TensorType) else ()
            shape = self.shape_of_type[id(ty)] = self.known_shapes.setdefault(shape, shape)
        self.shapes.append(shape)
        self.producer.append(producer)
        self.result_index.append(index)
        self.uses.append([])
        return n

    @staticmethod
    def of(block: Block) -> _Graph:
        graph = _Graph()
        for arg in block.args:
            graph._new(arg)
        graph._read(block)
        # read only from here: a tuple per value (48 bytes for one use, where
        # a list took 88), one shared for the unused
        graph.uses = [tuple(u) if u else () for u in graph.uses]  # type: ignore[misc]
        for carrier, places in graph.places.items():
            graph.feeds[carrier] = [graph._feeds(carrier, k) for k in range(len(places))]
        return graph

    def _read(self, block: Block) -> None:
        ids, uses = self.ids, self.uses
        for op in block.ops:
            o = len(self.ops)
            self.ops.append(op)
            read = []
            for i, value in enumerate(op.operands):
                v = ids.get(value)
                if v is None:  # defined nowhere the walk has been (not in a valid program)
                    v = self.value(value)
                uses[v].append((o, i))
                read.append(v)
            self.operands.append(tuple(read))
            kind, rule = self._kind(op)
            if kind == _RETURN:
                self.returns.append(o)
            elif kind in (_WHILE, _BRANCH, _BARRIER):
                self.carried_in.update(read)
            self.kinds.append(kind)
            self.rules.append(rule)
            self.results.append(())
            for region in op.regions:
                for inner in region.blocks:
                    for arg in inner.args:
                        self._new(arg)
                    self._read(inner)
            results = [self._new(r, o, k) for k, r in enumerate(op.results)]
            self.results[o] = tuple(results)
            if kind == _WHILE:
                assert isinstance(op, shlo.WhileOp)
                body, cond = op.body.block.args, op.cond.block.args
                self.places[o] = [
                    (self.ids[body[k]], self.ids[cond[k]], results[k]) for k in range(len(results))
                ]
            elif kind in (_BRANCH, _BARRIER):
                self.places[o] = [(v,) for v in results]
        return

    def _kind(self, op: Operation) -> tuple[int, OpRule | None]:
        kind = _CLASS_KINDS.get(type(op))
        if kind is None:
            kind = _CLASS_KINDS[type(op)] = _class_kind(type(op))
        if kind == _RETURN:
            return (_RETURN if enclosing_carrier(op) is not None else _OTHER), None
        if kind != _COMPUTE or not op.results:
            return (_OTHER if kind == _COMPUTE else kind), None
        rule = rule_for(op)
        return (_COMPUTE, rule) if rule is not None else (_OTHER, None)

    def used_result(self, o: int) -> int:
        """The index of op `o`'s only result with uses (0 for an op of one
        result, or of none used); -1 where several have uses."""
        results = self.results[o]
        if len(results) < 2:
            return 0
        used = [k for k, v in enumerate(results) if self.uses[v]]
        return used[0] if len(used) == 1 else -1 if used else 0

    def _feeds(self, carrier: int, k: int) -> list[int]:
        op = self.ops[carrier]
        found = []
        if not isinstance(op, BRANCHING_OPS):
            found.append(self.operands[carrier][k])
        if isinstance(op, shlo.WhileOp):
            regions = [op.body]
        elif isinstance(op, BRANCHING_OPS):
            regions = list(op.regions)
        else:
            regions = []
        for region in regions:
            returned = region.block.last_op
            assert returned is not None
            found.append(self.ids[returned.operands[k]])
        return found


def _class_kind(cls: type[Operation]) -> int:
    """What ops of class `cls` are to the graph (`_RETURN`: a region's
    return, which ends a carrier's body or nothing; `_COMPUTE`: one with
    results, which a rule may split)."""
    if issubclass(cls, shlo.WhileOp):
        return _WHILE
    if issubclass(cls, BRANCHING_OPS):
        return _BRANCH
    if issubclass(cls, shlo.OptimizationBarrierOp):
        return _BARRIER
    if issubclass(cls, shlo.ReturnOp):
        return _RETURN
    if issubclass(cls, func.ReturnOp):
        return _OTHER
    return _COMPUTE


_CLASS_KINDS: dict[type[Operation], int] = {}
"""`_class_kind` per op class met so far (isinstance against xDSL's ABC
classes cost more than the rest of reading an op)."""


class Decision:
    """What propagation decided, per value and per op (see the module doc).

    Flat, fixed-width records: the mesh's axes are numbered (`axes`, in the
    mesh's order; axis `a` is bit `1 << a` of a mask), and a value's or an
    op's record is `A = len(axes)` slots of a list, at `id * A + a` (the
    tables of ints are `array`s: 4 bytes a slot, not a pointer's 8). Small
    ints and shared tuples only: a decision costs a few pointers per value
    and op, where a dict per entry cost ~1.5 KB per op, and a visit reads
    and compares ints. The methods give the tables by axis name."""

    def __init__(self, graph: _Graph, mesh: dict[str, int]) -> None:
        n, m = len(graph.values), len(graph.ops)
        self.graph = graph
        self.mesh = mesh
        self.axes: tuple[str, ...] = tuple(mesh)
        self.axis_index: dict[str, int] = {axis: a for a, axis in enumerate(self.axes)}
        self.sizes: tuple[int, ...] = tuple(mesh.values())
        width = len(self.axes)
        self.value_dim = array("i", (-1,)) * (n * width)
        """Per value and axis (`v * A + a`), the dim the axis splits (-1:
        none): the value is produced split."""
        self.value_priority: list[Priority | None] = [None] * (n * width)
        """Per value and axis, the decision's priority."""
        self.value_axes: list[tuple[int, ...]] = [()] * n
        """Per value, the axes that split it in the order decided (a dim's
        axes, in this order, are its nesting, major first)."""
        self.value_mask = array("i", (0,)) * n
        self.op_factor = array("i", (-1,)) * (m * width)
        """Per op and axis (`o * A + a`), the factor of its rule split over
        the axis (-1: none)."""
        self.op_priority: list[Priority | None] = [None] * (m * width)
        self.op_arrival = array("i", (-1,)) * (m * width)
        """Per op and axis, the operand its split over the axis came through
        (the operand count: from its users). Where that operand's producer
        is in the loop already, the engine moves the op into it after its
        body (`rewrites.build_core` orders loop bodies so)."""
        self.op_axes: list[tuple[int, ...]] = [()] * m
        """Per op, the axes it splits in the order decided (a factor's axes,
        in this order, are major first)."""
        self.op_mask = array("i", (0,)) * m
        self.inside = array("i", (0,)) * m
        """Per op, the mask of the axes of the loops it runs in without
        splitting anything over them: an op made split for its users
        (backward) runs in their loops, once per part of theirs (the engine
        moves it into them), and a later split over one of those axes
        passes it by."""
        self.carried: dict[tuple[int, int], dict[int, int]] = {}
        """(carrier op id, carried value) -> axis -> the dim it splits."""
        self.carried_priority: dict[tuple[int, int], Priority] = {}
        """(carrier op id, axis) -> the decision's priority."""
        self.padded: set[tuple[int, int]] = set()
        """(value id, dim) pairs split over a padded size."""
        self.log = ConflictLog()

    @property
    def conflicts(self) -> list[Conflict]:
        return self.log.conflicts

    # --- by axis name -------------------------------------------------------------

    def split_of(self, v: int) -> dict[str, int]:
        """Value id `v`'s split axes -> the dim each splits, in the order decided."""
        width, dims, axes = len(self.axes), self.value_dim, self.axes
        return {axes[a]: dims[v * width + a] for a in self.value_axes[v]}

    def nesting_of(self, v: int) -> dict[int, tuple[str, ...]]:
        """Value id `v`'s split dims -> their axes, major first."""
        width, dims, axes = len(self.axes), self.value_dim, self.axes
        found: dict[int, tuple[str, ...]] = {}
        for a in self.value_axes[v]:
            d = dims[v * width + a]
            found[d] = (*found.get(d, ()), axes[a])
        return found

    def priorities_of(self, v: int) -> list[Priority]:
        """The priorities of the decisions that split value id `v`."""
        width, found = len(self.axes), self.value_priority
        return [p for a in self.value_axes[v] if (p := found[v * width + a]) is not None]

    def value_priority_of(self, v: int, axis: str) -> Priority | None:
        return self.value_priority[v * len(self.axes) + self.axis_index[axis]]

    def factors_of(self, o: int) -> dict[str, int]:
        """Op `o`'s split axes -> the factor each splits, in the order decided."""
        width, factors, axes = len(self.axes), self.op_factor, self.axes
        return {axes[a]: factors[o * width + a] for a in self.op_axes[o]}

    def factor_of(self, o: int, axis: str) -> int | None:
        f = self.op_factor[o * len(self.axes) + self.axis_index[axis]]
        return f if f >= 0 else None

    def factor_axes_of(self, o: int, factor: int) -> tuple[str, ...]:
        """The axes op `o` splits `factor` over, major first."""
        width, factors, axes = len(self.axes), self.op_factor, self.axes
        return tuple(axes[a] for a in self.op_axes[o] if factors[o * width + a] == factor)

    def priority_of(self, o: int, axis: str) -> Priority | None:
        """The priority of op `o`'s split over `axis` (None: it does not split over it)."""
        return self.op_priority[o * len(self.axes) + self.axis_index[axis]]

    def arrival_of(self, o: int, axis: str) -> int | None:
        found = self.op_arrival[o * len(self.axes) + self.axis_index[axis]]
        return found if found >= 0 else None

    def inside_of(self, o: int, axis: str) -> bool:
        """Whether op `o` runs in its users' loop over `axis` without splitting over it."""
        return bool(self.inside[o] >> self.axis_index[axis] & 1)

    def carried_priority_of(self, o: int, axis: str) -> Priority | None:
        return self.carried_priority.get((o, self.axis_index[axis]))

    # --- what others read ---------------------------------------------------------

    def distribution(self, value: SSAValue) -> Distribution:
        """The value's decided sharding: its split dims, and the axes it is a
        partial sum over (its producer split a sum factor over them)."""
        v = self.graph.ids[value]
        dims: list[tuple[str, ...]] = [()] * len(self.graph.shapes[v])
        width, axes = len(self.axes), self.axes
        for a in self.value_axes[v]:
            d = self.value_dim[v * width + a]
            dims[d] = (*dims[d], axes[a])
        partial: tuple[str, ...] = ()
        o = self.graph.producer[v]
        rule = self.graph.rules[o] if o >= 0 else None
        if rule is not None:
            factors = self.op_factor
            sums = [
                axes[a] for a in self.op_axes[o]
                if rule.factors[factors[o * width + a]].kind is FactorKind.SUM
            ]
            partial = tuple(sorted(sums))
        return Distribution(tuple(dims), partial)

    def part_type(self, value: SSAValue, dim: int, axis: str) -> TensorType:
        """`value`'s type split by the axes decided on `dim` before `axis`
        (rounded up: a padded part): the part a split over `axis` divides."""
        ty = value.type
        assert isinstance(ty, TensorType)
        shape = list(ty.get_shape())
        for earlier in self.nesting_of(self.graph.ids[value]).get(dim, ()):
            if earlier == axis:
                break
            shape[dim] = -(-shape[dim] // self.mesh[earlier])
        return TensorType(ty.element_type, shape)

    def use_priority(self, o: int, axis: str) -> Priority:
        """The priority of op `o`'s decision to read an operand split over `axis`."""
        return self._use_priority(o, self.axis_index[axis])

    def _use_priority(self, o: int, a: int) -> Priority:
        found = self.op_priority[o * len(self.axes) + a] or self.carried_priority.get((o, a))
        return found if found is not None else (_LAST, None)

    def wanted(self, o: int, index: int) -> dict[str, int]:
        """Axis -> dim: how op `o` reads its operand `index` (split by its factors)."""
        axes = self.axes
        return {axes[a]: d for a, d in self._want(o, index).items()}

    def _want(self, o: int, index: int) -> dict[int, int]:
        """`wanted` by axis number, in the order decided."""
        kind = self.graph.kinds[o]
        if kind == _COMPUTE:
            if not self.op_mask[o]:
                return {}
            rule = self.graph.rules[o]
            assert rule is not None
            majors = rule.operand_majors[index]
            base, factors = o * len(self.axes), self.op_factor
            return {a: majors[f] for a in self.op_axes[o] if (f := factors[base + a]) in majors}
        if kind in (_WHILE, _BARRIER):
            return self.carried.get((o, index), {})
        return {}

    def _want_dim(self, o: int, index: int, a: int) -> int:
        """The dim op `o` reads its operand `index` split on over axis `a` (-1: none)."""
        kind = self.graph.kinds[o]
        if kind == _COMPUTE:
            f = self.op_factor[o * len(self.axes) + a]
            if f < 0:
                return -1
            rule = self.graph.rules[o]
            assert rule is not None
            return rule.operand_majors[index].get(f, -1)
        if kind in (_WHILE, _BARRIER):
            return self.carried.get((o, index), {}).get(a, -1)
        return -1

    def argument_distribution(self, value: SSAValue) -> Distribution:
        """How an argument arrives: split as every use reads it (a split it
        is produced with counts for every use), major axes first."""
        v = self.graph.ids[value]
        rank = len(self.graph.shapes[v])
        own = self.distribution(value)
        reads = [self._read_as(o, i, own) for o, i in self.graph.uses[v]]
        if not reads:
            return Distribution.replicated(rank)
        dims = []
        for d in range(rank):
            common = reads[0].dims[d]
            for other in reads[1:]:
                n = 0
                while n < min(len(common), len(other.dims[d])) and common[n] == other.dims[d][n]:
                    n += 1
                common = common[:n]
            dims.append(common)
        return Distribution(tuple(self._even(v, dims)))

    def _even(self, v: int, dims: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """`dims` without the splits of a dim its axes do not divide: a value
        padded for divisibility arrives whole, and is padded on the devices."""
        shape = list(self.graph.shapes[v])
        out: list[tuple[str, ...]] = []
        for d, axes in enumerate(dims):
            kept: list[str] = []
            for axis in axes:
                if shape[d] % self.mesh[axis]:
                    break
                shape[d] //= self.mesh[axis]
                kept.append(axis)
            out.append(tuple(kept))
        return out

    def _read_as(self, o: int, index: int, own: Distribution) -> Distribution:
        want = self._want(o, index)
        dims = [list(axes) for axes in own.dims]
        width = len(self.axes)
        for a, d in sorted(
            want.items(), key=lambda item: (self.op_priority[o * width + item[0]] or (_LAST,))[0]
        ):
            axis = self.axes[a]
            if d < len(dims) and axis not in dims[d]:
                dims[d].append(axis)
        return Distribution(tuple(tuple(d) for d in dims))


class _Propagation:
    """The worklist fixpoint (one object per program; `run` per tactic)."""

    def __init__(self, graph: _Graph, mesh: dict[str, int]) -> None:
        m = len(graph.ops)
        self.d = Decision(graph, mesh)
        self.g = graph
        self.mesh = mesh
        self.width = len(mesh)
        self.every = (1 << self.width) - 1
        self.queued = [False] * m
        self.in_program = [kind != _OTHER for kind in graph.kinds]
        """Per op, whether `push_all` queues it (what an op of no kind reads does not matter)."""
        self.dirty = [False] * m
        """Whether something an op's decision reads changed since its last visit."""
        self.work: list[int] = []
        self.seeded: dict[int, dict[int, tuple[int, Priority]]] = {}
        """Value id -> axis -> (dim, priority) of the seeds on it."""
        self.live = 0
        """The axes seeded so far (every split comes from a seed): no other
        axis is worth looking for."""
        self.fuse_user: list[int] = [-2] * m
        """Per op, the only op reading its only result (-1: none such; -2: not known yet)."""
        self.grown: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}
        """(axes, axis) -> axes + (axis,): one tuple per order of axes, shared."""

    def _grow(self, axes: tuple[int, ...], a: int) -> tuple[int, ...]:
        found = self.grown.get((axes, a))
        if found is None:
            found = self.grown[axes, a] = (*axes, a)
        return found

    # --- the worklist -------------------------------------------------------------

    def push(self, o: int) -> None:
        """Something `o` reads changed: visit it (where it is queued already,
        when its turn comes)."""
        self.dirty[o] = True
        if not self.queued[o]:
            self.queued[o] = True
            self.work.append(o)

    def run(self) -> None:
        """Visit until nothing changes: a stack, so a change is followed
        through its users before the next op in program order (as the
        rewrite engine's walker does: an op later in the program sees what
        the ops before it decided)."""
        work, queued, dirty, kinds = self.work, self.queued, self.dirty, self.g.kinds
        carrier_of_return = self.g.carrier_of_return
        cursor = 0
        while True:
            if work:
                o = work.pop()
            else:  # the next op in program order something changed for
                try:
                    o = dirty.index(True, cursor)
                except ValueError:
                    return
                queued[cursor:o] = [False] * (o - cursor)  # passed by: nothing changed
                cursor = o + 1
            queued[o] = False
            if not dirty[o]:
                continue  # a visit would decide what the last one did
            dirty[o] = False
            kind = kinds[o]
            if kind == _COMPUTE:
                self.visit(o)
            elif kind == _RETURN:
                self.carry(carrier_of_return.get(o, -1))
            elif kind != _OTHER:
                self.carry(o)

    def push_all(self) -> None:
        """Queue every op, so that they come in program order (the engine's
        walker's order) under whatever is pushed; only those something
        changed for are visited. They are not on the stack: `run` takes the
        next one that is dirty when the stack is empty (the ops before it
        pass as a stack would pop them, clean)."""
        self.work.clear()
        self.queued = list(self.in_program)

    # --- seeds --------------------------------------------------------------------

    def seed(self, seed: Seed) -> None:
        d = self.d
        v = self.g.ids[seed.value]
        a = d.axis_index[seed.axis]
        current = d.value_dim[v * self.width + a]
        if current < 0:
            current = self._read_over(v, a)
        if current >= 0:
            if current != seed.dim:
                d.log.record(
                    Conflict(
                        op="tile action",
                        values=(seed.label or describe_value(seed.value),),
                        axis=seed.axis,
                        winner="the earlier tiling",
                        loser=describe_origin(seed.origin),
                        detail=f"already tiled on dim {current}, asked for dim {seed.dim}",
                    )
                )
            return
        priority: Priority = (seed.origin.action.data, seed.origin)
        size = self.g.shapes[v][seed.dim]  # the part the axes before on the dim leave
        for earlier in d.value_axes[v]:
            if d.value_dim[v * self.width + earlier] == seed.dim:
                size = -(-size // d.sizes[earlier])
        if size % d.sizes[a]:
            d.padded.add((v, seed.dim))
        self.seeded.setdefault(v, {})[a] = (seed.dim, priority)
        self.live |= 1 << a
        self.split_value(v, a, seed.dim, priority)

    def _read_over(self, v: int, a: int) -> int:
        """The dim some use of `v` already reads it split on over axis `a` (-1: none)."""
        for o, i in self.g.uses[v]:
            dim = self.d._want_dim(o, i, a)
            if dim >= 0:
                return dim
        return -1

    # --- changes ------------------------------------------------------------------

    def split_value(self, v: int, a: int, dim: int, priority: Priority) -> None:
        """`v` is produced split over axis `a` on `dim` (minor to its others)."""
        d = self.d
        k = v * self.width + a
        if d.value_dim[k] >= 0:
            return
        d.value_dim[k] = dim
        d.value_priority[k] = priority
        d.value_axes[v] = self._grow(d.value_axes[v], a)
        d.value_mask[v] |= 1 << a
        dirty, queued, work = self.dirty, self.queued, self.work
        for o, _ in self.g.uses[v]:  # self.push(o), inline: a split has many users
            dirty[o] = True
            if not queued[o]:
                queued[o] = True
                work.append(o)
        self._wake_producer(v)
        self._wake_carrier_of(v)

    def _wake_producer(self, v: int) -> None:
        o = self.g.producer[v]
        if o >= 0:
            self.push(o)

    def _wake_carrier_of(self, v: int) -> None:
        if v not in self.g.returned:
            return
        for o, _ in self.g.uses[v]:
            if self.g.kinds[o] == _RETURN:
                carrier = self.g.carrier_of_return.get(o)
                if carrier is not None:
                    self.push(carrier)

    def assign(
        self, o: int, a: int, factor: int, priority: Priority, padded: bool = False
    ) -> None:
        """Op `o` splits `factor` over axis `a`: its operands are read split
        alike (their producers may follow), its result is split or partial."""
        d, g = self.d, self.g
        rule = g.rules[o]
        assert rule is not None
        k = o * self.width + a
        d.op_factor[k] = factor
        d.op_priority[k] = priority
        d.op_axes[o] = self._grow(d.op_axes[o], a)
        d.op_mask[o] |= 1 << a
        operands, every_padded = g.operands[o], d.padded
        majors = rule.operand_majors
        if not padded and every_padded:
            padded = any(
                (operands[i], m[factor]) in every_padded
                for i, m in enumerate(majors) if factor in m
            )
        producer, carried_in = g.producer, g.carried_in
        for i, m in enumerate(majors):
            dim = m.get(factor)
            if dim is None:
                continue
            v = operands[i]
            if padded:
                every_padded.add((v, dim))
            p = producer[v]
            if p >= 0:
                self.push(p)
            if v in carried_in:
                for user, _ in g.uses[v]:  # another user may now be the last to agree
                    if g.kinds[user] in (_WHILE, _BRANCH, _BARRIER):
                        self.push(user)
        if rule.factors[factor].kind is not FactorKind.PARALLEL:
            return
        for r, v in enumerate(g.results[o]):  # an op of several results splits them all
            rdim = rule.result_dim(factor, r)
            if rdim is not None:
                if padded:
                    d.padded.add((v, rdim))
                self.split_value(v, a, rdim, priority)

    # --- one op -------------------------------------------------------------------

    def tileable(self, o: int, rule: OpRule, factor: int, a: int, padded: bool) -> bool:
        if not rule.splittable[factor]:
            return False
        f = rule.factors[factor]
        d = self.d
        parts = d.sizes[a]
        size = f.size
        base, factors = o * self.width, d.op_factor
        for b in d.op_axes[o]:
            if factors[base + b] == factor:
                size = -(-size // d.sizes[b])
        if size % parts and not padded:
            return False
        return max(f.halo) <= size * f.stride // parts

    def visit(self, o: int) -> None:
        g, d = self.g, self.d
        if self._idle(o):
            return
        rule = g.rules[o]
        assert rule is not None
        if d.op_mask[o]:
            self._fuse(o)
        free = self.live & ~(d.op_mask[o] | d.inside[o])
        if not free:
            return  # every axis is taken: nothing to decide
        width = self.width
        value_dim, value_mask, value_priority = d.value_dim, d.value_mask, d.value_priority
        candidates: list[_Candidate] = []
        backward = len(g.operands[o])
        # forward: operands produced split
        for i, v in enumerate(g.operands[o]):
            if not value_mask[v] & free:
                continue
            dims = rule.operands[i]
            base = v * width
            for a in d.value_axes[v]:
                if not free >> a & 1:
                    continue
                dim = value_dim[base + a]
                fs = dims[dim] if dim < len(dims) else ()
                if not fs:
                    continue
                factor = fs[0]
                padded = (v, dim) in d.padded
                if not self.tileable(o, rule, factor, a, padded):
                    continue
                priority = value_priority[base + a]
                assert priority is not None
                candidates.append(_Candidate(priority[0], i, a, factor, dim, priority, padded))
        # backward: the result every use wants split alike
        for a, r, dim, factor, priority in self._demands(o, rule, free):
            padded = (r, dim) in d.padded
            if not self.tileable(o, rule, factor, a, padded):
                continue
            candidates.append(_Candidate(priority[0], backward, a, factor, dim, priority, padded))
        if not candidates:
            return
        padded_before = len(d.padded)
        why: dict[int, str] = {}
        if len(candidates) > 1:
            candidates.sort(key=lambda c: (c.order, c.operand))
            why = self._exchanges(o, rule, candidates, backward)
        chosen: dict[int, _Candidate] = {}
        factors, base = d.op_factor, o * width
        for c in candidates:
            if factors[base + c.axis] >= 0:
                won = chosen.get(c.axis)
                if (
                    won is not None
                    and won.factor != c.factor
                    and max(won.operand, c.operand) < backward
                ):
                    self._conflict(o, won, c, why.get(c.axis, ""))
                continue
            if chosen and not self.tileable(o, rule, c.factor, c.axis, c.padded):
                continue  # an axis taken in this visit left the factor too small
            chosen[c.axis] = c
            if c.operand == backward:  # it runs in its users' loops
                self._inherit(o)
            d.op_arrival[base + c.axis] = c.operand
            self.assign(o, c.axis, c.factor, c.priority, c.padded)
        if chosen and self.work and self.work[-1] == o and len(d.padded) == padded_before:
            # Its results' splits queued `o` again, next: that visit would
            # find every candidate of this one taken or still not tileable
            # (nothing it reads changed but its own decisions, and no
            # padding: a factor's part only shrinks exactly), so only its
            # fusion into its user is left to do.
            self.work.pop()
            self.queued[o] = self.dirty[o] = False
            self._fuse(o)

    def _exchanges(
        self, o: int, rule: OpRule, candidates: list[_Candidate], backward: int
    ) -> dict[int, str]:
        """Operands split over one axis along different factors: the earlier
        action's is followed unless a later one costs fewer bytes to
        reconcile (`cheaper_exchange`, as the rewrite engine chooses); that
        one is moved first in `candidates` (in place). Axis -> why."""
        why: dict[int, str] = {}
        rivals: dict[int, list[_Candidate]] = {}
        d = self.d
        base, factors = o * self.width, d.op_factor
        for c in candidates:
            if c.operand < backward and factors[base + c.axis] < 0:
                rivals.setdefault(c.axis, []).append(c)
        for a, found in rivals.items():
            if len(found) < 2 or len({c.factor for c in found}) < 2:
                continue
            tiled = [(c.operand, c.factor) for c in found]
            # the op's part: the axes decided before this one
            before = {b: factors[base + b] for b in d.op_axes[o]}
            for c in candidates[: candidates.index(found[0])]:
                before.setdefault(c.axis, c.factor)
            k, why[a] = cheaper_exchange(
                rule, self.g.ops[o], tiled, d.sizes[a], self._part_bytes(o, rule, before)
            )
            if k:
                candidates.remove(found[k])
                candidates.insert(candidates.index(found[0]), found[k])
        return why

    def _part_bytes(self, o: int, rule: OpRule, split: dict[int, int]) -> list[int]:
        """Op `o`'s operands' then results' bytes on one device when it
        splits factors as `split` says (axis -> factor)."""
        op = self.g.ops[o]
        out = []
        for k, value in enumerate((*op.operands, *op.results)):
            ty = value.type
            size = tensor_bytes(ty) if isinstance(ty, TensorType) else 0
            for a, f in split.items():
                dim = (
                    rule.operand_dims(f)[k] if k < len(op.operands)
                    else rule.result_dim(f) if k == len(op.operands) else None
                )
                if dim is not None:
                    size //= self.d.sizes[a]
            out.append(size)
        return out

    def _idle(self, o: int) -> bool:
        """Nothing to decide at `o` (most visits): it splits nothing, no
        operand is split, its results have no seed and their first users
        read nothing split."""
        d, g = self.d, self.g
        if d.op_mask[o]:
            return False
        value_mask = d.value_mask
        for v in g.operands[o]:
            if value_mask[v]:
                return False
        for r in g.results[o]:
            if r in self.seeded:
                return False
            uses = g.uses[r]
            if not uses:
                continue
            first = uses[0][0]
            if d.op_mask[first] or g.kinds[first] in (_WHILE, _BARRIER):
                return False
        return True

    def _demands(
        self, o: int, rule: OpRule, free: int
    ) -> list[tuple[int, int, int, int, Priority]]:
        """(axis, result, its dim, factor, priority): the splits over the
        `free` axes every use of a result wants alike. Of an op with several
        results, only the splits every used result wants, along one factor:
        the engine pulls slices into such an op only when all its results
        are only sliced (`PullSliceIntoProducer`)."""
        g = self.g
        found: list[tuple[int, int, int, int, Priority]] = []
        results = g.results[o]
        if len(results) == 1 and results[0] not in self.seeded:  # most visits: no demand
            uses = g.uses[results[0]]
            if not uses:
                return found
            first = uses[0][0]
            kind = g.kinds[first]
            if kind == _COMPUTE:
                if not self.d.op_mask[first] & free:
                    return found
            elif kind not in (_WHILE, _BARRIER):
                return found
        for k, r in enumerate(results):
            for a, dim, priority in self._demand(r, free):
                fs = rule.results[k][dim]
                if fs:
                    found.append((a, r, dim, fs[0], priority))
        if len(results) == 1 or not found:
            return found
        used = [r for r in results if g.uses[r]]
        agreed = []
        for a, r, dim, factor, priority in found:
            if all(
                any(b == a and f == factor and q == other for b, q, _, f, _ in found)
                for other in used
            ):
                agreed.append((a, r, dim, factor, priority))
        return agreed

    def _inherit(self, o: int) -> None:
        """`o`, made split for its users, runs in the loops they share."""
        d, g = self.d, self.g
        uses = [use for r in g.results[o] for use in g.uses[r]]
        if not uses:
            return
        common = -1
        for user, i in uses:
            wanted = 0
            for a in d._want(user, i):
                wanted |= 1 << a
            common &= (d.inside[user] | d.op_mask[user]) & ~wanted
        self._grow_inside(o, common)

    def _fuse(self, o: int) -> None:
        """`o`, split over an axis its only user reads it split over alike,
        runs in that user's loops (its loop is fused into the user's:
        `FuseSliceOfTile`, or the user joins it: `PushForward._join_loop`)."""
        d = self.d
        if not d.op_mask[o]:
            return
        user = self.fuse_user[o]
        if user == -2:
            user = self.fuse_user[o] = self._only_user(o)
        if user < 0:
            return
        loops = d.inside[user] | d.op_mask[user]
        if not loops & ~(d.op_mask[o] | d.inside[o]):
            return  # the user's loops are the op's already
        r = self.g.results[o][0]
        uses = self.g.uses[r]
        base, value_dim = r * self.width, d.value_dim
        for _, i in uses:
            want = d._want(user, i)
            if any(value_dim[base + a] == dim for a, dim in want.items()):
                wanted = 0
                for a in want:
                    wanted |= 1 << a
                self._grow_inside(o, loops & ~wanted)
                return

    def _only_user(self, o: int) -> int:
        """The one op reading op `o`'s one result (-1: none such)."""
        results = self.g.results[o]
        if len(results) != 1:
            return -1
        uses = self.g.uses[results[0]]
        if not uses:
            return -1
        user = uses[0][0]
        return user if all(u == user for u, _ in uses) else -1

    def _grow_inside(self, o: int, loops: int) -> None:
        d = self.d
        more = loops & self.every & ~(d.op_mask[o] | d.inside[o])
        if more:
            d.inside[o] |= more
            for v in self.g.operands[o]:
                self._wake_producer(v)

    def _demand(self, v: int, free: int) -> list[tuple[int, int, Priority]]:
        """(axis, dim, priority) every use of `v` reads it split by, over the `free` axes."""
        found: list[tuple[int, int, Priority]] = [
            (a, dim, priority)
            for a, (dim, priority) in self.seeded.get(v, {}).items()
            if free >> a & 1
        ]
        return found + self._agreed(v, free) if self.g.uses[v] else found

    def _agreed(self, v: int, free: int) -> list[tuple[int, int, Priority]]:
        """(axis, dim, priority) every use of `v` reads it split by, over the
        `free` axes; the priority is its first use's."""
        d, g = self.d, self.g
        uses = g.uses[v]
        if not uses:
            return []
        o0, i0 = uses[0]
        kind = g.kinds[o0]
        if kind == _COMPUTE:
            if not d.op_mask[o0] & free:
                return []
        elif kind not in (_WHILE, _BARRIER):
            return []
        first = d._want(o0, i0)
        found = []
        for a, dim in first.items():
            if not free >> a & 1:
                continue
            if all(d._want_dim(o, i, a) == dim for o, i in uses[1:]):
                found.append((a, dim, d._use_priority(o0, a)))
        return found

    def _conflict(self, o: int, won: _Candidate, lost: _Candidate, why: str = "") -> None:
        """Two operands split over one axis along different factors: the
        earlier action wins (`PushForward._record_conflicts`'s words)."""
        d = self.d
        op = self.g.ops[o]
        win_origin, lose_origin = won.priority[1], lost.priority[1]
        d.log.record(
            Conflict(
                op=op.name,
                values=(
                    d.log.value_of(win_origin, describe_value(op.operands[won.operand])),
                    d.log.value_of(lose_origin, describe_value(op.operands[lost.operand])),
                ),
                axis=d.axes[won.axis],
                winner=describe_origin(win_origin),
                loser=describe_origin(lose_origin),
                detail=(
                    f"operand {won.operand} is tiled on dim {won.dim}, "
                    f"operand {lost.operand} on dim {lost.dim}; "
                    + (why or "the loser is redistributed")
                ),
            )
        )

    # --- carried values -----------------------------------------------------------

    def carry(self, o: int) -> None:
        if o < 0:
            return
        g, d = self.g, self.d
        width = self.width
        for k, places in enumerate(g.places[o]):
            ends = g.feeds[o][k]
            found: list[tuple[int, int, Priority]] = []
            for v in ends:
                for a in d.value_axes[v]:
                    priority = d.value_priority[v * width + a]
                    assert priority is not None
                    found.append((a, d.value_dim[v * width + a], priority))
            found += [
                f for f in self._agreed(places[-1], self.every)
                if g.kinds[o] != _WHILE or self._made_split(ends[-1], f[1])
            ]
            found.sort(key=lambda f: f[2][0])
            have = d.carried.setdefault((o, k), {})
            for a, dim, priority in found:
                if a in have:
                    if have[a] != dim:
                        self._carry_conflict(o, k, a, have[a], dim, priority)
                    continue
                have[a] = dim
                d.carried_priority[o, a] = priority
                every = (*ends, *places)
                if any((v, dim) in d.padded for v in every):  # padded at every place
                    d.padded.update((v, dim) for v in every)
                for place in places:
                    if d.value_dim[place * width + a] < 0:
                        self.split_value(place, a, dim, priority)
                if g.kinds[o] != _BRANCH:
                    self._wake_producer(g.operands[o][k])

    def _made_split(self, v: int, dim: int) -> bool:
        """Whether `v`'s producer can make it split on `dim`: a loop's carry
        its users want split, whose body makes the value it returns whole
        along that dim (a row written at a run-time index), is carried whole
        and split after the loop for free; carried split, every iteration
        would gather it and slice it again."""
        g = self.g
        p = g.producer[v]
        rule = g.rules[p] if p >= 0 else None
        if rule is None:
            return True
        factor = rule.result_factor(g.result_index[v], dim)
        return factor is not None and rule.factors[factor].kind is not FactorKind.BLOCKED

    def _carry_conflict(
        self, o: int, k: int, a: int, dim: int, other: int, priority: Priority
    ) -> None:
        op = self.g.ops[o]
        kind = self.g.kinds[o]
        where = (
            "an iteration; the loop's boundary redistributes it"
            if kind == _WHILE
            else "a branch; its result is redistributed"
            if kind == _BRANCH
            else "the barrier; its result is redistributed"
        )
        self.d.log.record(
            Conflict(
                op=op.name,
                values=(f"carried value {k}",),
                axis=self.d.axes[a],
                winner=f"its tiling on dim {dim}",
                loser=describe_origin(priority[1]),
                detail=f"tiled on dim {other} at the other end of {where}",
            )
        )


def decide(module: ModuleOp, mesh: dict[str, int], schedule: Sequence[Sequence[Seed]]) -> Decision:
    """Every value's sharding under `schedule` (per tactic, its seeds in
    order), as a fixpoint; nothing in `module` changes."""
    graph = _Graph.of(entry_function(module).body.block)
    index = {op: o for o, op in enumerate(graph.ops)} if graph.returns else {}
    for o in graph.returns:
        carrier = enclosing_carrier(graph.ops[o])
        if carrier is not None:
            graph.carrier_of_return[o] = index[carrier]
            graph.returned.update(graph.operands[o])
    start, start_cpu = time.perf_counter(), time.process_time()
    propagation = _Propagation(graph, mesh)
    for seeds in schedule:
        propagation.push_all()
        for seed in seeds:
            propagation.seed(seed)
        propagation.run()
    LAST_FIXPOINT_SECONDS[:] = [time.perf_counter() - start, time.process_time() - start_cpu]
    return propagation.d


LAST_FIXPOINT_SECONDS = [0.0, 0.0]
"""How long the last `decide`'s fixpoint took (without reading the graph),
wall-clock and CPU seconds, for `benchmarks.propagation_speed`."""
