"""NumPy dtypes for xDSL element types, tensor sizes in bytes, and `dense<...>`
constants as arrays.

The reference interpreter, the JAX emitter and the report all read element
types this way, so it lives beside the dialects, not inside any of them.
bf16 and the 8-bit floats come from `ml_dtypes`, the package JAX itself uses,
so the interpreter's arrays have exactly the dtypes JAX returns.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence

import ml_dtypes
import numpy as np
from xdsl.dialects import builtin
from xdsl.dialects.builtin import (
    ComplexType,
    DenseIntOrFPElementsAttr,
    IntegerType,
    Signedness,
    TensorType,
)
from xdsl.ir import Attribute
from xdsl.utils.exceptions import InterpretationError


class ElementTypeError(InterpretationError):
    """An element type or constant with no NumPy dtype. It is an
    `InterpretationError`, so the reference interpreter reports it as its own;
    the JAX emitter turns it into its `UnsupportedOpError`."""


_FLOATS: dict[type[Attribute], np.dtype] = {
    builtin.Float16Type: np.dtype(np.float16),
    builtin.BFloat16Type: np.dtype(ml_dtypes.bfloat16),
    builtin.Float32Type: np.dtype(np.float32),
    builtin.Float64Type: np.dtype(np.float64),
    builtin.Float8E4M3FNType: np.dtype(ml_dtypes.float8_e4m3fn),
    builtin.Float8E5M2Type: np.dtype(ml_dtypes.float8_e5m2),
    builtin.Float8E4M3FNUZType: np.dtype(ml_dtypes.float8_e4m3fnuz),
    builtin.Float8E5M2FNUZType: np.dtype(ml_dtypes.float8_e5m2fnuz),
    builtin.Float8E4M3B11FNUZType: np.dtype(ml_dtypes.float8_e4m3b11fnuz),
}

_COMPLEX: dict[type[Attribute], np.dtype] = {
    builtin.Float32Type: np.dtype(np.complex64),
    builtin.Float64Type: np.dtype(np.complex128),
}

_INT_WIDTHS = (8, 16, 32, 64)


def numpy_dtype(element_type: Attribute) -> np.dtype:
    """The NumPy dtype holding values of `element_type` (i1 is `bool`).

    Signless integers are signed, as in StableHLO. Raises `ElementTypeError`
    for a type the interpreter has no dtype for.
    """
    if isinstance(element_type, IntegerType):
        width = element_type.width.data
        if width == 1:
            return np.dtype(np.bool_)
        if width in _INT_WIDTHS:
            unsigned = element_type.signedness.data == Signedness.UNSIGNED
            return np.dtype(f"{'u' if unsigned else ''}int{width}")
    elif isinstance(element_type, ComplexType):
        dtype = _COMPLEX.get(type(element_type.element_type))
        if dtype is not None:
            return dtype
    else:
        dtype = _FLOATS.get(type(element_type))
        if dtype is not None:
            return dtype
    raise ElementTypeError(f"the interpreter has no NumPy dtype for element type {element_type}")


def tensor_type(element_type: Attribute, shape: Sequence[int]) -> TensorType:
    """The one `TensorType` of `shape` and `element_type`: types repeat a lot, and
    building one runs xDSL's attribute verifiers (tens of µs each)."""
    return _interned_tensor_type(element_type, tuple(shape))


@functools.lru_cache(maxsize=1 << 16)
def _interned_tensor_type(element_type: Attribute, shape: tuple[int, ...]) -> TensorType:
    return TensorType(element_type, shape)


def tensor_bytes(ty: TensorType) -> int:
    """The bytes a value of the static tensor type `ty` occupies, as XLA
    stores it (i1 takes a byte; a type with no NumPy dtype its bit width,
    rounded up to a byte, or 4 bytes if it has none)."""
    try:
        width = numpy_dtype(ty.element_type).itemsize
    except ElementTypeError:
        width = max(getattr(ty.element_type, "bitwidth", 32), 8) // 8
    count = 1
    for n in ty.get_shape():
        count *= n
    return count * width


def element_kind(dtype: np.dtype) -> str:
    """'b' (i1), 'i' (signed), 'u' (unsigned), 'f' (any float, bf16 too) or 'c' (complex)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biufc":
        return dtype.kind
    if dtype in _FLOATS.values():
        return "f"
    raise ElementTypeError(f"the interpreter does not handle dtype {dtype}")


def dense_to_numpy(attr: Attribute) -> np.ndarray:
    """The value of a `dense<...>` attribute as an array of its type's shape and dtype.

    Reads the attribute's raw bytes (xDSL packs them little-endian, like the
    hosts JAX runs on), so NaN payloads and infinities survive exactly. xDSL
    stores i1 as one byte per element (0x00 / 0xff) and a splat either once or
    expanded; both are accepted.
    """
    assert sys.byteorder == "little", "dense attribute bytes are little-endian"
    if not isinstance(attr, DenseIntOrFPElementsAttr):
        raise ElementTypeError(f"cannot read constant {attr}: not a dense int/float attribute")
    shape = tuple(attr.get_shape())
    dtype = numpy_dtype(attr.get_element_type())
    raw = attr.data.data
    if dtype == np.bool_:
        flat = np.frombuffer(raw, dtype=np.uint8) != 0
    else:
        flat = np.frombuffer(raw, dtype=dtype)
    count = math.prod(shape)
    if flat.size == count:
        return flat.reshape(shape).copy()
    if flat.size == 1:
        return np.full(shape, flat[0], dtype=dtype)
    raise ElementTypeError(
        f"constant of type {attr.type} holds {flat.size} elements, expected {count}"
    )
