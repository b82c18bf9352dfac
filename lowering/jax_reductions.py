"""Emitters for contractions and reductions: `dot_general`, `convolution`,
`reduce`, `reduce_window` and `select_and_scatter`.

A reduction whose body is a single commutative op of its two arguments
becomes `lax.reduce(x, init, lax.add, dims)` (`lax.reduce_window(...)`); any
other body is emitted as a nested `def` that lax calls.

`select_and_scatter` (the gradient of max / min pooling) has no `jax.lax`
function; it is emitted as the JAX primitive it came from, through a helper
calling `jax._src.lax.windowed_reductions._select_and_scatter`, with its
`select` region recognised by what it computes (`lax.ge`, `lax.le`, ...: the
region is run on probe values, as `lowering.jax_sort` recognises a
comparator) and its `scatter` region a single commutative op (`lax.add`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np
from xdsl.dialects.builtin import ArrayAttr
from xdsl.ir import Block, Operation, Region
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.dialects.stablehlo.attributes import Precision, PrecisionAttr

from dialects import stablehlo_ext as ext
from dialects.attributes import ints
from dialects.convolution import ConvolutionOp
from dialects.regions import binary_combiner
from lowering.jax_elementwise import ON_BOOLEANS, function_of
from lowering.jax_ir import by_name, element_dtype, unsupported
from lowering.jax_literals import tuple_literal
from lowering.jax_sort import probe_values, region_values

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter


def _precision(config: ArrayAttr | None) -> str:
    """`, precision=(...)` unless every operand's precision is the default."""
    if config is None:
        return ""
    levels = [cast(PrecisionAttr, p).data for p in config.data]
    if all(p == Precision.DEFAULT for p in levels):
        return ""
    names = ", ".join(f"lax.Precision.{Precision(p).name}" for p in levels)
    return f", precision=({names})"


def emit_dot_general(em: BodyEmitter, op: shlo.DotGeneralOp) -> str:
    if op.algorithm is not None:
        raise unsupported(op, "dot algorithms are not supported")
    dn = op.dot_dimension_numbers
    contracting = (ints(dn.lhs_contracting_dimensions), ints(dn.rhs_contracting_dimensions))
    batch = (ints(dn.lhs_batching_dimensions), ints(dn.rhs_batching_dimensions))
    result = em.dtype(op, op.results[0].type)
    return (
        f"lax.dot_general({em.args(op)}, ({contracting!r}, {batch!r})"
        f"{_precision(op.precision_config)}, preferred_element_type={result})"
    )


def emit_convolution(em: BodyEmitter, op: ConvolutionOp) -> str:
    """`lax.conv_general_dilated` with the op's layouts as `lax.ConvDimensionNumbers`
    (a reversed window is a `lax.rev` of the kernel first)."""
    lhs, kernel, out = op.layouts
    rhs = em.name(op.rhs)
    flipped = tuple(kernel.spatial[k] for k, flip in enumerate(op.reversed_window) if flip)
    if flipped:
        rhs = f"lax.rev({rhs}, {flipped!r})"
    layouts = ", ".join(
        f"{name}={(layout.major, layout.minor, *layout.spatial)!r}"
        for name, layout in (
            ("lhs_spec", lhs),
            ("rhs_spec", replace(kernel, major=kernel.minor, minor=kernel.major)),
            ("out_spec", out),
        )
    )
    result = em.dtype(op, op.result.type)
    return (
        f"lax.conv_general_dilated({em.name(op.lhs)}, {rhs}, {op.strides!r}, {op.pads!r}, "
        f"{op.lhs_dilations!r}, {op.rhs_dilations!r}, lax.ConvDimensionNumbers({layouts}), "
        f"feature_group_count={op.feature_groups}, batch_group_count={op.batch_groups}"
        f"{_precision(op.precision_config)}, preferred_element_type={result})"
    )


_REDUCERS: dict[str, str] = by_name(
    {
        shlo.AddOp: "lax.add",
        shlo.MaximumOp: "lax.max",
        shlo.MinimumOp: "lax.min",
        shlo.MultiplyOp: "lax.mul",
        shlo.AndOp: "lax.bitwise_and",
        shlo.OrOp: "lax.bitwise_or",
        shlo.XorOp: "lax.bitwise_xor",
    }
)


def _single_reducer(op: ext.ReduceOp | ext.ReduceWindowOp) -> str | None:
    """`lax.add` etc. if the body is one commutative op of its two arguments."""
    return _reducer_function(op.body) if len(op.inputs) == 1 else None


def _reducer_function(region: Region) -> str | None:
    """`lax.add` etc. if `region` is one commutative op of its two arguments."""
    combine = binary_combiner(region)
    if combine is None or combine.name not in _REDUCERS:
        return None
    return function_of(combine) if combine.name in ON_BOOLEANS else _REDUCERS[combine.name]


