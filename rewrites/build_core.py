"""Build once: the core IR of a `Decision`, every op placed in its loops in one pass.

`rewrites.factor_propagation.decide` says, per op, the mesh axes that split
each factor of its rule and the loops it runs in without splitting
(`Decision.inside`). This module materializes that as the core IR the
rewrite engine (`rewrites.propagation`) reaches one rewrite at a time:

- **placement** (users before producers): an op whose every use is in one
  loop nest runs inside the outer loops of that nest that it can share: a
  loop over an axis it splits on the dim its users read split over that axis,
  or one it runs in whole (`inside`); a loop over an axis it sums over is
  never shared (its users read the sum). Everything else of it is its own
  loops, major axes outermost (`Decision.factor_axes`).
- **building** (program order): each op is built once, as `tiling.part_op`
  builds a part, on its operands' parts: an operand made in the same loop
  nest is read directly (fused), anything else through `partir.slice` on the
  index of the loop whose axis the op reads it split over.

The relation of each built op to the loops it is built in (the part along
a dim, a summand, or the same in every iteration) is kept with the entry
function (`rewrites.projection.BuiltRelations`): the SPMD lowering reads it
instead of deriving it from the IR.

An op of several results is built where one of them is used (its loops
yield that one). Whatever `rewrites.buildable` rewrites in the module first
(a dim the first tactic pads, a split op of several used results, an
argmax or top_k along a split dim) and a window split over two axes, an
op whose properties hold sizes split on two factors, or a dim padded by a
later tactic raise `UnsupportedError` before anything is built (the rewrite
engine handles them); the module is not changed then.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.transforms.dead_code_elimination import would_be_trivially_dead
from xdsl_jax.dialects.stablehlo import WhileOp

from dialects.errors import PartirValueError, UnsupportedError
from dialects.functions import entry_function
from dialects.partir import (
    HaloSliceOp,
    LoopOp,
    SliceOp,
    TileAttr,
    YieldOp,
    part_type,
    range_type,
)
from rewrites.buildable import would_regroup
from rewrites.factor_propagation import (
    _BARRIER,
    _BRANCH,
    _COMPUTE,
    _OTHER,
    _RETURN,
    _WHILE,
    Decision,
    Priority,
)
from rewrites.projection import BuiltRelations, record_built
from rewrites.registry import FactorKind, OpRule
from rewrites.tiling import loop_action

_CARRIERS = (_WHILE, _BRANCH, _BARRIER)
"""A while, a case or an optimization barrier: it carries whole values
(as the rewrite engine leaves it); the ops of a while's or case's bodies
are placed and built in their own block."""


@dataclass(eq=False, slots=True)
class _Loop:
    """One loop being built: its op, body and index."""

    axis: str
    op: LoopOp
    block: Block
    index: SSAValue


@dataclass(slots=True)
class _Place:
    """Where an op runs: `frames` are the loops around its part, outermost
    first; the first `shared` of them are its users' (it is built inside
    them), the rest its own."""

    frames: list[_Loop] = field(default_factory=list)
    shared: int = 0


_NOWHERE = _Place()
"""The place of an op in no loop (most ops): one, never changed."""


_READ_AS_THEY_ARE = frozenset((_COMPUTE, _OTHER))
"""The kinds of op whose operands `_Builder._operand` slices only in their
own loops (a return, a while, a case or a barrier reads carried values)."""


def _refuse(decision: Decision, top: list[int]) -> None:
    graph = decision.graph
    if decision.padded:
        raise UnsupportedError("build_core: a dim padded for divisibility; use the rewrite engine")
    kinds, masks, inside, rules = graph.kinds, decision.op_mask, decision.inside, graph.rules
    width, factors = len(decision.axes), decision.op_factor
    for o in top:
        kind, split_over = kinds[o], masks[o]
        if kind in _CARRIERS:
            continue  # carries whole values; its bodies are built as blocks of their own
        if split_over and len(graph.results[o]) > 1 and graph.used_result(o) < 0:
            raise UnsupportedError(
                f"build_core: {graph.ops[o].name} has several used results and is split"
            )
        if kind == _OTHER and (split_over or inside[o]):
            raise UnsupportedError(f"build_core: {graph.ops[o].name} has no rule but is split")
        rule = rules[o]
        if rule is not None and rule.regroup is not None and would_regroup(decision, o, rule):
            raise UnsupportedError(
                f"build_core: {graph.ops[o].name} picks along a split dim (regrouped by the "
                "rewrite engine); use the rewrite engine"
            )
        if not split_over or rule is None or not rule.windowed:
            continue
        base = o * width
        if sum(1 for a in decision.op_axes[o] if _halo(rule, factors[base + a])) > 1:
            raise UnsupportedError(
                f"build_core: {graph.ops[o].name} is split on windows with halos over two "
                "axes; use the rewrite engine"
            )


def _halo(rule: OpRule, factor: int) -> tuple[int, int] | None:
    """The halo a window op's input (its operand 0) is read with where
    `factor` is split (`tiling.slice_operands`), or None."""
    halo = rule.factors[factor].halo
    return halo if any(halo) else None


class _Builder:
    def __init__(self, decision: Decision, block: Block) -> None:
        self.d = decision
        self.g = decision.graph
        self.block = block
        self.places: list[_Place | None] = [None] * len(self.g.ops)
        self.dead = [False] * len(self.g.ops)
        self.axes_of: dict[int, tuple[str, ...]] = {}
        """Op id -> `_own_axes`, where it splits two axes or more."""
        self.names: dict[tuple[int, ...], tuple[str, ...]] = {
            (): (), **{(a,): (axis,) for a, axis in enumerate(decision.axes)}
        }
        """Axis numbers -> their names, for one axis or none (most ops): shared."""
        self.slices: dict[tuple[int, int, int], SSAValue] = {}
        """(id(source), dim, id(loop index)) -> its slice: one per loop, shared
        by its readers (by identity: a value's hash is a Python call; the IR
        holds both values while the build runs)."""
        self.reps: list[SSAValue | None] = [None] * len(self.g.values)
        """Value id -> the value users outside its producer's own loops read
        (None: the value itself)."""
        self.bodies: dict[int, list[tuple[Block, list[int]]]] = {}
        """A while's or case's op id -> its bodies, each with its ops' ids."""
        self.relations = BuiltRelations()
        """Each op's relation to the loops it is built in (the SPMD lowering's)."""
        self.yields: dict[int, int] = {}
        """An op of several results -> the one its loops yield (the only one
        used: `rewrites.buildable`); the others yield 0."""
        self.several_used: set[int] = set()
        """Ops with several used results (unsplit): in no loop of their users'."""
        self.windows: set[int] = set()
        """The split ops whose rule has a factor with a halo (window ops)."""
        graph, masks = self.g, decision.op_mask
        for o, rule in enumerate(graph.rules):
            if rule is None or (len(rule.results) < 2 and not rule.windowed):
                continue
            if len(rule.results) > 1:
                used = graph.used_result(o)
                self.yields[o] = max(used, 0)
                if used < 0:
                    self.several_used.add(o)
            if rule.windowed and masks[o]:
                self.windows.add(o)

    def build_block(self, block: Block, ops: list[int], arguments: bool) -> None:
        """Place (users first) and build (in program order) the ops of
        `block`: the entry's, or a while's or case's body (whose arguments
        are read as their uses slice them)."""
        outer, self.block = self.block, block
        for o in reversed(ops):
            if self.g.kinds[o] == _RETURN:
                self.places[o] = _NOWHERE
            else:
                self.place(o)
        if arguments:
            for arg in block.args:
                self.arrive(arg)
        for o in ops:
            self.build(o)
        self.block = outer

    # -- placement ---------------------------------------------------------

    def _tile_dim(self, o: int, axis: str) -> int | None:
        """The result dim op `o` splits over `axis`, or None (a sum, or not split)."""
        d = self.d
        f = d.op_factor[o * len(d.axes) + d.axis_index[axis]]
        if f < 0:
            return None
        rule = self.g.rules[o]
        if rule is None or rule.factors[f].kind is FactorKind.SUM:
            return None
        return rule.result_dim(f, self.yields.get(o, 0))

    def _own_axes(self, o: int) -> tuple[str, ...]:
        """The axes op `o` splits, outermost loop first: by the decisions'
        priority, the axes of one factor major first."""
        decided = self.d.op_axes[o]
        if len(decided) < 2:
            return self.names[decided]
        found = self.axes_of.get(o)
        if found is None:
            found = self.axes_of[o] = self._order_axes(o, decided)
        return found

    def _order_axes(self, o: int, decided: tuple[int, ...]) -> tuple[str, ...]:
        d = self.d
        base = o * len(d.axes)
        factors, priority = d.op_factor, d.op_priority
        order = sorted(decided, key=lambda a: (priority[base + a] or (1 << 30, None))[0])
        slots: dict[int, list[int]] = {}
        for i, a in enumerate(order):
            slots.setdefault(factors[base + a], []).append(i)
        out = list(order)
        for f, positions in slots.items():
            major = [a for a in decided if factors[base + a] == f]
            for i, a in zip(positions, major, strict=True):
                out[i] = a
        return tuple(d.axes[a] for a in out)

    def place(self, o: int) -> None:
        op = self.g.ops[o]
        results = self.g.results[o]
        if results:  # pure, and every use of its results is by a dead op
            uses, dead = self.g.uses, self.dead
            if all(dead[q] for v in results for q, _ in uses[v]) and would_be_trivially_dead(op):
                self.dead[o] = True  # as the rewrite engine's applier erases it
                return
        if not self.d.op_mask[o] and not self.d.inside[o]:
            self.places[o] = _NOWHERE  # in no loop of its own, nor in its users'
            return
        users = [
            (place, q, i)
            for v in self.g.results[o]
            for q, i in self.g.uses[v]
            if not self.dead[q] and (place := self.places[q]) is not None
        ]
        shared: list[_Loop] = []
        if users and users[0][0].frames and o not in self.several_used and all(
            self.g.ops[q].parent is op.parent for v in self.g.results[o] for q, _ in self.g.uses[v]
        ):  # a use inside a body reads it whole, from outside any loop
            own = self._own_axes(o)
            for level, loop in enumerate(users[0][0].frames):
                if any(len(p.frames) <= level or p.frames[level] is not loop for p, _, _ in users):
                    break
                if not self._enters(o, loop.axis, own, shared, users):
                    break
                shared.append(loop)
        place = _Place(list(shared), len(shared))
        taken = {loop.axis for loop in shared}
        if not self.g.results[o]:
            self.places[o] = place
            return
        rule = self.g.rules[o]
        for axis in self._own_axes(o):
            if axis in taken:
                continue
            assert rule is not None
            ty = self.g.values[self.g.results[o][self.yields.get(o, 0)]].type
            for outer in place.frames:
                dim = self._tile_dim(o, outer.axis)
                if dim is not None:
                    assert isinstance(ty, TensorType)
                    ty = part_type(ty, dim, self.d.mesh[outer.axis])
            block = Block(arg_types=[range_type(self.d.mesh[axis])])
            factor = self.d.factor_of(o, axis)
            assert factor is not None
            made = LoopOp(axis, loop_action(rule, factor, self.yields.get(o, 0)),
                          Region(block), ty,
                          _origin(self.d, o, axis))
            made.location = self.g.ops[o].location
            place.frames.append(_Loop(axis, made, block, block.args[0]))
        self.places[o] = place

    def _enters(
        self, o: int, axis: str, own: tuple[str, ...], shared: list[_Loop],
        users: list[tuple[_Place, int, int]],
    ) -> bool:
        """Whether op `o` can run inside its users' loop over `axis`."""
        d = self.d
        a = d.axis_index[axis]
        base, factors = o * len(d.axes), d.op_factor
        f = factors[base + a]
        if f < 0:  # not split over the axis: it runs in the loop whole, or not in it
            return bool(d.inside[o] >> a & 1)
        dim = self._tile_dim(o, axis)
        if dim is None:
            return False
        for b in d.op_axes[o]:  # the axes splitting `f` before this one (major) are shared
            if b == a:
                break
            if factors[base + b] == f and all(loop.axis != d.axes[b] for loop in shared):
                return False
        want_dim = d._want_dim
        if not all(want_dim(q, i, a) == dim for _, q, i in users):
            return False
        # a window op's input is read with its neighbours' edges: whole
        return not self.windows or not any(self._reads_halo(q, i) for _, q, i in users)

    # -- building ----------------------------------------------------------

    def arrive(self, arg: SSAValue) -> None:
        """An argument a tactic split that some use does not read split so
        (it lost a conflict there) arrives split all the same, as the
        annotation says: a loop slicing it, which every use then reads."""
        v = self.g.ids.get(arg)
        if v is None or not self.d.value_axes[v]:
            return
        nesting = self.d.nesting_of(v)
        own = {axis: d for d, axes in nesting.items() for axis in axes}
        if all(
            self.g.kinds[o] not in _CARRIERS  # a carrier reads it whole
            and all(self.d.wanted(o, i).get(axis) == d for axis, d in own.items())
            and not self._reads_halo(o, i)  # its halo is sliced from the parts
            for o, i in self.g.uses[v]
        ):
            return  # each use slices it itself (fused)
        origins = {axis: self.d.value_priority_of(v, axis) for axis in own}
        value = self._tile_loops(arg, nesting, origins)
        value.name_hint = arg.name_hint
        self.reps[v] = value

    def _reads_halo(self, o: int, i: int) -> bool:
        """Whether op `o` reads operand `i` with a halo (a window op's input
        over a split window)."""
        if i or o not in self.windows:
            return False
        rule = self.g.rules[o]
        assert rule is not None
        base, factors = o * len(self.d.axes), self.d.op_factor
        return any(_halo(rule, factors[base + a]) for a in self.d.op_axes[o])

    def _tile_loops(
        self,
        value: SSAValue,
        nesting: dict[int, tuple[str, ...]],
        origins: dict[str, Priority | None],
    ) -> SSAValue:
        """`value` made split as `nesting` says (dim -> its axes, major
        first): a tile loop nest slicing it, added to the current block; the
        nest's result (the rewrite engine's form of a value that arrives
        split)."""
        loops: list[LoopOp] = []
        ty = value.type
        for d, axes in sorted(nesting.items()):
            for axis in axes:
                assert isinstance(ty, TensorType)
                block = Block(arg_types=[range_type(self.d.mesh[axis])])
                origin = origins.get(axis)
                loop = LoopOp(axis, TileAttr(d), Region(block), ty,
                              {"origin": origin[1]} if origin and origin[1] else {})
                ty = part_type(ty, d, self.d.mesh[axis])
                s = SliceOp(value, d, block.args[0])
                block.add_op(s)
                value = s.results[0]
                loops.append(loop)
        for k in range(len(loops) - 1, -1, -1):
            loops[k].body.block.add_op(YieldOp(value))
            if k > 0:
                loops[k - 1].body.block.add_op(loops[k])
            value = loops[k].results[0]
        self.block.add_op(loops[0])
        return value

    def _ends_body(self, o: int, carrier: int) -> bool:
        """Whether return `o` ends the body of while `carrier` (not its condition)."""
        op = self.g.ops[carrier]
        return isinstance(op, WhileOp) and self.g.ops[o].parent is op.body.block

    def _carried(self, o: int, i: int, v: int, value: SSAValue) -> SSAValue:
        """Value `v` carried as operand `i` of while or barrier `o` (or
        returned by its body for that place), split as the decision says:
        it is carried split, as a tile loop nest of slices (the rewrite
        engine's form), unless its producer's own loops make it so."""
        want = self.d.wanted(o, i)
        if not want:
            return value
        p = self.g.producer[v]
        if p >= 0 and self.g.kinds[p] == _COMPUTE:
            place = self.places[p]
            own = {loop.axis for loop in place.frames[place.shared:]} if place else set()
            if all(a in own and self._tile_dim(p, a) == d for a, d in want.items()):
                return value
        nesting: dict[int, tuple[str, ...]] = {}
        for axis in self.d.mesh:  # major first, as the mesh orders its axes
            if axis in want:
                nesting[want[axis]] = (*nesting.get(want[axis], ()), axis)
        origins = {axis: self.d.carried_priority_of(o, axis) for axis in want}
        return self._tile_loops(value, nesting, origins)

    def build(self, o: int) -> None:
        if self.dead[o]:
            return
        op = self.g.ops[o]
        place = self.places[o]
        assert place is not None
        rule = self.g.rules[o]
        read = self.g.operands[o]
        values = self.g.values
        if self.g.kinds[o] in _READ_AS_THEY_ARE and (not place.frames or not self.d.op_mask[o]):
            # in no loop, or read whole (most ops outside loops): what
            # `_operand` gives, without its questions
            reps = self.reps
            operands = [values[v] if (r := reps[v]) is None else r for v in read]
        else:
            order = self._slicing_order(o, place)
            operands = [self._operand(o, i, place, order) for i in range(len(read))]
        op.detach()  # moved, not copied: the op keeps its identity, regions and name
        if self.d.op_mask[o] and self.g.kinds[o] != _RETURN:
            _localize(op, rule, self.d, o)
        for i, v in enumerate(read):
            if operands[i] is not values[v]:  # a part, a slice or a loop's result
                op.operands = operands
                break
        target = place.frames[-1].block if place.frames else self.block
        target.add_op(op)
        frames = place.frames
        if frames:
            axes = tuple(loop.axis for loop in frames)
            factors = tuple(self.d.factor_of(o, a) for a in axes)
            self.relations.built(op, axes, factors, rule)
        results = self.g.results[o]
        if not results:
            for block, ops in self.bodies.get(o, ()):
                self.build_block(block, ops, arguments=False)
            return
        yielded = results[self.yields.get(o, 0)]
        whole = inner = values[yielded]  # the op's own result (its part, in loops)
        for k in range(len(place.frames) - 1, place.shared - 1, -1):
            loop = place.frames[k]
            loop.block.add_op(YieldOp(inner))
            parent = place.frames[k - 1].block if k > 0 else self.block
            parent.add_op(loop.op)
            inner = loop.op.results[0]
        for v in results:
            self.reps[v] = values[v]  # (a result not used: none reads it)
        self.reps[yielded] = inner
        for block, ops in self.bodies.get(o, ()):
            self.build_block(block, ops, arguments=False)
        if inner is not whole and whole.name_hint:
            inner.name_hint = whole.name_hint  # the name is the whole value's
            whole.name_hint = None

    def _slicing_order(self, o: int, place: _Place) -> list[int]:
        """`place`'s frames in the order op `o` took their axes (the engine's:
        an operand's slices, each of the one before, in that order)."""
        if len(place.frames) < 2:
            return list(range(len(place.frames)))
        decided = list(self.d.factors_of(o))
        return sorted(
            range(len(place.frames)),
            key=lambda k: (decided.index(place.frames[k].axis), k)
            if place.frames[k].axis in decided
            else (len(decided), k),
        )

    def _made_in(self, v: int) -> tuple[set[str], int]:
        """The axes of the loops value `v`'s producer shares with its users
        and splits it over (its part there), and the level of the
        innermost of them (-1: none)."""
        p = self.g.producer[v]
        done: set[str] = set()
        if p < 0:
            return done, -1
        producer = self.places[p]
        assert producer is not None
        for loop in producer.frames[: producer.shared]:
            if self._tile_dim(p, loop.axis) is not None:
                done.add(loop.axis)
        return done, producer.shared - 1

    def _operand(self, o: int, i: int, place: _Place, order: list[int]) -> SSAValue:
        """Operand `i` of op `o` as its part reads it: sliced on the index of
        each of its loops (`order`: the frames in the order the op took
        their axes) whose axis it reads the operand split over."""
        v = self.g.operands[o][i]
        value = self.reps[v]
        if value is None:
            value = self.g.values[v]  # an argument of the function
        kind = self.g.kinds[o]
        if kind == _RETURN:
            carrier = self.g.carrier_of_return.get(o, -1)
            if carrier >= 0 and self._ends_body(o, carrier):  # the next iteration's value
                return self._carried(carrier, i, v, value)
            return value
        if kind == _BRANCH:
            return value
        if kind in _CARRIERS:
            return self._carried(o, i, v, value)
        if not place.frames or not self.d.op_mask[o]:
            return value  # in no loop, or read whole
        made, index = self.slices, self.d.axis_index
        rule = self.g.rules[o]
        assert rule is not None  # a split op without one is refused
        majors, factors, base = rule.operand_majors[i], self.d.op_factor, o * len(self.d.axes)
        done: set[str] | None = None
        level = -1  # the value is defined in the block of place.frames[level]
        for k in order:
            loop = place.frames[k]
            f = factors[base + index[loop.axis]]  # Decision._want_dim, inline
            dim = majors.get(f, -1) if f >= 0 else -1
            if dim < 0:
                continue
            if done is None:
                done, level = self._made_in(v)
            if loop.axis in done:
                continue
            level = max(level, k)  # in the loop whose index it reads (slices hoisted)
            halo = _halo(rule, f) if i == 0 else None
            if halo is not None:  # its part and its neighbours' edges: its own
                h = HaloSliceOp(value, dim, loop.index, halo)
                h.location = self.g.ops[o].location
                place.frames[level].block.add_op(h)
                value = h.results[0]
                continue
            key = (id(value), dim, id(loop.index))
            found = made.get(key)
            if found is None:
                s = SliceOp(value, dim, loop.index)
                s.location = self.g.ops[o].location
                place.frames[level].block.add_op(s)
                found = made[key] = s.results[0]
            value = found
        return value


