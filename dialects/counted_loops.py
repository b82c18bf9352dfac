"""JAX's counted loops, read from a `stablehlo.while`: the counter, the trip
count, and the carried values the loop reads or writes one row per iteration.

`lax.scan` and `fori_loop` lower to a while whose condition compares a carried
counter LT a constant, whose counter starts at a constant and whose body adds
one to it. A scan reads each stacked input with a `dynamic_slice` of one row of
dim 0 at the *row index* and writes each stacked output with a
`dynamic_update_slice` there. The row index is the counter, or
`length - 1 - counter` when the scan runs backwards (the loop JAX's transpose
of a scan makes). The cost model counts iterations by this; a pipeline splits
the rows over stages by it. The same reading holds in the import and in the
SPMD form (there a constant may reach the loop through `spmd.to_local`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.dialects.builtin import DenseArrayBase, DenseIntOrFPElementsAttr, TensorType
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.dialects.stablehlo.attributes import ComparisonDirectionAttr

Affine = tuple[int, int]
"""`(a, b)`: the value `a * counter + b`."""


@dataclass(frozen=True)
class CountedLoop:
    """A `stablehlo.while` in JAX's counted form, and its per-row accesses."""

    op: shlo.WhileOp
    counter: int
    """The carried position of the counter."""
    start: int
    trips: int
    reads: tuple[int, ...]
    """Carried positions the body reads one row of (dim 0) per iteration, at the row index."""
    writes: tuple[int, ...]
    """Carried positions the body writes one row of per iteration, at the row index."""
    reverse: bool | None
    """Whether the row index runs down (`trips - 1 - i`); None when the loop
    reads and writes no row, or the rows do not follow the counter one by one."""

    @property
    def rows(self) -> int | None:
        """The dim-0 size of the values read or written per row, if any."""
        for k in (*self.reads, *self.writes):
            ty = self.op.operands[k].type
            if isinstance(ty, TensorType) and ty.get_num_dims():
                return ty.get_shape()[0]
        return None


def constant_int(value: SSAValue) -> int | None:
    """The integer a scalar (or splat) constant holds, through JAX's SPMD boundary."""
    owner = value.owner
    while isinstance(owner, Operation) and owner.name == "spmd.to_local":
        owner = owner.operands[0].owner
    if not isinstance(owner, Operation) or owner.name != "stablehlo.constant":
        return None
    attr = owner.properties.get("value")
    if not isinstance(attr, DenseIntOrFPElementsAttr):
        return None
    values = attr.get_values()
    if len(set(values)) != 1:
        return None
    number = values[0]
    return int(number) if float(number).is_integer() else None


def trip_count(op: Operation) -> int | None:
    """A `while`'s trip count when it is JAX's counted loop, else None."""
    found = _counter(op)
    return None if found is None else found[2]


def counted_loop(op: Operation) -> CountedLoop | None:
    """`op` read as a counted loop, or None if it is not one."""
    found = _counter(op)
    if found is None:
        return None
    assert isinstance(op, shlo.WhileOp)
    k, start, trips = found
    body = op.body.block
    returned = body.last_op
    assert returned is not None
    index = RowIndex(op, k, start, trips)
    signs: set[int] = set()
    reads: list[int] = []
    writes: list[int] = []
    for inner in body.ops:
        if inner.name == "stablehlo.dynamic_slice":
            carried = _unchanged_carry(inner.operands[0], body)
            sign = index.row_access(inner)
            if carried is not None and sign and _one_row(inner):
                reads.append(carried)
                signs.add(sign)
        elif inner.name == "stablehlo.dynamic_update_slice":
            at = _returned_at(inner, returned)
            sign = index.row_access(inner)
            if (
                at is not None
                and inner.operands[0] is body.args[at]
                and sign
                and _is_row(inner.operands[1].type)
            ):
                writes.append(at)
                signs.add(sign)
    reverse = None if len(signs) != 1 else signs == {-1}
    rows_read, rows_written = tuple(sorted(set(reads))), tuple(sorted(set(writes)))
    return CountedLoop(op, k, start, trips, rows_read, rows_written, reverse)


def _counter(op: Operation) -> tuple[int, int, int] | None:
    """(carried position, start, trip count) of a counted while's counter."""
    if not isinstance(op, shlo.WhileOp):
        return None
    cond, body = op.cond.block, op.body.block
    ret = cond.last_op
    if ret is None or not ret.operands:
        return None
    compare = ret.operands[0].owner
    if not isinstance(compare, Operation) or compare.name != "stablehlo.compare":
        return None
    if _direction(compare) != "LT":
        return None
    counter, limit = compare.operands
    if not isinstance(counter, BlockArgument) or counter.owner is not cond:
        return None
    k = counter.index
    start, stop = constant_int(op.operands[k]), constant_int(limit)
    if start is None or stop is None or not _adds_one(body, k):
        return None
    return k, start, max(stop - start, 0)


def _adds_one(body: Block, index: int) -> bool:
    ret = body.last_op
    if ret is None or len(ret.operands) <= index:
        return False
    step = ret.operands[index].owner
    if not isinstance(step, Operation) or step.name != "stablehlo.add":
        return False
    lhs, rhs = step.operands
    return lhs is body.args[index] and constant_int(rhs) == 1


