"""The factor projection: how a value relates to loops and to an op's factors.

Shardy's "sharding projection", for partir's loops. Three questions, one answer:

- **A value's tilings** (`tilings`): the loops that *produced* it split it.
  After a few rewrites a value is often a slice of a loop result inside another
  loop (`slice 0 %y[%r]` with `%y = loop "batch" [tile<0>] (... loop "model"
  [tile<1>] ...)` is, for its users, tiled on dim 1 over "model"). Propagation
  decides with this view, and the report explains with it.
- **A value's relation to the loops *around* it** (`LoopRelations`): for each
  enclosing loop axis, whether the value is the part along a dim (split), a
  summand (partial), the same in every iteration (replicated: it does not depend
  on the loop's range), or unknown. It is a `Distribution` over the loop axes,
  which is how the SPMD lowering annotates each per-device value. Core IR
  that `rewrites.build_core` built keeps the relations it built each op
  with (`BuiltRelations`); any other core IR has them derived.
- **Projection onto an op's factors** (`project`, `result_distribution`,
  `operand_distribution`, `follow`): each operand dim's axes go to the factor
  it runs over in the op's rule (`rewrites/registry.py`), and back from the
  factors to any operand or result. A `sum` factor's axes come back as partial.

An op rule added to the registry flows through all three without any change
here: the projection reads only `OpRule`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Block, Operation, OpResult, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects.distribution import Distribution
from dialects.op_kinds import per_op_kind
from dialects.partir import (
    HaloSliceOp,
    LoopOp,
    OriginAttr,
    RangeType,
    SliceOp,
    SumAttr,
    TileAttr,
    YieldOp,
)
from rewrites.registry import FactorKind, OpRule, rule_for

# --- loops around an op --------------------------------------------------------


def range_loop(index: SSAValue) -> LoopOp | None:
    """The loop whose range `index` is (None: not a loop's range)."""
    owner = index.owner
    loop = owner.parent_op() if isinstance(owner, Block) else None
    return loop if isinstance(loop, LoopOp) else None


def range_axis(index: SSAValue) -> str | None:
    """The mesh axis of the loop whose range `index` is."""
    loop = range_loop(index)
    return loop.axis_name if loop is not None else None


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


def nested_loops(op: Operation, axes: set[str]) -> list[LoopOp]:
    """The loops over one of `axes` nested in `op`'s regions."""
    if not axes:
        return []
    return [
        inner
        for region in op.regions
        for inner in region.walk()
        if type(inner) is LoopOp and inner.axis_name in axes
    ]


def nests_loop_over(op: Operation, axes: set[str]) -> bool:
    """Whether a loop over one of `axes` is nested in `op`'s regions: moving
    `op` into a loop over such an axis would nest the axis twice."""
    return bool(nested_loops(op, axes))


# --- a value's tilings (by the loops that produced it) ----------------------------


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


def tilings(value: SSAValue) -> list[Tiling]:
    """Tilings of `value` by the loops that produced it, outermost loop first.

    A tile loop contributes its own axis plus whatever its body's value
    carries; a sum loop passes its body's tilings through (a sum of
    concatenations is a concatenation of sums); a slice over an axis the
    value is tiled on peels that tiling off (a halo slice, every tiling of
    its dim: its part is not a concatenation of theirs). (Not memoised:
    rewriting an op inside a loop replaces the loop's yielded value in place.)
    """
    owner = value.owner
    if type(owner) is LoopOp:
        inner = tilings(owner.yielded)
        action = owner.properties["action"]  # IRDL's accessors are slow on this path
        if type(action) is TileAttr:
            tiling = Tiling(owner.axis_name, action.dim.data, owner.origin, owner)
            return [tiling, *inner]
        return inner
    if type(owner) is SliceOp:
        src, index = owner.operands
        outer = tilings(src)
        if not outer:
            return outer
        axis = range_axis(index)
        dim = owner.dim_index
        if any(t.axis == axis and t.dim == dim for t in outer):
            return [t for t in outer if t.axis != axis]
    if type(owner) is HaloSliceOp:  # its other dims keep their tilings
        src, index = owner.operands
        axis, dim = range_axis(index), owner.dim_index
        outer = tilings(src)
        if any(t.axis == axis and t.dim == dim for t in outer):
            return [t for t in outer if t.dim != dim]
    return []


# --- projection onto an op's factors ------------------------------------------------


def dim_factor(rule: OpRule, operand: int, dim: int) -> int | None:
    """The factor a split of `operand`'s `dim` splits (the dim's major one)."""
    dims = rule.operands[operand]
    return dims[dim][0] if dim < len(dims) and dims[dim] else None


def follow(rule: OpRule, operand: int, dim: int, parts: int) -> int | str:
    """The factor an op follows when `operand` is split on `dim` into `parts`,
    or why it cannot (the reason the op stays whole)."""
    factor = dim_factor(rule, operand, dim)
    if factor is None:
        return "the dimension runs over no factor of the op"
    why = rule.why_not_tileable(factor, parts)
    return factor if why is None else why


@dataclass(frozen=True)
class Projection:
    """Per factor of one op, the mesh axes splitting it (major first);
    `conflicts`: axes that operands split along different factors, or in
    different orders (dropped from every factor)."""

    factors: tuple[tuple[str, ...], ...]
    conflicts: frozenset[str] = frozenset()


def project(rule: OpRule, operands: Sequence[Distribution | None]) -> Projection:
    """Project the operands' distributions onto the op's factors.

    Each dim's split axes go to the factor it runs over (its major one); a dim
    with no factor, or an operand given as None, contributes nothing. Partial
    axes have no factor and are left to the caller.
    """
    found: list[tuple[str, ...]] = [() for _ in rule.factors]
    factor_of: dict[str, int] = {}
    conflicts: set[str] = set()
    for i, dist in enumerate(operands):
        if dist is None:
            continue
        for d, axes in enumerate(dist.dims):
            factor = dim_factor(rule, i, d) if axes else None
            if factor is None:
                conflicts.update(axes)  # split along a dim the op does not keep
                continue
            merged = _merge(found[factor], axes)
            if merged is None:
                conflicts.update((*found[factor], *axes))
                continue
            found[factor] = merged
            for axis in axes:
                if factor_of.setdefault(axis, factor) != factor:
                    conflicts.add(axis)
    return Projection(
        tuple(tuple(a for a in axes if a not in conflicts) for axes in found),
        frozenset(conflicts),
    )


def _merge(have: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, ...] | None:
    """One factor's axes from two operands: the longer, if the shorter is a
    prefix of it (a missing minor axis is a replicated one); else None."""
    short, long = sorted((have, more), key=len)
    return long if long[: len(short)] == short else None


def result_distribution(
    rule: OpRule, projection: Projection, result: int = 0
) -> tuple[Distribution, frozenset[str]]:
    """The result's distribution from the factors' axes, and the axes it cannot
    carry (a blocked factor, or one that is not the major factor of a result dim).
    A sum factor's axes become partial."""
    dims: list[tuple[str, ...]] = []
    placed: set[int] = set()
    for factors in rule.results[result]:
        major = factors[0] if factors else None
        if major is not None and rule.factors[major].kind is FactorKind.PARALLEL:
            dims.append(projection.factors[major])
            placed.add(major)
        else:
            dims.append(())
    partial: list[str] = []
    lost: set[str] = set(projection.conflicts)
    for f, axes in enumerate(projection.factors):
        if not axes or f in placed:
            continue
        if rule.factors[f].kind is FactorKind.SUM:
            partial.extend(axes)
        else:
            lost.update(axes)
    return Distribution(tuple(dims), tuple(sorted(partial))), frozenset(lost)


def operand_distribution(rule: OpRule, projection: Projection, operand: int) -> Distribution:
    """The distribution an operand needs for the factors' axes (back-projection)."""
    dims = [projection.factors[factors[0]] if factors else () for factors in rule.operands[operand]]
    return Distribution(tuple(dims))


# --- a value's relation to the loops around it --------------------------------------


@dataclass(frozen=True)
class Split:
    """The value is the part along `dim` of the loop's concatenation."""

    dim: int


@dataclass(frozen=True)
class Partial:
    """The value is a summand of the loop's sum."""


@dataclass(frozen=True)
class Replicated:
    """The value is the same in every iteration."""


AxisRelation = Split | Partial | Replicated
"""One value's relation to one loop around it."""


@dataclass(frozen=True)
class LoopRelation:
    """How a value relates to the loops around its definition: `dist` over the
    known loop axes (split on a dim: the value is the part along it; partial: a
    summand of the sum loop; named nowhere: the same in every iteration), and the
    `unknown` axes."""

    dist: Distribution
    unknown: frozenset[str] = frozenset()

    @property
    def known(self) -> bool:
        return not self.unknown

    def forget(self, axes: Iterable[str]) -> LoopRelation:
        """The relation with `axes` made unknown."""
        gone = frozenset(axes)
        if not gone:
            return self
        dims = tuple(tuple(a for a in d if a not in gone) for d in self.dist.dims)
        partial = tuple(a for a in self.dist.partial if a not in gone)
        return LoopRelation(Distribution(dims, partial), self.unknown | gone)

    def on(self, axis: str) -> AxisRelation | None:
        """The relation to the loop over `axis` (None: unknown)."""
        if axis in self.unknown:
            return None
        if axis in self.dist.partial:
            return Partial()
        dim = self.dist.split_dim_of(axis)
        return Split(dim) if dim is not None else Replicated()

    def with_axis(
        self, axis: str, relation: AxisRelation, nesting: Sequence[str] = ()
    ) -> LoopRelation:
        """The relation with `axis`'s replaced. A split is minor to the dim's
        others, or, given `nesting` (the enclosing loops' axes, outermost
        first), placed by it: a loop's result concatenates its body's parts,
        so an outer loop's axis is major to an inner one's on the same dim
        (a relation settled from a user can name an outer axis last)."""
        known = self.forget([axis])
        dist = known.dist
        if isinstance(relation, Partial):
            dist = Distribution(dist.dims, tuple(sorted((*dist.partial, axis))))
        elif isinstance(relation, Split):
            dist = dist.split_further(relation.dim, (axis,))
            if nesting:
                rank = {a: i for i, a in enumerate(nesting)}
                axes = dist.dims[relation.dim]
                ordered = tuple(sorted(axes, key=lambda a: rank.get(a, len(rank))))
                dist = dist.with_dim(relation.dim, ordered)
        return LoopRelation(dist, known.unknown - {axis})


def loop_relation(action: TileAttr | SumAttr) -> Split | Partial:
    """What a loop's body yields: the part along the tiled dim, or a summand."""
    return Split(action.dim.data) if isinstance(action, TileAttr) else Partial()


def _nesting(value: SSAValue) -> list[str]:
    """The axes of the loops around `value`'s definition, outermost first."""
    owner = value.owner
    op = owner if isinstance(owner, Operation) else owner.parent_op()
    return loop_axes(op)[::-1] if op is not None else []


def _rank(value: SSAValue) -> int:
    ty = value.type
    return ty.get_num_dims() if isinstance(ty, TensorType) else 0


_UNSET = object()


@functools.cache
def _same(rank: int) -> LoopRelation:
    """The relation of a rank-`rank` value that is the same in every iteration
    (one shared object: most values inside loops are)."""
    return LoopRelation(Distribution.replicated(rank))


@per_op_kind
def _regions_at_scope(op: Operation) -> bool:
    """Whether `op`'s regions run at its own loop scope (a while or a conditional)."""
    return isinstance(op, shlo.WhileOp | shlo.CaseOp | shlo.IfOp)


def _sliced(source: LoopRelation, axis: str | None, dim: int) -> LoopRelation:
    """The relation of `slice dim v[r]` (r the range of the loop over `axis`)
    to the loops around it, given v's: the part along `dim`, minor to v's own
    splits (unknown over `axis` if v already depends on it)."""
    if axis is None or axis in source.unknown or axis in source.dist.axes:
        return source.forget([axis] if axis else [])
    return source.with_axis(axis, Split(dim))


def _looped(body: LoopRelation, axis: str, action: TileAttr | SumAttr) -> LoopRelation:
    """The relation of a loop's result to the loops around it, given its
    yielded value's: the body's, less the loop's own axis."""
    if isinstance(action, TileAttr):
        axes = body.dist.dims[action.dim.data]
        # Concatenating over `axis` keeps an outer split of the same dim only
        # when that split is major to `axis`'s.
        minor = axes[axes.index(axis) + 1 :] if axis in axes else ()
        body = body.forget(minor)
    dims = tuple(tuple(a for a in d if a != axis) for d in body.dist.dims)
    partial = tuple(a for a in body.dist.partial if a != axis)
    return LoopRelation(Distribution(dims, partial), body.unknown - {axis})


@dataclass
class LoopRelations:
    """Every value's `LoopRelation` in a function of core IR.

    Forward first: a value that does not depend on a loop's range is the same
    in every iteration (*free*: its users may still describe it better);
    `slice d v[r]` is the part along d, minor to v's own splits; an op with a
    rule follows its operands through `project`; a loop's result keeps its
    body's relations to the outer loops. Then what the lowering relies on:
    a value sliced by a loop's range is whole over that loop, and a value a
    loop yields is that loop's part (tile) or summand (sum). Then backward:
    a free or unknown relation is read off a user through the user's rule
    (`partir.slice` over another axis and a loop's yield pass it through).
    A free relation nobody refines stays "the same in every iteration".
    """

    relations: dict[SSAValue, LoopRelation] = field(default_factory=dict)
    _values: list[SSAValue] = field(default_factory=list)
    _open: dict[SSAValue, set[str]] = field(default_factory=dict)
    """Per value with any (in program order), the free or unknown axes that a
    user may still settle."""
    _rules: dict[Operation, OpRule | None] = field(default_factory=dict)
    _computed: dict[
        tuple[int, tuple[LoopRelation, ...]], tuple[OpRule, list[LoopRelation]]
    ] = field(default_factory=dict)
    """`_compute`'s result per rule and operand relations: a stack's layers
    repeat the same few hundred (the rule is kept so its id stays its own)."""
    _computed_by_id: dict[
        tuple[int, ...], tuple[OpRule, tuple[LoopRelation, ...], list[LoopRelation]]
    ] = field(default_factory=dict)
    """The same, per rule and operand relation *objects* (most are shared: the
    memos return one object per value), which hashes ints, not relations; the
    objects are kept, so their ids stay their own."""
    _sliced: dict[tuple[LoopRelation, str | None, int], LoopRelation] = field(
        default_factory=dict
    )
    """`_slice`'s result per source relation, axis and dim (as `_computed`)."""
    _looped: dict[tuple[LoopRelation, str, TileAttr | SumAttr], LoopRelation] = field(
        default_factory=dict
    )
    """`_loop`'s result per body relation, axis and action."""
    _was_reset: set[int] = field(default_factory=set)
    """The ids of the values whose relations `_reset` changed (alive as below)."""
    _sliced_or_yielded: set[int] = field(default_factory=set)
    """The ids of the values some `partir.slice` or `partir.yield` uses (the
    values are alive as long as the function is): all `_pin` looks at."""

    def __call__(self, value: SSAValue) -> LoopRelation:
        found = self.relations.get(value)
        return found if found is not None else _same(_rank(value))

    @staticmethod
    def of(block: Block) -> LoopRelations:
        relations = LoopRelations()
        relations._forward(block, ())
        relations._pin()
        relations._backward()
        return relations

    # forward ---------------------------------------------------------------------

    def _forward(self, block: Block, axes: tuple[str, ...]) -> None:
        relations, values, open_ = self.relations, self._values, self._open
        sliced_or_yielded = self._sliced_or_yielded
        for op in block.ops:
            kind = type(op)
            if kind is YieldOp:
                sliced_or_yielded.update(id(v) for v in op.operands)
                continue
            if kind is LoopOp:
                self._forward(op.body.block, (*axes, op.axis_name))
            elif kind is SliceOp:
                sliced_or_yielded.update(id(v) for v in op.operands)
            elif _regions_at_scope(op):  # regions at its scope
                for region in op.regions:
                    self._forward(region.block, axes)
            for result, relation in zip(op.results, self._derive(op), strict=True):
                relations[result] = relation
                values.append(result)
                if not axes:
                    continue
                unknown, known = relation.unknown, relation.dist.axes
                if not unknown and not known:  # the same in every iteration
                    open_[result] = set(axes)
                    continue
                still = {a for a in axes if a in unknown or a not in known}
                if still:
                    open_[result] = still

    def _derive(self, op: Operation) -> list[LoopRelation]:
        """The relations of `op`'s results, from its operands'."""
        if type(op) is SliceOp:
            return [self._slice(op)]
        if type(op) is LoopOp:
            return [self._loop(op)]
        return self._compute(op)

    def _slice(self, op: SliceOp) -> LoopRelation:
        src, index = op.operands
        source, axis, dim = self(src), range_axis(index), op.dim_index
        key = (source, axis, dim)
        found = self._sliced.get(key)
        if found is None:
            found = self._sliced[key] = _sliced(source, axis, dim)
        return found

    def _loop(self, op: LoopOp) -> LoopRelation:
        body, axis, action = self(op.yielded), op.axis_name, op.action
        key = (body, axis, action)
        found = self._looped.get(key)
        if found is None:
            found = self._looped[key] = _looped(body, axis, action)
        return found

    def _rule(self, op: Operation) -> OpRule | None:
        rule = self._rules.get(op, _UNSET)
        if rule is _UNSET:
            rule = self._rules[op] = rule_for(op)
        return rule  # type: ignore[return-value]

    def _compute(self, op: Operation) -> list[LoopRelation]:
        get = self.relations.get
        operands: list[LoopRelation] = []
        same = True  # every operand the same in every iteration (most are)
        for value in op.operands:
            relation = get(value)
            if relation is None:
                relation = _same(_rank(value))
            elif same and (relation.unknown or relation.dist.axes):
                same = False
            operands.append(relation)
        if same:
            return [_same(_rank(result)) for result in op.results]
        rule = self._rule(op) if any(r.dist.axes for r in operands) else None
        if rule is None:
            unknown = frozenset().union(*(r.unknown for r in operands))
            axes = {a for r in operands for a in r.dist.axes}
            return [
                LoopRelation(Distribution.replicated(_rank(result)), unknown | axes)
                for result in op.results
            ]
        same_objects = (id(rule), *map(id, operands))
        seen = self._computed_by_id.get(same_objects)
        if seen is not None:
            return list(seen[2])
        key = (id(rule), tuple(operands))
        known = self._computed.get(key)
        if known is None:
            unknown = frozenset().union(*(r.unknown for r in operands))
            partial = {a for r in operands for a in r.dist.partial}
            projection = project(rule, [r.dist for r in operands])
            unplaced = {a for f in rule.unplaced for a in projection.factors[f]}
            relations = []
            for k in range(len(op.results)):  # an op of several results: alike
                dist, lost = result_distribution(rule, projection, k)
                relations.append(LoopRelation(dist).forget(lost | partial | unknown | unplaced))
            known = self._computed[key] = (rule, relations)
        self._computed_by_id[same_objects] = (rule, key[1], known[1])
        return list(known[1])

    # what the lowering relies on ---------------------------------------------------

    def _settle(self, value: SSAValue, axis: str) -> None:
        """`axis` is no longer open for `value`."""
        still = self._open.get(value)
        if still is not None:
            still.discard(axis)

    def _pin(self) -> None:
        sliced_or_yielded = self._sliced_or_yielded
        for value in self._values:
            if id(value) not in sliced_or_yielded:
                continue
            for use in value.uses:
                user = use.operation
                if type(user) is SliceOp:
                    axis = range_axis(user.index)
                    if axis is None:
                        continue
                    if axis in self(value).dist.axes:  # depends on the range slicing it
                        self._reset(value, self(value).forget([axis]))
                    self._settle(value, axis)
                elif type(user) is YieldOp:
                    loop = user.parent_op()
                    assert isinstance(loop, LoopOp)
                    relation = loop_relation(loop.action)
                    if self(value).on(loop.axis_name) != relation:
                        self._reset(
                            value, self(value).with_axis(loop.axis_name, relation, _nesting(value))
                        )
                    self._settle(value, loop.axis_name)

    # backward --------------------------------------------------------------------

    def _backward(self) -> None:
        changed = True
        while changed:
            changed = self._refine_forward()
            for value in reversed(list(self._open)):
                for axis in sorted(self._open[value]):
                    found = self._from_users(value, axis)
                    if found is not None:
                        self._reset(value, self(value).with_axis(axis, found, _nesting(value)))
                        self._open[value].discard(axis)
                        changed = True

    def _refine_forward(self) -> bool:
        """Settle open axes that operands settled since (program order). An
        op none of whose inputs was reset since `_forward` derives what it
        did there, which left these axes open: it is not derived again."""
        changed = False
        reset = self._was_reset
        for value in list(self._open):
            if not self._open[value]:
                continue
            assert isinstance(value, OpResult)  # only op results are kept open
            owner = value.owner
            inputs = [owner.yielded] if type(owner) is LoopOp else owner.operands
            if not any(id(v) in reset for v in inputs):
                continue
            fresh = self._derive(owner)[value.index]
            for axis in sorted(self._open[value]):
                found = fresh.on(axis)
                if isinstance(found, Split | Partial):
                    self._reset(value, self(value).with_axis(axis, found, _nesting(value)))
                    self._open[value].discard(axis)
                    changed = True
        return changed

    def _reset(self, value: SSAValue, relation: LoopRelation) -> None:
        """`value`'s relation, settled after `_forward` derived it."""
        self.relations[value] = relation
        self._was_reset.add(id(value))

    def _from_users(self, value: SSAValue, axis: str) -> AxisRelation | None:
        """`value`'s relation to `axis` as its first informed user sees it."""
        for use in value.uses:
            user = use.operation
            if type(user) is YieldOp:
                loop = user.parent_op()
                assert isinstance(loop, LoopOp)
                seen = self._settled(loop.result, axis)
            elif type(user) is SliceOp:
                seen = self._settled(user.results[0], axis)
            else:
                seen = self._through(user, use.index, axis)
            if seen is not None:
                return seen
        return None

    def _settled(self, value: SSAValue, axis: str) -> AxisRelation | None:
        if axis in self._open.get(value, ()):
            return None
        return self(value).on(axis)

    def _through(self, user: Operation, index: int, axis: str) -> AxisRelation | None:
        """Operand `index`'s relation to `axis`, given the user's result's (of
        an op with several results, the first settled one's: they run over
        the same factors)."""
        if not user.results:
            return None
        settled = [(k, self._settled(r, axis)) for k, r in enumerate(user.results)]
        k, after = next(((k, a) for k, a in settled if a is not None), (0, None))
        rule = self._rule(user)
        if after is None or rule is None:
            return None
        if isinstance(after, Replicated):
            return after
        if isinstance(after, Split):
            factor = rule.result_factor(k, after.dim)
        else:
            sums = [f for f, fac in enumerate(rule.factors) if fac.kind is FactorKind.SUM]
            factor = sums[0] if len(sums) == 1 else None
        if factor is None or factor in rule.unplaced:
            return None
        dim = rule.operand_dims(factor)[index]
        return Split(dim) if dim is not None else Replicated()


# --- relations recorded as the core IR is built ---------------------------------------


_BUILT = "_partir_built_relations"
"""The Python attribute of a function object that holds its `BuiltRelations`
(not an IR attribute: it is not printed, and a clone or a parse has none)."""


class BuiltRelations:
    """Each op's `LoopRelation` as `rewrites.build_core` built it, read
    rather than derived: an op built in loops over axes (outermost first),
    each splitting a factor of its rule or none, is the part along the dim
    that factor is the major factor of (a `tile` loop), a summand (a sum
    factor), or the same in every iteration (a loop it runs in whole).
    `LoopRelations` derives the same from any core IR (where the IR's local
    shapes leave a factor's place unsure, it says less: the decision knows
    the global shapes).

    It describes the function only while the function is as built: `seal`
    records the ops of every block the lowering walks (the function's, each
    loop's body, each while's or conditional's regions), and `describes`
    checks that each still holds exactly those (an op added, removed, moved
    or reordered since: not)."""

    def __init__(self) -> None:
        self._built: dict[int, tuple[_Nest, OpRule | None]] = {}
        """id(op) -> the loops it was built in, and its rule (the ops are
        held by `_blocks`, so their ids stay their own)."""
        self._nests: dict[_Nest, _Nest] = {}
        """One object per nest (most ops share a few)."""
        self._blocks: list[tuple[Block, tuple[Operation, ...], tuple[Operation, ...]]] = []
        """Each block the lowering walks, its ops, and those of its ops whose
        regions it walks (loops, whiles, conditionals), as sealed."""
        self._relations: dict[tuple[int, int, int], LoopRelation] = {}
        """Per rule, result and nest (by id: the records hold them), the
        relation: the layers of a stack repeat a few hundred."""
        self._shared: dict[
            tuple[tuple[tuple[str, ...], ...], tuple[str, ...], frozenset[str]], LoopRelation
        ] = {}
        """One relation object per relation (an op with a body has a rule of its own)."""

    def built(
        self,
        op: Operation,
        axes: tuple[str, ...],
        factors: tuple[int | None, ...],
        rule: OpRule | None,
    ) -> None:
        """`op` of the program is built inside loops over `axes` (outermost
        first), each splitting the factor of `rule` at the same place in
        `factors` (None: the op runs whole in that loop)."""
        if axes:
            nest = (axes, factors)
            self._built[id(op)] = (self._nests.setdefault(nest, nest), rule)

    def seal(self, block: Block) -> None:
        """Record the ops of `block` and of the blocks the lowering walks in
        it (depth first, in program order)."""
        ops = tuple(iter(block.ops))  # not tuple(block.ops): that walks them twice
        nested = tuple(
            op for op in ops if op.regions and (type(op) is LoopOp or _regions_at_scope(op))
        )
        self._blocks.append((block, ops, nested))
        for op in nested:
            for region in op.regions:
                for inner in region.blocks:
                    self.seal(inner)

    def describes(self, block: Block) -> bool:
        """Whether `block` (the function's) and the blocks the lowering walks
        in it hold the ops they held when sealed (compared by identity)."""
        blocks = self._blocks
        if not blocks or blocks[0][0] is not block:
            return False
        for recorded, ops, _ in blocks:
            if tuple(iter(recorded.ops)) != ops:
                return False
        # the blocks walked in them are the recorded ones
        walked = {
            id(inner)
            for _, _, nested in blocks
            for op in nested
            for region in op.regions
            for inner in region.blocks
        }
        return walked == {id(recorded) for recorded, _, _ in blocks[1:]}

    def __call__(self, value: SSAValue) -> LoopRelation:
        """The relation of `value`, a result of a built op (or an argument)."""
        # (`getattr`, not `owner` and `isinstance`, Python calls: this runs
        # per annotated op; an argument has no `op`)
        found = self._built.get(id(getattr(value, "op", None)))
        if found is None:  # built outside every loop, or an argument
            return _same(_rank(value))
        nest, rule = found
        index: int = getattr(value, "index", 0)
        key = (id(rule), index, id(nest))
        relation = self._relations.get(key)
        if relation is None:  # one object per relation: the lowering memoises by object
            dims, partial, unknown = _built_relation(rule, index, _rank(value), nest)
            relation = self._shared.get((dims, partial, unknown))
            if relation is None:
                relation = LoopRelation(Distribution(dims, partial), unknown)
                self._shared[(dims, partial, unknown)] = relation
            self._relations[key] = relation
        return relation


_Nest = tuple[tuple[str, ...], tuple[int | None, ...]]
"""The axes of the loops an op is built in (outermost first), and the factor
of its rule each splits (None: it runs whole in that loop)."""


def _built_relation(
    rule: OpRule | None, index: int, rank: int, nest: _Nest
) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...], frozenset[str]]:
    """Result `index`'s relation to the loops of `nest`: its split axes per
    dim, partial axes and unknown axes."""
    axes, split = nest
    dims: list[tuple[str, ...]] = [()] * rank
    partial: list[str] = []
    unknown: set[str] = set()
    for axis, f in zip(axes, split, strict=True):
        if f is None:
            continue  # run whole in each iteration: the same in all
        assert rule is not None  # only an op with a rule is split
        if rule.factors[f].kind is FactorKind.SUM:
            partial.append(axis)
            continue
        dim = rule.result_dim(f, index)
        if dim is None:
            unknown.add(axis)
        else:
            dims[dim] = (*dims[dim], axis)
    return tuple(dims), tuple(sorted(partial)), frozenset(unknown)


def record_built(function: Operation, relations: BuiltRelations) -> None:
    """Keep `relations` with `function` (the entry `rewrites.build_core` built)."""
    setattr(function, _BUILT, relations)


def built_relations(function: Operation) -> BuiltRelations | None:
    """The relations `function` was built with, if it is as built (`describes`)."""
    found = getattr(function, _BUILT, None)
    if not isinstance(found, BuiltRelations):
        return None
    return found if found.describes(function.regions[0].blocks[0]) else None