class _EngineOrder:
    """Orders loop bodies as the rewrite engine leaves them (`order`). One
    per build: the ranks of the axes an op splits and the axis of each
    loop index are shared by every body."""

    def __init__(self, decision: Decision, ids: dict[int, int]) -> None:
        self.d = decision
        self.ids = ids
        self.ranks: dict[tuple[int, ...], dict[str, int]] = {}
        """An op's split axes (`Decision.op_axes`, shared tuples) -> axis -> its rank."""
        self.index_axes: dict[int, str] = {}
        """id(a loop's index) -> the loop's axis."""

    def order(self, loop: LoopOp) -> None:
        """Order a loop body (and the bodies inside it) as the rewrite
        engine leaves it, from the yield back: each op after what it reads
        (post-order), in operand order (the engine fuses a producer's part
        where its slice was), except that an op whose split over the loop's
        axis came through an operand made in this body follows that
        operand's ops (the engine moved it into their loop, after its body:
        `PushForward._join_loop`). The build adds ops in program order; this
        makes the core IR text the engine's, so `partir-opt`'s passes and
        the stages read the same."""
        block = loop.body.block
        ops = list(block.ops)
        for op in ops:
            if type(op) is LoopOp:  # by class: an ABC's isinstance is a Python call
                self.order(op)
        terminator = block.last_op
        if len(ops) < 3 or terminator is None:
            return
        here = {id(op) for op in ops}
        reads = self._reader(here, self.d.axis_index[loop.axis.data])
        order: list[Operation] = []
        placed = {id(terminator)}  # by identity: an op's own hash is a Python call
        stack: list[tuple[Operation, list[Operation]]] = [(terminator, reads(terminator)[::-1])]
        while stack:
            op, pending = stack[-1]
            if pending:
                nxt = pending.pop()
                if id(nxt) not in placed:
                    placed.add(id(nxt))
                    stack.append((nxt, reads(nxt)[::-1]))
                continue
            stack.pop()
            order.append(op)
        if len(order) == len(ops):
            wanted = order
        else:
            rest = [op for op in ops if id(op) not in placed]  # read by nothing the yield needs
            wanted = [*order[:-1], *rest, terminator]
        pairs = enumerate(zip(ops, wanted, strict=True))
        first = next((k for k, (a, b) in pairs if a is not b), None)
        if first is None:
            return  # built in the engine's order already (about half the bodies)
        _move_into_order(block, ops, wanted, first)

    def _reader(self, here: set[int], a: int) -> Callable[[Operation], list[Operation]]:
        """What an op of a body over axis number `a` (`here`: its ops'
        ids) reads there, in the order the engine places it."""
        d, ids, ranks, axis_of = self.d, self.ids, self.ranks, self._axis_of
        op_axes, arrival, axes = d.op_axes, d.op_arrival, d.axes
        width = len(axes)

        def reads(op: Operation) -> list[Operation]:
            o = ids.get(id(op))
            found: list[Operation] = []
            # the operands themselves: `op.operands` makes a view per call
            operands = op._operands  # pyright: ignore[reportPrivateUsage]
            if o is None:  # a slice, loop or yield: its operands in order
                for v in operands:
                    maker = v.owner
                    if id(maker) in here:
                        found.append(maker)  # type: ignore[arg-type]
            else:  # an op of the program: each operand's slices by the axis order
                # in which the op was split (the engine slices per tiling), then
                # the operand's producer; the operand it arrived through first
                split = op_axes[o]
                rank = ranks.get(split)
                if rank is None:
                    rank = ranks[split] = {axes[b]: k for k, b in enumerate(split)}
                n = len(rank)
                last = max(n - 1, 0)
                keyed: list[tuple[int, int, Operation]] = []
                for i, v in enumerate(operands):
                    owner = v.owner
                    if id(owner) not in here:
                        continue
                    while type(owner) is SliceOp:
                        keyed.append((rank.get(axis_of(owner), n), i, owner))
                        owner = owner._operands[0].owner  # pyright: ignore[reportPrivateUsage]
                        if id(owner) not in here:
                            break
                    else:  # made in the loop: where the last tiling sliced it
                        keyed.append((last, i, owner))  # type: ignore[arg-type]
                if len(keyed) > 1:
                    keyed.sort(key=_BY_RANK)
                found = [k[2] for k in keyed]
                arrived = arrival[o * width + a]
                if 0 <= arrived < len(operands):
                    first = operands[arrived].owner
                    if id(first) in here and id(first) in ids:  # an op of the program
                        found.insert(0, first)  # type: ignore[arg-type]
            if op.regions:
                _makers_read_inside(op, here, found)
            return found

        return reads

    def _axis_of(self, s: SliceOp) -> str:
        """The axis of the loop whose index `s` reads."""
        index = s._operands[1]  # pyright: ignore[reportPrivateUsage]
        found = self.index_axes.get(id(index))
        if found is None:
            owner = index.owner
            loop = owner.parent_op() if isinstance(owner, Block) else None
            found = loop.axis.data if isinstance(loop, LoopOp) else ""
            self.index_axes[id(index)] = found
        return found


