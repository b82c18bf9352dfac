"""A layer loop split over stages: each stage's loop runs its own rows.

A counted loop over L rows equals S loops over L / S rows run one after
another, each on its consecutive rows of every value the loop reads or
writes a row of, the carried values flowing from one to the next. That is
what a pipeline stage runs: `split_rows` rewrites the loop in place (its
row-carried values the stage's rows, its condition against L / S, a reversed
loop's row index `L / S - 1 - i`), and refuses a body that reads a stacked
value other than row by row, since a stage has only its own rows. Where a
stage holds chunks that are not adjacent (the interleaved schedule),
`deal_chunks` deals it its rows from the stages' consecutive rows, and back.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl_jax.dialects import stablehlo as shlo

from dialects.counted_loops import CountedLoop
from dialects.escaping import quoted
from dialects.names import op_name
from dialects.spmd import CollectivePermuteOp
from partir.pipeline.builder import Builder
from partir.pipeline.layer_loops import PipelineError
from rewrites.padding import splat

ROW_ACCESSES = {"stablehlo.dynamic_slice": 1, "stablehlo.dynamic_update_slice": 2}
"""The ops that read or write a row, by the operand position of their row index."""


def split_rows(loop: CountedLoop, parts: int, axis: str = "stage") -> None:
    """Make `loop` run one stage's rows of `parts` (in place); see the module."""
    op = loop.op
    if loop.reverse is None or loop.start != 0:
        raise PipelineError(
            f"Pipeline({quoted(axis)}): the layer loop does not count its rows from 0 one "
            "by one; write the layers as a lax.scan over the stacked parameters"
        )
    if loop.trips % parts:
        raise PipelineError(
            f"Pipeline({quoted(axis)}): {loop.trips} layers do not split over {parts} "
            f"stages; use an axis of a size dividing {loop.trips}, or a stack of a "
            f"multiple of {parts} layers"
        )
    rows = loop.trips // parts
    body, cond = op.body.block, op.cond.block
    counter = body.args[loop.counter]
    carried = sorted({*loop.reads, *loop.writes})
    for k in carried:
        _check_row_uses(body.args[k], k, axis)
        if cond.args[k].uses:
            raise PipelineError(
                f"Pipeline({quoted(axis)}): the layer loop's condition reads a stacked "
                "value; a stage has only its own layers"
            )
    for k in carried:
        ty = op.results[k].type  # the whole rows (its operand may be a stage's already)
        assert isinstance(ty, TensorType)
        n, *rest = ty.get_shape()
        local = TensorType(ty.get_element_type(), [n // parts, *rest])
        for value in (body.args[k], cond.args[k], op.results[k]):
            Rewriter.replace_value_with_new_type(value, local)
        for update in _updates_of(body.args[k]):
            Rewriter.replace_value_with_new_type(update.results[0], local)
    _set_limit(op, loop.counter, rows)
    if loop.reverse:
        stacked = _row_values(body, carried)
        for access in list(body.ops):
            if access.name in ROW_ACCESSES and access.operands[0] in stacked:
                last = splat(_scalar(counter), rows - 1)
                index = shlo.SubtractOp(last.results[0], counter, counter.type)
                Rewriter.insert_op([last, index], InsertPoint.before(access))
                access.operands[ROW_ACCESSES[access.name]] = index.results[0]
    _erase_dead(list(body.ops))


def deal_chunks(
    b: Builder,
    values: Sequence[SSAValue],
    stage: SSAValue,
    axis: str,
    stages: int,
    chunks: int,
    cyclic: bool,
) -> list[SSAValue]:
    """A stage's rows of stacked `values` (dim 0: its `chunks` chunks, in
    order) from the block layout (stage `s` holds chunks `s * chunks` on) to
    the cyclic one (chunk `c` on stage `c % stages`, as its chunk `c //
    stages`), or back (`cyclic=False`). The values of one element type move
    together, flattened into one buffer per chunk: per pair of a chunk's
    place on the sender and on the receiver, one `spmd.collective_permute`
    over `axis` of the stages that trade it (at most `chunks`^2 in all); a
    chunk that stays is kept."""
    dealt: dict[SSAValue, SSAValue] = {}
    for element_type in {v.type.get_element_type() for v in values}:  # type: ignore[attr-defined]
        group = [v for v in values if v.type.get_element_type() == element_type]  # type: ignore[attr-defined]
        shapes = [v.type.get_shape() for v in group]  # type: ignore[attr-defined]
        sizes = [math.prod(shape) // chunks for shape in shapes]
        n = shapes[0][0] // chunks  # rows a chunk
        pairs = list(zip(group, sizes, strict=True))
        parts = [
            b.concat([b.reshape(b.rows(v, 0, q * n, (q + 1) * n), [k]) for v, k in pairs])
            for q in range(chunks)
        ]
        packed = _deal_parts(b, parts, stage, axis, stages, cyclic)
        starts = itertools.accumulate(sizes[:-1], initial=0)
        for v, shape, size, at in zip(group, shapes, sizes, starts, strict=True):
            dealt[v] = b.concat(
                [b.reshape(b.rows(part, 0, at, at + size), [n, *shape[1:]]) for part in packed]
            )
    return [dealt[v] for v in values]


def _deal_parts(
    b: Builder, parts: list[SSAValue], stage: SSAValue, axis: str, stages: int, cyclic: bool
) -> list[SSAValue]:
    """`deal_chunks` of one buffer per chunk (`parts`): the buffers each stage holds after."""
    chunks = len(parts)
    places = [
        ((c // chunks, c % chunks), (c % stages, c // stages)) for c in range(stages * chunks)
    ]
    whole = b.concat(parts)
    size = parts[0].type.get_shape()[0]  # type: ignore[attr-defined]
    dealt = []
    for p in range(chunks):
        moved: SSAValue | None = None
        kept = [-1] * stages  # per stage, its own place of the chunk it keeps at p
        for q in range(chunks):
            pairs = []
            for block, cycle in places:
                (src, at), (dst, to) = (block, cycle) if cyclic else (cycle, block)
                if (to, at) == (p, q):
                    if src == dst:
                        kept[dst] = q
                    else:
                        pairs.append((src, dst))
            if pairs:
                got = b.add(CollectivePermuteOp(parts[q], [axis], pairs)).results[0]
                moved = got if moved is None else b.sum(moved, got)  # one sender per stage
        if any(q >= 0 for q in kept):
            own = b.rows_at(whole, b.of_stage([max(q, 0) for q in kept], stage), size)
            keeps = b.cmp(b.of_stage(kept, stage), b.const(0), "GE")
            moved = own if moved is None else b.select(keeps, own, moved)
        assert moved is not None
        dealt.append(moved)
    return dealt


def _row_values(body: Block, carried: list[int]) -> set[SSAValue]:
    """The body's stacked values: the row-carried arguments and the rows written into them."""
    found: set[SSAValue] = set()
    for k in carried:
        arg = body.args[k]
        found.add(arg)
        found.update(u.results[0] for u in _updates_of(arg))
    return found


def _updates_of(value: SSAValue) -> list[Operation]:
    """The chain of dynamic_update_slices writing rows into `value`."""
    chain: list[Operation] = []
    while True:
        nxt = [
            u.operation
            for u in value.uses
            if u.operation.name == "stablehlo.dynamic_update_slice" and u.index == 0
        ]
        if not nxt:
            return chain
        chain.append(nxt[0])
        value = nxt[0].results[0]


def _check_row_uses(arg: SSAValue, k: int, axis: str) -> None:
    """Refuse a body that uses a stacked value other than row by row."""
    for value in (arg, *(u.results[0] for u in _updates_of(arg))):
        for use in value.uses:
            user = use.operation
            if user.name in ROW_ACCESSES and use.index == 0:
                continue
            if user.name == "stablehlo.return" and use.index == k:
                continue
            raise PipelineError(
                f"Pipeline({quoted(axis)}): the layer loop's {op_name(user)} reads all "
                f"layers of the stacked value it carries at position {k}; a stage has only "
                "its own layers: read one layer per step (the scan's xs)"
            )


def _set_limit(op: Operation, counter: int, rows: int) -> None:
    """The loop's condition compares the counter against `rows`."""
    assert isinstance(op, shlo.WhileOp)
    ret = op.cond.block.last_op
    assert ret is not None
    compare = ret.operands[0].owner
    assert isinstance(compare, Operation)
    limit = splat(_scalar(op.cond.block.args[counter]), rows)
    Rewriter.insert_op(limit, InsertPoint.before(compare))
    compare.operands[1] = limit.results[0]
    _erase_dead(list(op.cond.block.ops))


def _scalar(value: SSAValue) -> TensorType:
    ty = value.type
    assert isinstance(ty, TensorType)
    return ty


def _erase_dead(ops: list[Operation]) -> None:
    """Erase the ops (in reverse order) whose results nothing uses any more."""
    for op in reversed(ops):
        if op.results and all(not r.uses for r in op.results) and op.name != "stablehlo.return":
            if op.name in ("stablehlo.constant", "stablehlo.subtract", "stablehlo.add"):
                op.detach()
                op.erase()
