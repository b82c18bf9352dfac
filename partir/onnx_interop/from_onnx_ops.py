"""ONNX -> JAX: each ONNX op of MLPs and transformer blocks as a JAX function.

partir's own converter: the registry's ONNX-to-JAX runtime, jaxonnxruntime
0.3.0 (2023), has no LayerNormalization, Gelu, Greater or GreaterOrEqual
(checked on a hand-built MLP with current JAX: "LayerNormalization is not
implemented"), and jax2onnx converts the other way only.
An op takes its inputs (None for an omitted optional one) and the node's
attributes, and returns its outputs. Inputs that ONNX passes as tensors but
that are static in JAX (a Reshape's shape, a reduction's axes, a Slice's
bounds) must be known when tracing: values known then are NumPy arrays, and
an op whose inputs are all NumPy computes in NumPy (shape arithmetic, as
jax2onnx and PyTorch export it, folds away). Keyed by op type; an op
without an entry is an `OnnxImportError` naming the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from onnx import helper

from dialects.errors import UnsupportedError

Value = Any
"""A NumPy array (known while tracing) or a traced JAX array."""


class OnnxImportError(UnsupportedError):
    """An ONNX graph partir cannot convert; the message names the node."""


def _xp(*values: Value) -> Any:
    known = all(isinstance(v, np.ndarray | np.generic) for v in values if v is not None)
    return np if known else jnp


def static(value: Value, what: str) -> np.ndarray:
    """`value` as a NumPy array: it must be known while tracing."""
    if isinstance(value, np.ndarray | np.generic):
        return np.asarray(value)
    raise OnnxImportError(
        f"{what} is computed from the model's inputs; partir needs it known ahead "
        "(a constant, an initializer or shape arithmetic)"
    )


def _ints(value: Value, what: str) -> list[int]:
    return [int(v) for v in static(value, what).reshape(-1)]


def _axes(attrs: dict[str, Any], inputs: Sequence[Value], position: int) -> list[int] | None:
    if len(inputs) > position and inputs[position] is not None:
        return _ints(inputs[position], "the axes")
    axes = attrs.get("axes")
    return list(axes) if axes is not None else None


Op = Callable[[list[Value], dict[str, Any]], list[Value]]


def _elementwise(name: str) -> Op:
    def run(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
        return [getattr(_xp(*inputs), name)(*inputs)]

    return run


def _variadic(name: str) -> Op:
    def run(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
        xp = _xp(*inputs)
        out = inputs[0]
        for more in inputs[1:]:
            out = getattr(xp, name)(out, more)
        return [out]

    return run


def _unary_jax(fn: Callable[[Any], Any]) -> Op:
    return lambda inputs, attrs: [fn(inputs[0])]


def _reduce(name: str) -> Op:
    def run(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
        x = inputs[0]
        axes = _axes(attrs, inputs, 1)
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(np.ndim(x)))
        return [getattr(_xp(x), name)(x, axis=tuple(axes), keepdims=keep)]

    return run


def _cast(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    dtype = helper.tensor_dtype_to_np_dtype(attrs["to"])
    x = inputs[0]
    return [np.asarray(x).astype(dtype) if _xp(x) is np else jnp.asarray(x).astype(dtype)]


def _reshape(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, shape = inputs[0], _ints(inputs[1], "Reshape's shape")
    if not attrs.get("allowzero", 0):
        shape = [np.shape(x)[i] if s == 0 else s for i, s in enumerate(shape)]
    return [_xp(x).reshape(x, shape)]


def _transpose(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = inputs[0]
    perm = attrs.get("perm") or list(reversed(range(np.ndim(x))))
    return [_xp(x).transpose(x, perm)]


def _matmul(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return [_xp(*inputs).matmul(inputs[0], inputs[1])]


def _gemm(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    alpha = attrs.get("alpha", 1.0)
    out = jnp.matmul(a, b) if alpha == 1.0 else alpha * jnp.matmul(a, b)
    if c is not None:
        beta = attrs.get("beta", 1.0)
        out = out + (beta * c if beta != 1.0 else c)
    return [out]


def _einsum(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return [jnp.einsum(attrs["equation"], *inputs)]


def _softmax(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return [jax.nn.softmax(inputs[0], axis=attrs.get("axis", -1))]


def _layer_norm(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -1) % np.ndim(x)
    axes = tuple(range(axis, np.ndim(x)))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    inv = lax.rsqrt(var + attrs.get("epsilon", 1e-5))
    y = (x - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv]


def _gelu(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    approximate = attrs.get("approximate", "none")
    return [jax.nn.gelu(inputs[0], approximate=approximate == "tanh")]


def _concat(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return [_xp(*inputs).concatenate(inputs, axis=attrs["axis"])]


def _gather(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    data, indices = inputs
    axis = attrs.get("axis", 0)
    xp = _xp(data, indices)
    size = np.shape(data)[axis]
    indices = xp.where(indices < 0, indices + size, indices)
    return [xp.take(data, indices, axis=axis)]


def _expand(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, shape = inputs[0], _ints(inputs[1], "Expand's shape")
    target = np.broadcast_shapes(np.shape(x), tuple(shape))
    return [_xp(x).broadcast_to(x, target)]


def _unsqueeze(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, axes = inputs[0], _axes(attrs, inputs, 1) or []
    rank = np.ndim(x) + len(axes)
    return [_xp(x).expand_dims(x, tuple(a % rank for a in axes))]


def _squeeze(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x, axes = inputs[0], _axes(attrs, inputs, 1)
    if axes is None:
        axes = [i for i, n in enumerate(np.shape(x)) if n == 1]
    return [_xp(x).squeeze(x, tuple(a % np.ndim(x) for a in axes))]


def _slice(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = inputs[0]
    starts, ends = _ints(inputs[1], "Slice's starts"), _ints(inputs[2], "Slice's ends")
    axes = _axes({}, inputs, 3) or list(range(len(starts)))
    given = len(inputs) > 4 and inputs[4] is not None
    steps = _ints(inputs[4], "Slice's steps") if given else [1] * len(starts)
    index: list[Any] = [slice(None)] * np.ndim(x)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[axis % np.ndim(x)] = slice(*slice(start, end, step).indices(np.shape(x)[axis]))
    return [x[tuple(index)]]


def _shape(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    shape = np.asarray(np.shape(inputs[0]), dtype=np.int64)
    return [shape[attrs.get("start", 0) : attrs.get("end", len(shape))]]


def _constant_of_shape(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    shape = _ints(inputs[0], "ConstantOfShape's shape")
    value = attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else value
    return [np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)]


def _range(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    start, limit, delta = (static(v, "Range's bounds").item() for v in inputs)
    return [np.arange(start, limit, delta, dtype=static(inputs[0], "Range's start").dtype)]


def _where(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    return [_xp(*inputs).where(*inputs)]


def _split(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    x = inputs[0]
    axis = attrs.get("axis", 0) % np.ndim(x)
    sizes = _axes({"axes": attrs.get("split")}, inputs, 1)
    count = attrs.get("num_outputs")
    if sizes is None:
        n = count or 1
        sizes = [math.ceil(np.shape(x)[axis] / n)] * n
    cuts = list(np.cumsum(sizes)[:-1])
    return list(_xp(x).split(x, cuts, axis=axis))


def _divide(inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
    """ONNX's integer Div truncates (as C does); a float Div divides."""
    a, b = inputs
    xp = _xp(a, b)
    if np.issubdtype(np.result_type(a, b), np.integer):
        return [xp.trunc(xp.true_divide(a, b)).astype(np.result_type(a, b))]
    return [xp.divide(a, b)]