def emit_reduce(em: BodyEmitter, op: ext.ReduceOp) -> str:
    """`lax.reduce(x, init, lax.add, dims)`, or a nested function for other bodies."""
    dims = ints(op.dimensions)
    inputs = [em.name(v) for v in op.inputs]
    inits = [em.name(v) for v in op.init_values]
    reducer = _single_reducer(op)
    if reducer is None:
        reducer = _emit_region_function(em, op, op.body.block, len(op.inputs))
    if len(op.inputs) == 1:
        return f"lax.reduce({inputs[0]}, {inits[0]}, {reducer}, {dims!r})"
    return f"lax.reduce({tuple_literal(inputs)}, {tuple_literal(inits)}, {reducer}, {dims!r})"


def _emit_region_function(em: BodyEmitter, op: Operation, block: Block, count: int) -> str:
    """A nested `def` computing a reduction body: `(acc, x) -> acc`.

    For `count` > 1 operands lax passes and expects tuples.
    """
    name = em.fresh_function("reducer")
    params = [em.define(a) for a in block.args]
    if count == 1:
        em.write(f"def {name}({', '.join(params)}):")
    else:
        em.write(f"def {name}(acc, x):")
    with em.indented():
        if count > 1:
            em.write(f"{', '.join(params[:count])} = acc")
            em.write(f"{', '.join(params[count:])} = x")
        *body, ret = list(block.ops)
        if ret.name != "stablehlo.return":
            raise unsupported(op, "the reduction body does not end in stablehlo.return")
        em.emit_ops(body)
        values = [em.name(v) for v in ret.operands]
        em.write(f"return {values[0]}" if count == 1 else f"return {tuple_literal(values)}")
    return name


def emit_reduce_window(em: BodyEmitter, op: ext.ReduceWindowOp) -> str:
    """`lax.reduce_window(x, init, lax.add, window, strides, padding, base
    dilation, window dilation)`: jnp.cumsum, pooling."""
    if len(op.inputs) != 1:
        raise unsupported(op, "a reduce_window over several inputs is not supported")
    reducer = _single_reducer(op) or _emit_region_function(em, op, op.body.block, 1)
    return (
        f"lax.reduce_window({em.name(op.inputs[0])}, {em.name(op.init_values[0])}, {reducer}, "
        f"{op.window!r}, {op.strides!r}, {op.pads!r}, {op.base_dilation!r}, "
        f"{op.window_dilation!r})"
    )


SELECT_AND_SCATTER_HELPER = '''
def _select_and_scatter(operand, select, window, strides, padding, source, init, scatter):
    """`stablehlo.select_and_scatter`: JAX's primitive (jax.lax exports no function)."""
    from jax._src.lax.windowed_reductions import _select_and_scatter as select_and_scatter
    return select_and_scatter(operand, select, window, strides, padding, source, init, scatter)
'''

_SELECTS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "lax.ge": np.greater_equal,
    "lax.le": np.less_equal,
    "lax.gt": np.greater,
    "lax.lt": np.less,
}


def _select_function(op: ext.SelectAndScatterOp) -> str | None:
    """The `lax` comparison `op`'s select region computes on every pair of
    probe values (NaNs, zeros of both signs, extremes), if any."""
    probes = probe_values(element_dtype(op, op.operand.type))
    lhs, rhs = np.repeat(probes, len(probes)), np.tile(probes, len(probes))
    with np.errstate(all="ignore"):
        got = np.broadcast_to(np.asarray(region_values(op.select, [lhs, rhs]), bool), lhs.shape)
    for name, compare in _SELECTS.items():
        if np.array_equal(got, compare(lhs, rhs)):
            return name
    return None


def emit_select_and_scatter(em: BodyEmitter, op: ext.SelectAndScatterOp) -> str:
    """`_select_and_scatter(operand, lax.ge, window, strides, padding, source,
    init, lax.add)`: the gradient of max pooling."""
    select = _select_function(op)
    if select is None:
        raise unsupported(
            op, "its select region is not lax.ge, lax.le, lax.gt or lax.lt of its two "
            "arguments (as the gradients of max and min pooling write it)",
        )
    scatter = _reducer_function(op.scatter)
    if scatter is None:
        raise unsupported(
            op, "its scatter region is not one commutative op (lax.add, lax.max, ...) of its "
            "two arguments",
        )
    helper = em.tables.helper("_select_and_scatter", SELECT_AND_SCATTER_HELPER)
    return (
        f"{helper}({em.name(op.operand)}, {select}, {op.window!r}, {op.strides!r}, "
        f"{op.pads!r}, {em.name(op.source)}, {em.name(op.init_value)}, {scatter})"
    )
