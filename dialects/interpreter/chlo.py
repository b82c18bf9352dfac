"""CHLO's elementwise ops on NumPy arrays.

CHLO has no formal spec; each op is the mathematical function its name says,
evaluated in double precision (SciPy for the special functions) and rounded
once to the result type, like the StableHLO ops. At the poles of digamma
(0, -1, -2, ...) the result is NaN, as XLA gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special
from xdsl.interpreter import InterpreterFunctions, register_impls

from dialects.chlo import BINARY_CLASSES, UNARY_CLASSES
from dialects.interpreter.common import widen
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


class ChloFunctions(InterpreterFunctions):
    """Implementations of every op in `dialects.chlo` (see `UNARY` and `BINARY`)."""


for _name, _fn in UNARY.items():
    setattr(ChloFunctions, f"run_{_name}", elementwise_impl(UNARY_CLASSES[_name], _fn))
for _name, _fn in BINARY.items():
    setattr(ChloFunctions, f"run_{_name}", elementwise_impl(BINARY_CLASSES[_name], _fn))
register_impls(ChloFunctions)
