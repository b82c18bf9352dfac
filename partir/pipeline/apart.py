"""Which ops keep the slices of a split dim apart: layers, and rows.

A pipelined step runs code on a part of a dim and means the whole:

- each stage runs the ops outside the layer loops (embedding, head, update)
  on its own layers of every stacked value;
- each time step runs the layer loops on one microbatch's rows, and the
  head's gradient of one microbatch is read from its rows alone.

That is the step's meaning only when the op treats the slices apart: a result
slice reads only the same slice of its operands. Two traces of the step that
differ only in that dim's size align op for op, so each value's *cut* dims
(where its size differs) are known; an op keeps them apart when its rule
(below) maps every cut operand dim to a cut result dim without moving,
mixing or slicing along it. `p - lr * g` does; `g[::-1]`, `jnp.cumsum(g, 0)`,
a matmul contracting the layers, or `out @ out.T` over the rows do not. An op
without a rule that reads a cut value does not either: a stage's answer would
be silently wrong otherwise.

A reduction over the cut dims is `ACROSS` (`keeps_apart`): the update may
reduce over the layers (a global gradient norm; the engine combines the
stages' partials, `LAYER_REDUCTIONS`). Over the rows, `reads_across` follows
each value: the backward loop may sum over the examples into the gradients
(they add up over microbatches anyway), and the loss may sum them, so long as
the gradient it hands the loop does not read the sum. Calls and scans are
looked into.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from jax.extend.core import Literal

from partir.pipeline.equations import CALLS, called

ELEMENTWISE = frozenset(
    """
    abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp complex
    conj convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp
    exp2 expm1 floor ge gt igamma imag integer_pow is_finite le lgamma log log1p logistic
    lt max min mul ne neg nextafter not or population_count pow real reduce_precision rem
    round rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign sin
    sinh sqrt square stop_gradient sub tan tanh xor
    """.split()
)
"""jaxpr primitives that act on each element apart (scalar operands broadcast)."""

LAYER_REDUCTIONS = {
    "reduce_sum": "sum",
    "reduce_max": "max",
    "reduce_min": "min",
    "reduce_and": "min",
    "reduce_or": "max",
}
"""Reductions the update may run over the layers of a stacked value, by how
stages' partial results combine."""

Cut = list[set[int]]
"""Per operand (or result), its cut dims: where its size differs between the
two traces (a stage's layers against all; fewer rows against more)."""

ACROSS = "across"
"""What `keeps_apart` says of a reduction over the cut dims."""


def keeps_apart(eqn: Any, operands: Cut, results: Cut) -> bool | str:
    """Whether `eqn` keeps the slices of its cut operand dims apart; `ACROSS`
    for a reduction over them."""
    rule = _RULES.get(eqn.primitive.name)
    if rule is None:
        return eqn.primitive.name in ELEMENTWISE and _same_dims(operands, results)
    return rule(eqn, operands, results)


def makes_along_cut(eqn: Any, results: Cut) -> bool:
    """Whether `eqn`, reading no cut value, makes one that differs along its
    cut dims (random bits, an iota along them): a part of the batch or a
    stage's layers would then get other values than its part of the whole.
    A broadcast copies along them, so it does not."""
    if not any(results):
        return False
    name = eqn.primitive.name
    if name == "iota":
        return eqn.params["dimension"] in results[0]
    return name not in ("broadcast_in_dim", *ELEMENTWISE)


def _same_dims(operands: Cut, results: Cut) -> bool:
    """Elementwise: every cut operand dim is cut in every result."""
    cut = set().union(*operands)
    return all(cut <= r for r in results)


def _mapped(cut: set[int], to: Callable[[int], int | None], result: set[int]) -> bool:
    """Each cut dim maps (by `to`; None: dropped) to a cut result dim."""
    return all((d := to(c)) is not None and d in result for c in cut)


def _broadcast(eqn: Any, operands: Cut, results: Cut) -> bool:
    dims = eqn.params["broadcast_dimensions"]
    return _mapped(operands[0], lambda d: dims[d], results[0])