def _move_into_order(
    block: Block, ops: list[Operation], wanted: list[Operation], first: int
) -> None:
    """Reorder `block` (its ops `ops`, the same as `wanted` up to `first`)
    into `wanted`, moving the fewest ops: those off a longest run that is in
    order already (a body built out of order mostly has a few slices out of
    place; moving everything from the first of them moved 2 ops in 3)."""
    end = len(ops)
    while ops[end - 1] is wanted[end - 1]:  # the same from here on (the yield, at least)
        end -= 1
    position = {id(op): k for k, op in enumerate(ops[first:end], start=first)}
    rest = [position[id(op)] for op in wanted[first:end]]
    kept = _longest_increasing(rest)
    anchor = ops[end] if end < len(ops) else None  # the next op in `wanted`, in its place
    for k in range(len(rest) - 1, -1, -1):
        op = ops[rest[k]]
        if k not in kept:
            op.detach()
            if anchor is None:
                block.add_op(op)
            else:
                block.insert_op_before(op, anchor)
        anchor = op


def _longest_increasing(values: list[int]) -> set[int]:
    """The indices of a longest strictly increasing subsequence of `values`
    (patience sorting, O(n log n))."""
    tails: list[int] = []  # per length, the index of the least last value
    previous = [-1] * len(values)
    for k, value in enumerate(values):
        at = bisect_left(tails, value, key=values.__getitem__)
        if at:
            previous[k] = tails[at - 1]
        if at == len(tails):
            tails.append(k)
        else:
            tails[at] = k
    found: set[int] = set()
    k = tails[-1] if tails else -1
    while k >= 0:
        found.add(k)
        k = previous[k]
    return found


