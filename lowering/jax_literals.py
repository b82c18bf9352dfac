"""Python source text for values: dtypes, scalars, tuples, specs and constants.

Every literal reads back exactly: floats as the shortest decimal that round
trips (NaN/inf by name), dtypes as `jnp.<name>`, constants as `np.full` for
splats, inline `np.array` literals for small arrays, and base64 bytes in the
module's `_CONSTANTS` table for large ones.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl_jax.dialects import stablehlo as shlo

from dialects.distribution import Distribution
from dialects.dtypes import ElementTypeError, dense_to_numpy, element_kind
from lowering.jax_ir import UnsupportedOpError, tensor_type, unsupported

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter

INLINE_CONSTANT_LIMIT = 64
"""Non-splat constants with more elements than this go to the `_CONSTANTS` table."""

_BASE64_CHUNK = 76


# --------------------------------------------------------------------------
# Dtypes and scalars


def dtype_literal(dtype: np.dtype) -> str:
    """`jnp.float32`, `jnp.bfloat16`, `jnp.bool_`, ..."""
    name = "bool_" if dtype == np.bool_ else dtype.name
    import jax.numpy as jnp

    if not hasattr(jnp, name):
        raise UnsupportedOpError(f"jax.numpy has no dtype {name}")
    return f"jnp.{name}"


def _float_literal(value: Any, dtype: np.dtype) -> str:
    """The shortest decimal that reads back as exactly `value`; NaN/inf by name."""
    number = float(value)
    if math.isnan(number):
        return "np.nan"
    if math.isinf(number):
        return "np.inf" if number > 0 else "-np.inf"
    short = str(value)
    try:
        exact = np.asarray(float(short)).astype(dtype).tobytes() == np.asarray(value).tobytes()
    except ValueError:
        exact = False
    return short if exact else repr(number)


def _scalar_literal(value: Any, dtype: np.dtype) -> str:
    kind = element_kind(dtype)
    if kind == "b":
        return repr(bool(value))
    if kind in "iu":
        return str(int(value))
    if kind == "c":
        part = np.dtype(f"float{dtype.itemsize * 4}")
        real = _float_literal(np.real(value).astype(part), part)
        imag = _float_literal(np.imag(value).astype(part), part)
        return f"complex({real}, {imag})"
    return _float_literal(value, dtype)


# --------------------------------------------------------------------------
# Tuples, axes, partition specs, comments


def tuple_literal(items: Sequence[str]) -> str:
    """A Python tuple display of already-formatted items: `(a,)`, `(a, b)`, `()`."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def axes_literal(axes: Sequence[str]) -> str:
    """A tuple of axis names: `('batch',)`, `('batch', 'model')`."""
    return repr(tuple(axes))


def partition_spec(dist: Distribution) -> str:
    """`P('batch', None)`: the source of `dist`'s PartitionSpec; `P()` for rank 0."""
    return "P(" + ", ".join(repr(entry) for entry in dist.spec()) + ")"


def comment_text(text: str) -> str:
    """`text` made safe inside a `#` comment: printable ASCII, no line breaks."""
    return ascii(text)[1:-1]


# --------------------------------------------------------------------------
# Constants


def _is_splat(array: np.ndarray) -> bool:
    if array.size == 0:
        return True
    rows = array.reshape(-1).view(np.uint8).reshape(array.size, -1)
    return bool((rows == rows[0]).all())


def emit_constant(em: BodyEmitter, op: shlo.ConstantOp) -> str | None:
    """Splats as `np.full`, small arrays as literals, large ones via `_CONSTANTS`."""
    ty = tensor_type(op, op.results[0].type)
    dtype_name = em.dtype(op, ty)
    try:
        array = dense_to_numpy(op.value)
    except ElementTypeError as error:
        raise unsupported(op, str(error)) from None
    shape = tuple(int(d) for d in ty.get_shape())
    if _is_splat(array):
        first = array.reshape(-1)[0] if array.size else np.zeros((), array.dtype)
        return f"np.full({shape!r}, {_scalar_literal(first, array.dtype)}, {dtype_name})"
    if array.size <= INLINE_CONSTANT_LIMIT:
        items = ", ".join(_scalar_literal(v, array.dtype) for v in array.reshape(-1))
        return f"np.array([{items}], dtype={dtype_name}).reshape({shape!r})"
    key = em.tables.constant(_table_entry(array, dtype_name, shape))
    em.write(f"{em.define(op.results[0])} = _CONSTANTS[{key!r}]")
    return None


def _table_entry(array: np.ndarray, dtype_name: str, shape: tuple[int, ...]) -> str:
    """`np.frombuffer(base64.b64decode(...))` rebuilding `array` bit for bit."""
    data = base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")
    chunks = [data[i : i + _BASE64_CHUNK] for i in range(0, len(data), _BASE64_CHUNK)] or [""]
    body = "\n".join(f'            "{c}"' for c in chunks)
    return (
        "np.frombuffer(\n"
        "        base64.b64decode(\n"
        f"{body}\n"
        "        ),\n"
        f"        dtype={dtype_name},\n"
        f"    ).reshape({shape!r})"
    )
