"""CHLO's ops on NumPy arrays: the elementwise ones and `top_k`.

CHLO has no formal spec; each op is the mathematical function its name says,
evaluated in double precision (SciPy for the special functions) and rounded
once to the result type, like the StableHLO ops. At the poles of digamma
(0, -1, -2, ...) the result is NaN, as XLA gives. `top_k` orders floats by
the IEEE total order (-NaN < -inf < -0.0 < 0.0 < inf < NaN), as XLA does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls

from dialects.chlo import BINARY_CLASSES, UNARY_CLASSES, TopKOp
from dialects.interpreter.common import typed, widen
from dialects.interpreter.elementwise import elementwise_impl, in_double


def _digamma(x: np.ndarray) -> np.ndarray:
    pole = (x <= 0) & (x == np.floor(x))
    return np.where(pole, np.nan, scipy.special.digamma(x))


def _polygamma(n: np.ndarray, x: np.ndarray) -> np.ndarray:
    """polygamma(n, x) for integral n >= 0; NaN for any other n."""
    valid = (n >= 0) & (n == np.floor(n))
    order = np.where(valid, n, 0).astype(np.int64)
    return np.where(valid, scipy.special.polygamma(order, x), np.nan)


def _square(x: np.ndarray) -> np.ndarray:
    wide = widen(x)
    return wide * wide  # integers wrap


UNARY: dict[str, Callable[..., Any]] = {
    "acos": in_double(np.arccos),
    "acosh": in_double(np.arccosh),
    "asin": in_double(np.arcsin),
    "asinh": in_double(np.arcsinh),
    "atan": in_double(np.arctan),
    "atanh": in_double(np.arctanh),
    "bessel_i1e": in_double(scipy.special.i1e),
    "conj": np.conj,
    "cosh": in_double(np.cosh),
    "digamma": in_double(_digamma),
    "erf": in_double(scipy.special.erf),
    "erf_inv": in_double(scipy.special.erfinv),
    "erfc": in_double(scipy.special.erfc),
    "is_inf": in_double(np.isinf),
    "is_neg_inf": in_double(np.isneginf),
    "is_pos_inf": in_double(np.isposinf),
    "lgamma": in_double(scipy.special.gammaln),
    "sinh": in_double(np.sinh),
    "square": _square,
    "tan": in_double(np.tan),
}

BINARY: dict[str, Callable[..., Any]] = {
    "next_after": np.nextafter,  # in the operands' own type: the next float *of that type*
    "polygamma": in_double(_polygamma),
    "zeta": in_double(scipy.special.zeta),
}


def total_order_key(x: np.ndarray) -> np.ndarray:
    """Integers ordered as `x` is in the IEEE total order (floats), or `x`:
    a float's bits as a signed integer, with the negatives' order reversed."""
    if not np.issubdtype(x.dtype, np.floating):
        return x.astype(np.int64)
    signed = np.dtype(f"int{8 * x.dtype.itemsize}")
    bits = x.view(signed).astype(np.int64)
    return np.where(bits < 0, np.iinfo(signed).min - bits - 1, bits)


def top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest along the last dim, largest first; ties in index order."""
    order = np.argsort(-total_order_key(x), axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, axis=-1), order


class ChloFunctions(InterpreterFunctions):
    """Implementations of every op in `dialects.chlo` (see `UNARY` and `BINARY`)."""

    @impl(TopKOp)
    def run_top_k(self, interp: Interpreter, op: TopKOp, args: PythonValues) -> PythonValues:
        values, indices = top_k(np.asarray(args[0]), op.count)
        return typed(values, op.values.type), typed(indices, op.indices.type)


for _name, _fn in UNARY.items():
    setattr(ChloFunctions, f"run_{_name}", elementwise_impl(UNARY_CLASSES[_name], _fn))
for _name, _fn in BINARY.items():
    setattr(ChloFunctions, f"run_{_name}", elementwise_impl(BINARY_CLASSES[_name], _fn))
register_impls(ChloFunctions)
