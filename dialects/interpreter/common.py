"""Helpers shared by the StableHLO interpreter families (see `stablehlo`).

Tensor types as NumPy dtypes, typed results, double-precision
widening, and running a region (once on whole arrays when it is elementwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType
from xdsl.interpreter import Interpreter
from xdsl.ir import Attribute, Operation, Region
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.xdsl_extras.traits import Elementwise

from dialects.chlo import ChloBinaryOp, ChloUnaryOp
from dialects.dtypes import element_kind, numpy_dtype
from dialects.regions import binary_combiner

# --------------------------------------------------------------------------
# Types and attributes


def element_dtype(ty: Attribute) -> np.dtype:
    """The NumPy dtype of a tensor type's elements."""
    if not isinstance(ty, TensorType):
        raise InterpretationError(f"expected a tensor type, got {ty}")
    return numpy_dtype(ty.element_type)


def typed(value: Any, ty: Attribute) -> np.ndarray:
    """`value` as an array of exactly the tensor type `ty` (dtype cast, shape checked)."""
    array = np.asarray(value, dtype=element_dtype(ty))
    assert isinstance(ty, TensorType)
    expected = ty.get_shape()
    if len(expected) != array.ndim or any(
        e not in (DYNAMIC_INDEX, s) for e, s in zip(expected, array.shape, strict=True)
    ):
        raise InterpretationError(f"computed a value of shape {array.shape} for type {ty}")
    return array


def elementwise_result(value: Any, ty: Attribute) -> np.ndarray:
    """`value` cast to the element type of `ty`.

    The shape is checked only for results of rank > 0: a region of elementwise
    ops on 0-d tensors may be run on whole arrays at once (see `runs_batched`).
    """
    assert isinstance(ty, TensorType)
    return typed(value, ty) if ty.get_shape() else np.asarray(value, dtype=element_dtype(ty))


def widen(x: np.ndarray) -> np.ndarray:
    """Float and complex arrays in double precision; others unchanged."""
    k = element_kind(x.dtype)
    if k == "f":
        return x.astype(np.float64)
    if k == "c":
        return x.astype(np.complex128)
    return x


def int_dtype(dtype: np.dtype, signed: bool) -> np.dtype:
    return np.dtype(f"{'' if signed else 'u'}int{dtype.itemsize * 8}")


# --------------------------------------------------------------------------
# Regions


def run_region(interp: Interpreter, region: Region, args: Sequence[Any], name: str) -> tuple:
    return tuple(interp.run_ssacfg_region(region, tuple(args), name))


_BATCHABLE = (
    shlo.SelectOp,
    shlo.ClampOp,
    shlo.ConstantOp,
    shlo.ReturnOp,
    ChloUnaryOp,
    ChloBinaryOp,
)


def _is_elementwise(op: Operation) -> bool:
    return op.has_trait(Elementwise) or isinstance(op, _BATCHABLE)


def runs_batched(region: Region) -> bool:
    """Whether `region` maps 0-d tensors through elementwise ops only.

    Such a region computes the same thing on arrays of any shape, element by
    element, so it can be run once on whole arrays.
    """
    block = region.block
    scalar_args = all(isinstance(a.type, TensorType) and not a.type.get_shape() for a in block.args)
    return scalar_args and all(_is_elementwise(op) for op in block.ops)


def scalars(arrays: Sequence[np.ndarray], index: tuple[int, ...]) -> list[np.ndarray]:
    return [np.asarray(a[index]) for a in arrays]


def single_binary_op(region: Region) -> type[Operation] | None:
    """The op class if `region` is `return op(arg0, arg1)` (either operand order)."""
    combine = binary_combiner(region)
    return type(combine) if combine is not None else None