def _makers_read_inside(op: Operation, here: set[int], found: list[Operation]) -> None:
    """Append to `found` the ops of `here` (by id) that the ops nested in
    `op` read, in `walk`'s order (each op's operands, then its regions'),
    without `walk`'s generator per block."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.ops:
                for v in inner._operands:  # pyright: ignore[reportPrivateUsage]
                    maker = v.owner
                    if id(maker) in here:
                        found.append(maker)
                if inner.regions:
                    _makers_read_inside(inner, here, found)


_BY_RANK = itemgetter(0, 1)
"""A slice's or producer's (tiling rank, operand): stable, it keeps a chain's order."""


def _origin(decision: Decision, o: int, axis: str) -> dict[str, Attribute]:
    found = decision.priority_of(o, axis)
    if found is None or found[1] is None:
        return {}
    return {"origin": found[1]}


def _divide_by(parts: int) -> Callable[[int], int]:
    return lambda size: size // parts


def _counts(decision: Decision, o: int) -> dict[int, int]:
    """Factor -> the parts op `o` splits it into (over all its split axes)."""
    counts: dict[int, int] = {}
    base, factors, sizes = o * len(decision.axes), decision.op_factor, decision.sizes
    for a in decision.op_axes[o]:
        f = factors[base + a]
        counts[f] = counts.get(f, 1) * sizes[a]
    return counts