def _transpose(eqn: Any, operands: Cut, results: Cut) -> bool:
    where = {src: dst for dst, src in enumerate(eqn.params["permutation"])}
    return _mapped(operands[0], where.get, results[0])


def _squeeze(eqn: Any, operands: Cut, results: Cut) -> bool:
    gone = set(eqn.params["dimensions"])
    return _mapped(operands[0], lambda d: None if d in gone else d - sum(g < d for g in gone),
                   results[0])


def _reduce(name: str, eqn: Any, operands: Cut, results: Cut) -> bool | str:
    axes = set(eqn.params["axes"])
    cut = operands[0]
    if not cut & axes:
        return _mapped(cut, lambda d: d - sum(a < d for a in axes), results[0])
    return ACROSS if cut <= axes and name in LAYER_REDUCTIONS else False


def _along(key: str) -> Callable[[Any, Cut, Cut], bool]:
    """Ops that move, scan or sort along the dims `params[key]` names (an int
    or a sequence): layerwise when none of those is cut."""

    def rule(eqn: Any, operands: Cut, results: Cut) -> bool:
        value = eqn.params[key]
        dims = {value} if isinstance(value, int) else set(value)
        return not any(c & dims for c in operands) and _same_dims(operands, results)

    return rule


def _dot(eqn: Any, operands: Cut, results: Cut) -> bool:
    """Cut dims may be batch dims (of both) or free dims of one side: contracting
    them sums across slices, and free on both sides pairs every slice with
    every other (`out @ out.T` over the rows)."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = operands
    if lhs & set(lc) or rhs & set(rc):
        return False
    return not (lhs - set(lb) and rhs - set(rb)) and bool(results[0])


def _reshape(eqn: Any, operands: Cut, results: Cut) -> bool:
    """Only a reshape whose cut dim is the leading one in and out: row-major
    order keeps each stage's block of layers one block of the result."""
    return operands[0] <= {0} and results[0] == operands[0]


def _pad(eqn: Any, operands: Cut, results: Cut) -> bool:
    config: Sequence[tuple[int, int, int]] = eqn.params["padding_config"]
    return not any(config[d] != (0, 0, 0) for d in operands[0]) and _same_dims(
        operands[:1], results
    )


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.aval.shape)


def _slice(eqn: Any, operands: Cut, results: Cut) -> bool:
    """A slice keeps the cut dims apart when it takes them whole (start 0,
    stride 1, to the end): `out[1:]` over the rows shifts them."""
    params, size = eqn.params, _shape(eqn.invars[0])
    strides = params["strides"] or (1,) * len(size)
    return all(
        params["start_indices"][d] == 0 and strides[d] == 1
        and params["limit_indices"][d] == size[d]
        for d in operands[0]
    ) and _same_dims(operands[:1], results)


def _dynamic_slice(eqn: Any, operands: Cut, results: Cut) -> bool:
    """Whole along each cut dim (a start past 0 is clamped back to 0 then)."""
    size = _shape(eqn.invars[0])
    return all(eqn.params["slice_sizes"][d] == size[d] for d in operands[0]) and _same_dims(
        operands[:1], results
    )


def _update_slice(eqn: Any, operands: Cut, results: Cut) -> bool:
    """`dynamic_update_slice`: the update spans each cut dim of the operand."""
    target, update = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    return all(update[d] == target[d] for d in operands[0]) and _same_dims(
        operands[:2], results
    )


def _split(eqn: Any, operands: Cut, results: Cut) -> bool:
    return eqn.params["axis"] not in operands[0] and _same_dims(operands, results)


def _top_k(eqn: Any, operands: Cut, results: Cut) -> bool:
    """`top_k` works along the last dim."""
    return len(_shape(eqn.invars[0])) - 1 not in operands[0] and _same_dims(operands, results)


def _skipping(taken: Sequence[int], count: int) -> list[int]:
    """The first `count` positions not in `taken`, in order."""
    found: list[int] = []
    position = 0
    while len(found) < count:
        if position not in taken:
            found.append(position)
        position += 1
    return found