OPS: dict[str, Op] = {
    "Add": _elementwise("add"),
    "Sub": _elementwise("subtract"),
    "Mul": _elementwise("multiply"),
    "Div": _divide,
    "Pow": _elementwise("power"),
    "Max": _variadic("maximum"),
    "Min": _variadic("minimum"),
    "Sum": _variadic("add"),
    "Equal": _elementwise("equal"),
    "Less": _elementwise("less"),
    "LessOrEqual": _elementwise("less_equal"),
    "Greater": _elementwise("greater"),
    "GreaterOrEqual": _elementwise("greater_equal"),
    "And": _elementwise("logical_and"),
    "Or": _elementwise("logical_or"),
    "Xor": _elementwise("logical_xor"),
    "Not": _elementwise("logical_not"),
    "Where": _where,
    "Exp": _elementwise("exp"),
    "Log": _elementwise("log"),
    "Tanh": _elementwise("tanh"),
    "Neg": _elementwise("negative"),
    "Sqrt": _elementwise("sqrt"),
    "Abs": _elementwise("abs"),
    "Floor": _elementwise("floor"),
    "Ceil": _elementwise("ceil"),
    "Sin": _elementwise("sin"),
    "Cos": _elementwise("cos"),
    "Reciprocal": _elementwise("reciprocal"),
    "Identity": lambda i, a: [i[0]],
    "Sigmoid": _unary_jax(jax.nn.sigmoid),
    "Relu": _unary_jax(jax.nn.relu),
    "Erf": _unary_jax(jax.scipy.special.erf),
    "Gelu": _gelu,
    "Softmax": _softmax,
    "LayerNormalization": _layer_norm,
    "Cast": _cast,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "ReduceMean": _reduce("mean"),
    "ReduceSum": _reduce("sum"),
    "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"),
    "ReduceProd": _reduce("prod"),
    "Concat": _concat,
    "Gather": _gather,
    "Expand": _expand,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Shape": _shape,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Split": _split,
}