def _resize_properties(op: Operation, rule: OpRule, decision: Decision, o: int) -> None:
    """Resize the sizes `op`'s properties hold to its part's (`OpRule.localize`,
    as `tiling.part_op` does). Localizers read the operands' shapes, so this
    runs for every op before any result becomes a part."""
    if rule.localize is None:
        return
    for f, parts in _counts(decision, o).items():
        op.properties.update(rule.localize(op, rule, f, _divide_by(parts)))


def _localize(op: Operation, rule: OpRule | None, decision: Decision, o: int) -> None:
    """Make `op`'s result (in place) its part's: split by its factors."""
    counts = _counts(decision, o)
    if not counts or rule is None:
        return
    for k, result in enumerate(op.results):
        ty = result.type
        for f, parts in counts.items():
            dim = rule.result_dim(f, k)
            if dim is not None:
                assert isinstance(ty, TensorType)
                ty = part_type(ty, dim, parts)
        # xDSL has no public setter: the result keeps its uses and name, only
        # its type becomes the part's
        result._type = ty


def build_core(module: ModuleOp, decision: Decision) -> None:
    """Rewrite `module`'s entry function (in place) into the core IR
    `decision` describes: every op once, in its tile and sum loops (those of
    a while's or case's body inside that body)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    entry = entry_function(module)
    graph = decision.graph
    if graph.values[: len(entry.body.block.args)] != list(entry.body.block.args):
        raise PartirValueError("build_core: the decision was made for another module")
    blocks = _program_blocks(decision, entry.body.block)
    every = [o for _, ops in blocks for o in ops]
    _refuse(decision, every)
    builder = _Builder(decision, entry.body.block)  # each op moves to the end as it is built
    if len(blocks) > 1:  # by identity: an op's hash is a Python call
        carriers = {id(graph.ops[o]): o for o in every if graph.kinds[o] in _CARRIERS}
        for block, ops in blocks[1:]:
            parent = block.parent_op()
            assert parent is not None
            builder.bodies.setdefault(carriers[id(parent)], []).append((block, ops))
    for o in every:
        rule = graph.rules[o]
        if rule is not None and decision.op_mask[o]:
            _resize_properties(graph.ops[o], rule, decision, o)
    body = entry.body.block
    # Built with the function's block out of its region: xDSL checks, for
    # every op added to a block, that the op is not among the block's
    # ancestors, a walk up to the module otherwise.
    entry.body.detach_block(body)
    try:
        builder.build_block(body, blocks[0][1], arguments=True)
        dead, relations = builder.dead, builder.relations
        del builder  # its places and slices go before the ids are taken (the peak)
        for o in reversed(every):  # what is left in place is dead
            if dead[o]:
                graph.ops[o].detach()
                graph.ops[o].erase(safe_erase=False)
        engine_order = _EngineOrder(decision, {id(graph.ops[o]): o for o in every})
        for block, _ in blocks:
            for op in block.ops:
                if type(op) is LoopOp:
                    engine_order.order(op)
    finally:
        entry.body.add_block(body)
    relations.seal(body)  # as built: the lowering may read it
    record_built(entry, relations)
    LAST_BUILD_SECONDS[:] = [time.perf_counter() - start, time.process_time() - start_cpu]


def _program_blocks(decision: Decision, entry: Block) -> list[tuple[Block, list[int]]]:
    """The entry's block and every while's or case's body in it (at any
    depth), each with its ops' ids in program order; a reduction's body is
    part of its op, not a block of the program."""
    graph = decision.graph
    by_block: dict[int, list[int]] = {}  # by the block's identity (its hash is a Python call)
    last, ops = -1, []
    for o, op in enumerate(graph.ops):
        parent = id(op.parent)
        if parent != last:  # a block's ops come in runs
            last = parent
            ops = by_block.setdefault(parent, [])
        ops.append(o)
    found: list[tuple[Block, list[int]]] = []
    pending = [entry]
    while pending:
        block = pending.pop(0)
        ops = by_block.get(id(block), [])
        found.append((block, ops))
        for o in ops:
            if graph.kinds[o] in (_WHILE, _BRANCH):
                pending += [b for region in graph.ops[o].regions for b in region.blocks]
    return found


LAST_BUILD_SECONDS = [0.0, 0.0]
"""How long the last `build_core` took, wall-clock and CPU seconds
(`benchmarks.propagation_speed`)."""
