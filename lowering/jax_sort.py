"""`stablehlo.sort` as `lax.sort`, `chlo.top_k` as `lax.top_k`.

`lax.sort` has no comparator argument: it always orders by the first
`num_keys` operands, ascending, in the total order JAX writes into the
comparator (-0.0 equal to 0.0, NaNs last and equal). So the emitter
recognises a comparator by what it computes, not by how it is written: it
runs the region in the reference interpreter on probe values (NaNs, zeros of
both signs, infinities, extremes) and accepts it when it agrees with that
order on the first k operands for some k. Any other comparator (descending,
custom) is refused with what to write instead.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Region

from dialects.chlo import TopKOp
from dialects.dtypes import numpy_dtype
from dialects.interpreter import make_interpreter
from dialects.interpreter.common import run_region, runs_batched
from dialects.stablehlo_ext import SortOp
from lowering.jax_ir import unsupported
from lowering.jax_literals import tuple_literal

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter


def probe_values(dtype: np.dtype) -> np.ndarray:
    """Values that tell orders apart: extremes, zeros of both signs, NaN."""
    if dtype == np.bool_:
        return np.array([False, True])
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.array(sorted({info.min, -1 if info.min < 0 else 0, 0, 1, info.max}), dtype)
    return np.array([np.nan, -np.inf, -1.5, -0.0, 0.0, 1.5, np.inf], dtype)


def _key(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """JAX's sort key: NaNs after everything, -0.0 as 0.0."""
    if np.issubdtype(values.dtype, np.floating):
        nan = np.isnan(values)
        return nan, np.where(nan | (values == 0), 0, values)
    return np.zeros(values.shape, bool), values


def _ascending(lhs: list[np.ndarray], rhs: list[np.ndarray], keys: int) -> np.ndarray:
    """Lexicographic less-than on the first `keys` operands, in JAX's order."""
    less = np.zeros(lhs[0].shape, bool)
    equal = np.ones(lhs[0].shape, bool)
    for a, b in zip(lhs[:keys], rhs[:keys], strict=True):
        (a_nan, a_value), (b_nan, b_value) = _key(a), _key(b)
        a_less = (~a_nan & b_nan) | (~a_nan & ~b_nan & (a_value < b_value))
        a_equal = (a_nan & b_nan) | (~a_nan & ~b_nan & (a_value == b_value))
        less |= equal & a_less
        equal &= a_equal
    return less


def region_values(region: Region, args: list[np.ndarray]) -> np.ndarray:
    """The first result of a scalar region on each element of `args` (1-d
    arrays of probes), run by the reference interpreter."""
    interp = make_interpreter(ModuleOp([]))
    if runs_batched(region):
        return np.asarray(run_region(interp, region, args, "probed region")[0])
    return np.array([
        np.asarray(run_region(interp, region, [a[i] for a in args], "probed region")[0])
        for i in range(len(args[0]))
    ])


def ascending_keys(op: SortOp) -> int | None:
    """The k for which `op`'s comparator is `lax.sort`'s ascending order on
    its first k operands, if any."""
    dtypes = [numpy_dtype(v.type.element_type) for v in op.inputs
              if isinstance(v.type, TensorType)]
    if len(dtypes) != len(op.inputs):
        return None
    # every combination of probes for the first two operands; the others vary together
    grids = [probe_values(d) for d in dtypes]
    pairs = list(itertools.product(*[range(len(g)) for g in grids[:2]], repeat=2))
    lhs, rhs = [], []
    for k, grid in enumerate(grids):
        if k < 2:
            lhs.append(grid[[p[k] for p in pairs]])
            rhs.append(grid[[p[len(grids[:2]) + k] for p in pairs]])
        else:
            lhs.append(np.resize(grid, len(pairs)))
            rhs.append(np.resize(grid[::-1], len(pairs)))
    args = [v for pair in zip(lhs, rhs, strict=True) for v in pair]
    got = np.broadcast_to(np.asarray(region_values(op.comparator, args), bool), lhs[0].shape)
    for keys in range(1, len(op.inputs) + 1):
        if np.array_equal(got, _ascending(lhs, rhs, keys)):
            return keys
    return None


def emit_sort(em: BodyEmitter, op: SortOp) -> str:
    """`lax.sort(operands, dimension, is_stable, num_keys)`."""
    keys = ascending_keys(op)
    if keys is None:
        raise unsupported(
            op,
            "its comparator is not lax.sort's ascending order (sort a negated or "
            "transformed key instead, as jnp.sort(-x) does for a descending sort)",
        )
    names = [em.name(v) for v in op.inputs]
    operand = names[0] if len(names) == 1 else tuple_literal(names)
    return (
        f"lax.sort({operand}, dimension={op.axis}, is_stable={op.stable}, num_keys={keys})"
    )


def emit_top_k(em: BodyEmitter, op: TopKOp) -> str:
    """`lax.top_k(x, k)`: (values, indices)."""
    return f"lax.top_k({em.name(op.operand)}, {op.count})"