def _gather(eqn: Any, operands: Cut, results: Cut) -> bool:
    """A gather keeps the cut dims apart when each is a batching dim (as
    `take_along_axis` gathers per row) or a window dim taken whole (its
    result dim is cut too: a fixed window would be a slice along it), and the
    indices' cut dims are result batch dims (a per-row lookup)."""
    dn = eqn.params["dimension_numbers"]
    source, indices = operands
    out = results[0]
    skipped = (*dn.collapsed_slice_dims, *dn.operand_batching_dims)
    windows = _skipping(skipped, len(eqn.params["slice_sizes"]) - len(skipped))
    for d in source:
        if d in dn.operand_batching_dims:
            paired = dn.start_indices_batching_dims[dn.operand_batching_dims.index(d)]
            if paired not in indices:
                return False
        elif d in dn.start_index_map or d in dn.collapsed_slice_dims:
            return False
        elif dn.offset_dims[windows.index(d)] not in out:
            return False
    batch = _skipping(dn.offset_dims, max(indices, default=-1) + 1)
    return all(batch[i] in out for i in indices)


def _scatter(eqn: Any, operands: Cut, results: Cut) -> bool:
    """A scatter keeps the cut dims apart when each operand cut dim is a
    batching dim or a window dim, and the updates' cut scatter dims belong to
    the indices' batching dims (a row's updates land in that row); scattering
    rows into shared slots would sum across them."""
    dn = eqn.params["dimension_numbers"]
    target, indices, updates = operands[0], operands[1], operands[2]
    if results[0] != target:
        return False
    for d in target:
        if d not in dn.operand_batching_dims and (
            d in dn.inserted_window_dims or d in dn.scatter_dims_to_operand_dims
        ):
            return False
    spread = sorted(u for u in updates if u not in dn.update_window_dims)
    scatter_dims = _skipping(dn.update_window_dims, max(spread, default=-1) + 1)
    batching = set(dn.scatter_indices_batching_dims)
    return all(scatter_dims.index(u) in batching for u in spread) and indices <= batching


_RULES: dict[str, Callable[..., bool | str]] = {
    "broadcast_in_dim": _broadcast,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "reshape": _reshape,
    "dot_general": _dot,
    "pad": _pad,
    "gather": _gather,
    "slice": _slice,
    "dynamic_slice": _dynamic_slice,
    "split": _split,
    "top_k": _top_k,
    "dynamic_update_slice": _update_slice,
    "scatter-add": _scatter,
    "scatter_add": _scatter,
    "scatter": _scatter,
    "concatenate": _along("dimension"),
    "rev": _along("dimensions"),
    "cumsum": _along("axis"),
    "cumprod": _along("axis"),
    "cummax": _along("axis"),
    "cummin": _along("axis"),
    "cumlogsumexp": _along("axis"),
    "sort": _along("dimension"),
    **{
        name: functools.partial(_reduce, name)
        for name in ("argmax", "argmin", "reduce_prod", *LAYER_REDUCTIONS)
    },
}
"""Per primitive, how its operand dims reach its result dims."""


def cut_dims(big: Any, small: Any) -> set[int]:
    """The dims where a value of the smaller trace is smaller."""
    if isinstance(big, Literal):
        return set()
    return {
        d
        for d, (m, n) in enumerate(zip(big.aval.shape, small.aval.shape, strict=True))
        if m != n
    }


CLEAN, SUMMED, MIXED = 0, 1, 2
"""How a value reads across the cut dims: not at all; as a sum over them
followed only by linear ops (what adding up per-slice results gives too); or
any other way."""

LINEAR = frozenset(
    """
    add add_any sub neg convert_element_type copy copy_p transpose reshape
    broadcast_in_dim squeeze reduce_sum concatenate mul div dot_general select_n
    stop_gradient
    """.split()
)
"""Ops linear in each operand (`mul`, `div` and `dot_general` in one of them:
`_linear_in`), so a sum of per-slice values passes through them unchanged."""


def _linear_in(name: str, states: list[int]) -> bool:
    """Whether `name` is linear in its SUMMED operands."""
    summed = [i for i, state in enumerate(states) if state == SUMMED]
    if name in ("mul", "dot_general"):
        return len(summed) == 1
    if name == "div":
        return summed == [0]
    if name == "select_n":
        return 0 not in summed
    return True


