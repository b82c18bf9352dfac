"""Which ops outside the layer loops keep a stacked value's layers apart.

Each stage runs the step's ops outside the loops (embedding, head, update) on
its own layers of every stacked value. That is the step's meaning only when
the op treats the layers apart: a result layer reads only the same layer of
its operands. The full and the stage-local traces align op for op, so an
operand's *cut* dims (where its stage-local shape is smaller) are known; an op
is layerwise when its rule (below) maps every cut operand dim to a cut result
dim without moving, mixing or slicing along it. `p - lr * g` is; `g[::-1]`,
`jnp.cumsum(g, 0)`, or a matmul contracting the layers are not. An op without
a rule that reads a cut value is refused: a stage's answer would be silently
wrong otherwise.

A reduction over the layers (a global gradient norm) is the one exception the
update may make: each stage reduces its own layers and the engine combines the
stages' partials (`LAYER_REDUCTIONS`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

ELEMENTWISE = frozenset(
    """
    abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp complex
    conj convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp
    exp2 expm1 floor ge gt igamma imag integer_pow is_finite le lgamma log log1p logistic
    lt max min mul ne neg nextafter not or population_count pow real reduce_precision rem
    round rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign sin
    sinh sqrt square sub tan tanh xor
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
"""Per operand (or result), the dims whose stage-local size is smaller."""

ACROSS = "across"
"""What `keeps_layers_apart` says of a reduction over the layers."""


def keeps_layers_apart(eqn: Any, operands: Cut, results: Cut) -> bool | str:
    """Whether `eqn` (a full-trace equation) keeps the layers of its cut
    operand dims apart; `ACROSS` for a reduction over them."""
    rule = _RULES.get(eqn.primitive.name)
    if rule is None:
        return eqn.primitive.name in ELEMENTWISE and _same_dims(operands, results)
    return rule(eqn.params, operands, results)


def _same_dims(operands: Cut, results: Cut) -> bool:
    """Elementwise: every cut operand dim is cut in every result."""
    cut = set().union(*operands)
    return all(cut <= r for r in results)


def _mapped(cut: set[int], to: Callable[[int], int | None], result: set[int]) -> bool:
    """Each cut dim maps (by `to`; None: dropped) to a cut result dim."""
    return all((d := to(c)) is not None and d in result for c in cut)


def _broadcast(params: dict[str, Any], operands: Cut, results: Cut) -> bool:
    dims = params["broadcast_dimensions"]
    return _mapped(operands[0], lambda d: dims[d], results[0])


def _transpose(params: dict[str, Any], operands: Cut, results: Cut) -> bool:
    where = {src: dst for dst, src in enumerate(params["permutation"])}
    return _mapped(operands[0], where.get, results[0])


def _squeeze(params: dict[str, Any], operands: Cut, results: Cut) -> bool:
    gone = set(params["dimensions"])
    return _mapped(operands[0], lambda d: None if d in gone else d - sum(g < d for g in gone),
                   results[0])


def _reduce(name: str, params: dict[str, Any], operands: Cut, results: Cut) -> bool | str:
    axes = set(params["axes"])
    cut = operands[0]
    if not cut & axes:
        return _mapped(cut, lambda d: d - sum(a < d for a in axes), results[0])
    return ACROSS if cut <= axes and name in LAYER_REDUCTIONS else False


def _along(key: str) -> Callable[[dict[str, Any], Cut, Cut], bool]:
    """Ops that move, scan or sort along the dims `params[key]` names (an int
    or a sequence): layerwise when none of those is cut."""

    def rule(params: dict[str, Any], operands: Cut, results: Cut) -> bool:
        value = params[key]
        dims = {value} if isinstance(value, int) else set(value)
        return not any(c & dims for c in operands) and _same_dims(operands, results)

    return rule


def _dot(params: dict[str, Any], operands: Cut, results: Cut) -> bool:
    (lc, rc), _ = params["dimension_numbers"]
    return not (operands[0] & set(lc) or operands[1] & set(rc)) and bool(results[0])


def _reshape(params: dict[str, Any], operands: Cut, results: Cut) -> bool:
    """Only a reshape whose cut dim is the leading one in and out: row-major
    order keeps each stage's block of layers one block of the result."""
    return operands[0] <= {0} and results[0] == operands[0]


def _pad(params: dict[str, Any], operands: Cut, results: Cut) -> bool:
    config: Sequence[tuple[int, int, int]] = params["padding_config"]
    return not any(config[d] != (0, 0, 0) for d in operands[0]) and _same_dims(
        operands[:1], results
    )


_RULES: dict[str, Callable[..., bool | str]] = {
    "broadcast_in_dim": _broadcast,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "reshape": _reshape,
    "dot_general": _dot,
    "pad": _pad,
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