class RowIndex:
    """Integer scalars of a counted loop's body as `a * counter + b`.

    Read through constants (also ones the loop carries unchanged), adds,
    subtracts and converts, the other carried counters (`fori_loop`'s own
    index beside the loop's: a constant start, one added per iteration), and
    the selects JAX writes to wrap a negative
    index, decided over the counter's range (`i < 0` never holds there)."""

    def __init__(self, op: shlo.WhileOp, counter: int, start: int, trips: int) -> None:
        body = op.body.block
        self.low, self.high = start, start + trips - 1
        self.known: dict[SSAValue, Affine | None] = {body.args[counter]: (1, 0)}
        returned = body.last_op
        assert returned is not None
        for j, arg in enumerate(body.args):
            init = self.of(op.operands[j]) if j != counter else None
            if init is None or init[0] != 0:
                continue
            if _adds_one(body, j):
                self.known[arg] = (1, init[1] - start)
            elif returned.operands[j] is arg:
                self.known[arg] = init  # a constant the loop carries unchanged

    def of(self, value: SSAValue) -> Affine | None:
        if value not in self.known:
            self.known[value] = self._read(value)
        return self.known[value]

    def _read(self, value: SSAValue) -> Affine | None:
        c = constant_int(value)
        if c is not None:
            return (0, c)
        owner = value.owner
        if not isinstance(owner, Operation):
            return None
        if owner.name == "stablehlo.convert":
            return self.of(owner.operands[0])
        if owner.name in ("stablehlo.add", "stablehlo.subtract"):
            lhs, rhs = (self.of(v) for v in owner.operands)
            if lhs is None or rhs is None:
                return None
            sign = 1 if owner.name == "stablehlo.add" else -1
            return (lhs[0] + sign * rhs[0], lhs[1] + sign * rhs[1])
        if owner.name == "stablehlo.select":
            pred, if_true, if_false = owner.operands
            holds = self.holds(pred)
            if holds is not None:
                return self.of(if_true if holds else if_false)
            both = self.of(if_true), self.of(if_false)
            return both[0] if both[0] == both[1] else None
        return None

    def holds(self, pred: SSAValue) -> bool | None:
        """Whether a comparison of two indices holds on every iteration
        (True), on none (False), or it depends (None)."""
        owner = pred.owner
        if not isinstance(owner, Operation) or owner.name != "stablehlo.compare":
            return None
        lhs, rhs = (self.of(v) for v in owner.operands)
        if lhs is None or rhs is None:
            return None
        a, b = lhs[0] - rhs[0], lhs[1] - rhs[1]
        test = _COMPARISONS.get(_direction(owner) or "")
        if test is None:
            return None
        ends = {test(a * i + b, 0) for i in (self.low, self.high)}
        if a and test in (operator.eq, operator.ne) and len(ends) == 1:
            return None  # equal at both ends says nothing in between
        return ends.pop() if len(ends) == 1 else None

    def row_access(self, op: Operation) -> int:
        """+1 when `op` (a dynamic slice or update) accesses row `n` at
        iteration n, -1 when row `trips - 1 - n` (its other start indices 0);
        0 otherwise."""
        first, *rest = op.operands[1 if op.name == "stablehlo.dynamic_slice" else 2 :]
        if any(self.of(v) != (0, 0) for v in rest):
            return 0
        index = self.of(first)
        if index == (1, -self.low):
            return 1
        if index == (-1, self.high):
            return -1
        return 0


_COMPARISONS: dict[str, Callable[[int, int], bool]] = {
    "LT": operator.lt,
    "LE": operator.le,
    "GT": operator.gt,
    "GE": operator.ge,
    "EQ": operator.eq,
    "NE": operator.ne,
}
"""A comparison direction, as a test of `lhs - rhs` against 0."""


def _direction(op: Operation) -> str | None:
    attr = op.properties.get("comparison_direction")
    return attr.data.value if isinstance(attr, ComparisonDirectionAttr) else None


def _one_row(op: Operation) -> bool:
    ty = op.operands[0].type
    sizes = op.properties.get("slice_sizes")
    assert isinstance(ty, TensorType) and isinstance(sizes, DenseArrayBase)
    shape = list(ty.get_shape())
    return bool(shape) and list(sizes.get_values()) == [1, *shape[1:]]


def _is_row(ty: object) -> bool:
    return isinstance(ty, TensorType) and ty.get_num_dims() > 0 and ty.get_shape()[0] == 1


def _unchanged_carry(value: SSAValue, body: Block) -> int | None:
    """The carried position of `value` if it is a body argument the body returns as it is."""
    if not isinstance(value, BlockArgument) or value.owner is not body:
        return None
    returned = body.last_op
    assert returned is not None
    return value.index if returned.operands[value.index] is value else None


def _returned_at(op: Operation, returned: Operation) -> int | None:
    """The carried position `op`'s result is returned at, if exactly one."""
    at = [i for i, v in enumerate(returned.operands) if v is op.results[0]]
    return at[0] if len(at) == 1 else None