def _sums_cut(eqn: Any, operands: Cut) -> bool:
    """A `reduce_sum` over the cut dims, or a `dot_general` contracting them."""
    name = eqn.primitive.name
    if name == "reduce_sum":
        return bool(operands[0]) and operands[0] <= set(eqn.params["axes"])
    if name == "dot_general":
        (lc, rc), _ = eqn.params["dimension_numbers"]
        lhs, rhs = operands
        return bool(lhs or rhs) and lhs <= set(lc) and rhs <= set(rc)
    return False


def reads_across(
    big: Any, small: Any, given: Sequence[int] | None = None
) -> tuple[list[int], str | None]:
    """Per output of jaxpr `big` (against `small`, the same jaxpr traced with
    the cut dims smaller), CLEAN, SUMMED or MIXED, its inputs being `given`
    (CLEAN by default); and the first op that made a value MIXED."""
    state = dict(zip(big.invars, given, strict=True)) if given is not None else {}
    return _follow(big.eqns, small.eqns, big.outvars, state)


def reads_across_eqns(
    big: Sequence[Any], small: Sequence[Any], outvars: Sequence[Any]
) -> tuple[list[int], str | None]:
    """`reads_across` of a run of equations, for the values `outvars`."""
    return _follow(big, small, outvars, {})


def _follow(
    big: Sequence[Any], small: Sequence[Any], outvars: Sequence[Any], state: dict[Any, int]
) -> tuple[list[int], str | None]:
    """Each value's state, equation by equation. Calls and scans are followed
    inside, from their operands' states. Runs that do not align are MIXED."""
    if len(big) != len(small) or any(
        a.primitive is not b.primitive for a, b in zip(big, small, strict=True)
    ):
        return [MIXED] * len(outvars), "an op traced differently per batch size"
    first: str | None = None
    for a, b in zip(big, small, strict=True):
        name = a.primitive.name
        states = [CLEAN if isinstance(v, Literal) else state.get(v, CLEAN) for v in a.invars]
        operands = [cut_dims(x, y) for x, y in zip(a.invars, b.invars, strict=True)]
        if name in CALLS or name == "scan":
            made, inner_first = _inside(a, b, operands, states)
            if MIXED in made and MIXED not in states and first is None:
                first = inner_first or name
            state.update(zip(a.outvars, made, strict=True))
            continue
        if MIXED in states:
            one = MIXED
        elif SUMMED in states:
            one = SUMMED if name in LINEAR and _linear_in(name, states) else MIXED
        elif _sums_cut(a, operands):
            one = SUMMED
        else:
            results = [cut_dims(x, y) for x, y in zip(a.outvars, b.outvars, strict=True)]
            if not any(operands):
                one = MIXED if makes_along_cut(a, results) else CLEAN
            else:
                one = CLEAN if keeps_apart(a, operands, results) is True else MIXED
        if one == MIXED and MIXED not in states and first is None:
            first = name
        for var in a.outvars:
            state[var] = one
    return [CLEAN if isinstance(v, Literal) else state.get(v, CLEAN) for v in outvars], first


def _inside(a: Any, b: Any, operands: Cut, states: list[int]) -> tuple[list[int], str | None]:
    """The states of the call or scan `a`'s results, from its operands'
    `states`, and the first op inside that mixed. A scan's carries are
    followed until their states settle (they only rise)."""
    name = a.primitive.name
    if name != "scan":
        return reads_across(called(a)[0], called(b)[0], states)
    consts, carries = a.params["num_consts"], a.params["num_carry"]
    if any(0 in c for c in operands[consts + carries :]):
        return [MIXED] * len(a.outvars), name  # it steps along a cut dim
    given = list(states)
    while True:
        made, first = reads_across(called(a)[0], called(b)[0], given)
        carried = [max(x, y) for x, y in zip(given[consts : consts + carries], made[:carries],
                                              strict=True)]
        if carried == given[consts : consts + carries]:
            return [*carried, *made[carries:]], first
        given[consts : consts + carries] = carried
