"""StableHLO -> ONNX: the nodes each StableHLO op of a partir program becomes.

partir's own mapping, op by op, on the global (imported) program: an op
becomes one ONNX node where ONNX has its twin (`add` -> Add, `dot_general`
-> MatMul or Einsum, `reduce` of an `add` body -> ReduceSum) or a short chain
(`broadcast_in_dim` -> Reshape, Expand; `rsqrt` -> Sqrt, Reciprocal);
constants and iotas become initializers. Keyed by op name, as the JAX
emitter's tables are (`lowering/jax_elementwise.py`). An op without a
mapping is an `UnsupportedError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue

from dialects.attributes import ints
from dialects.dtypes import dense_to_numpy, numpy_dtype
from dialects.errors import UnsupportedError
from dialects.names import op_name


class OnnxExportError(UnsupportedError):
    """An op or type the ONNX export has no faithful mapping for."""


def shape_of(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(int(d) for d in value.type.get_shape())


def dtype_of(value: SSAValue) -> np.dtype:
    assert isinstance(value.type, TensorType)
    return numpy_dtype(value.type.element_type)


def onnx_type(value: SSAValue) -> int:
    return helper.np_dtype_to_tensor_dtype(dtype_of(value))


@dataclass
class GraphBuilder:
    """The nodes, initializers and value names of the graph being built."""

    names: dict[SSAValue, str] = field(default_factory=dict)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    node_ops: list[int] = field(default_factory=list)
    """Per node, the number of the StableHLO op it came from."""
    op_number: int = -1

    def fresh(self, stem: str) -> str:
        name, n = stem, 0
        while name in self.taken:
            n += 1
            name = f"{stem}_{n}"
        self.taken.add(name)
        return name

    def name(self, value: SSAValue) -> str:
        return self.names[value]

    def node(self, op_type: str, inputs: list[str], **attributes: Any) -> str:
        """Add a node with one output; returns the output's name."""
        output = self.fresh(f"t{len(self.nodes)}")
        node_name = self.fresh(f"{op_type}_{len(self.nodes)}")
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=node_name, **attributes))
        self.node_ops.append(self.op_number)
        return output

    def constant(self, array: np.ndarray, stem: str = "c") -> str:
        name = self.fresh(f"{stem}{len(self.initializers)}")
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def int64s(self, values: tuple[int, ...] | list[int]) -> str:
        return self.constant(np.asarray(values, dtype=np.int64), "shape")


Exporter = Callable[[GraphBuilder, Operation], str]

ELEMENTWISE: dict[str, str] = {
    "stablehlo.add": "Add",
    "stablehlo.subtract": "Sub",
    "stablehlo.multiply": "Mul",
    "stablehlo.divide": "Div",
    "stablehlo.maximum": "Max",
    "stablehlo.minimum": "Min",
    "stablehlo.power": "Pow",
    "stablehlo.and": "And",
    "stablehlo.or": "Or",
    "stablehlo.xor": "Xor",
    "stablehlo.exponential": "Exp",
    "stablehlo.log": "Log",
    "stablehlo.tanh": "Tanh",
    "stablehlo.negate": "Neg",
    "stablehlo.sqrt": "Sqrt",
    "stablehlo.abs": "Abs",
    "stablehlo.logistic": "Sigmoid",
    "stablehlo.floor": "Floor",
    "stablehlo.ceil": "Ceil",
    "stablehlo.sine": "Sin",
    "stablehlo.cosine": "Cos",
    "stablehlo.not": "Not",
    "chlo.erf": "Erf",
}
ON_BOOLEANS = {"stablehlo.add": "Or", "stablehlo.multiply": "And"}
"""StableHLO's i1 add is a logical or, its multiply an and."""

COMPARISONS = {
    "EQ": "Equal",
    "LT": "Less",
    "LE": "LessOrEqual",
    "GT": "Greater",
    "GE": "GreaterOrEqual",
}
REDUCTIONS: dict[str, tuple[str, str]] = {  # reducer body op -> (ONNX reduction, combiner)
    "stablehlo.add": ("ReduceSum", "Add"),
    "stablehlo.maximum": ("ReduceMax", "Max"),
    "stablehlo.minimum": ("ReduceMin", "Min"),
    "stablehlo.multiply": ("ReduceProd", "Mul"),
}


def _args(b: GraphBuilder, op: Operation) -> list[str]:
    return [b.name(v) for v in op.operands]


def export_elementwise(b: GraphBuilder, op: Operation) -> str:
    table = ON_BOOLEANS if dtype_of(op.operands[0]) == np.bool_ else {}
    return b.node(table.get(op.name) or ELEMENTWISE[op.name], _args(b, op))


def export_select(b: GraphBuilder, op: Operation) -> str:
    """Where, but on booleans (which onnxruntime's Where lacks) or(and(c, a), and(not c, b))."""
    if dtype_of(op.results[0]) != np.bool_:
        return b.node("Where", _args(b, op))
    pred, on_true, on_false = _args(b, op)
    chosen = b.node("And", [pred, on_true])
    return b.node("Or", [chosen, b.node("And", [b.node("Not", [pred]), on_false])])


def export_rsqrt(b: GraphBuilder, op: Operation) -> str:
    return b.node("Reciprocal", [b.node("Sqrt", _args(b, op))])


def export_compare(b: GraphBuilder, op: Operation) -> str:
    direction = op.properties["comparison_direction"].data.value  # type: ignore[attr-defined]
    if direction == "NE":
        return b.node("Not", [b.node("Equal", _args(b, op))])
    return b.node(COMPARISONS[direction], _args(b, op))


def export_convert(b: GraphBuilder, op: Operation) -> str:
    return b.node("Cast", _args(b, op), to=onnx_type(op.results[0]))


def export_constant(b: GraphBuilder, op: Operation) -> str:
    return b.constant(dense_to_numpy(op.properties["value"]))


def export_iota(b: GraphBuilder, op: Operation) -> str:
    shape = shape_of(op.results[0])
    dim = int(op.properties["iota_dimension"].value.data)  # type: ignore[attr-defined]
    ramp = np.arange(shape[dim], dtype=dtype_of(op.results[0]))
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return b.constant(np.broadcast_to(ramp.reshape(view), shape).copy(), "iota")


def export_broadcast_in_dim(b: GraphBuilder, op: Operation) -> str:
    (operand,) = op.operands
    dims = ints(op.properties["broadcast_dimensions"])
    source, target = shape_of(operand), shape_of(op.results[0])
    name = b.name(operand)
    order = sorted(range(len(dims)), key=lambda k: dims[k])
    if order != list(range(len(dims))):
        name = b.node("Transpose", [name], perm=order)
        source, dims = tuple(source[k] for k in order), tuple(dims[k] for k in order)
    view = [1] * len(target)
    for k, d in enumerate(dims):
        view[d] = source[k]
    if tuple(view) != source:
        name = b.node("Reshape", [name, b.int64s(view)])
    if tuple(view) != target:
        name = b.node("Expand", [name, b.int64s(target)])
    if name == b.name(operand):
        name = b.node("Identity", [name])
    return name


def export_reshape(b: GraphBuilder, op: Operation) -> str:
    return b.node("Reshape", [*_args(b, op), b.int64s(shape_of(op.results[0]))])


def export_transpose(b: GraphBuilder, op: Operation) -> str:
    return b.node("Transpose", _args(b, op), perm=list(ints(op.properties["permutation"])))


def export_concatenate(b: GraphBuilder, op: Operation) -> str:
    axis = int(op.properties["dimension"].value.data)  # type: ignore[attr-defined]
    return b.node("Concat", _args(b, op), axis=axis)


def export_slice(b: GraphBuilder, op: Operation) -> str:
    starts, limits = ints(op.properties["start_indices"]), ints(op.properties["limit_indices"])
    strides = ints(op.properties["strides"])
    axes = list(range(len(starts)))
    inputs = [b.int64s(starts), b.int64s(limits), b.int64s(axes), b.int64s(strides)]
    return b.node("Slice", [b.name(op.operands[0]), *inputs])


def export_dot_general(b: GraphBuilder, op: Operation) -> str:
    """MatMul where the dims are numpy's matmul's (batch dims leading, the
    lhs's last against the rhs's next-to-last), Einsum otherwise."""
    dn = op.properties["dot_dimension_numbers"]
    lhs_batch, rhs_batch = ints(dn.lhs_batching_dimensions), ints(dn.rhs_batching_dimensions)  # type: ignore[attr-defined]
    lhs_con = ints(dn.lhs_contracting_dimensions)  # type: ignore[attr-defined]
    rhs_con = ints(dn.rhs_contracting_dimensions)  # type: ignore[attr-defined]
    lhs, rhs = op.operands
    lrank, rrank = len(shape_of(lhs)), len(shape_of(rhs))
    nb = len(lhs_batch)
    leading = lhs_batch == rhs_batch == tuple(range(nb))
    if (
        leading
        and lhs_con == (lrank - 1,)
        and rhs_con == (rrank - 2,)
        and rrank == nb + 2
        and (lrank == nb + 2 if nb else lrank >= 1)
    ):
        out = b.node("MatMul", _args(b, op))
    else:
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        lhs_l = [next(letters) for _ in range(lrank)]
        rhs_l = [next(letters) for _ in range(rrank)]
        for lb, rb in zip(lhs_batch, rhs_batch, strict=True):
            rhs_l[rb] = lhs_l[lb]
        for lc, rc in zip(lhs_con, rhs_con, strict=True):
            rhs_l[rc] = lhs_l[lc]
        free_l = [lhs_l[d] for d in range(lrank) if d not in lhs_batch and d not in lhs_con]
        free_r = [rhs_l[d] for d in range(rrank) if d not in rhs_batch and d not in rhs_con]
        result = [lhs_l[d] for d in lhs_batch] + free_l + free_r
        equation = f"{''.join(lhs_l)},{''.join(rhs_l)}->{''.join(result)}"
        out = b.node("Einsum", _args(b, op), equation=equation)
    if dtype_of(op.results[0]) != dtype_of(lhs):
        out = b.node("Cast", [out], to=onnx_type(op.results[0]))
    return out


def export_reduce(b: GraphBuilder, op: Operation) -> str:
    """ReduceSum/Max/Min/Prod over the dims; the init is combined in unless
    it is the reduction's identity (a constant 0 for a sum, -inf for a max...)."""
    body = list(op.regions[0].block.ops)
    if len(op.operands) != 2 or len(body) != 2 or body[0].name not in REDUCTIONS:
        raise OnnxExportError(
            f"ONNX export: {op_name(op)} reduces with a body ONNX has no reduction for; "
            "only single-input add, max, min and multiply reductions export"
        )
    reduction, combiner = REDUCTIONS[body[0].name]
    data, init = op.operands
    dims = ints(op.properties["dimensions"])
    out = b.node(reduction, [b.name(data), b.int64s(dims)], keepdims=0)
    if not _is_identity(init, reduction):
        out = b.node(combiner, [out, b.name(init)])
    return out


def _is_identity(init: SSAValue, reduction: str) -> bool:
    owner = init.owner
    if not isinstance(owner, Operation) or owner.name != "stablehlo.constant":
        return False
    value = dense_to_numpy(owner.properties["value"])
    kind = value.dtype.kind
    identity = {
        "ReduceSum": 0,
        "ReduceProd": 1,
        "ReduceMax": -np.inf if kind == "f" else np.iinfo(value.dtype).min if kind in "iu" else 0,
        "ReduceMin": np.inf if kind == "f" else np.iinfo(value.dtype).max if kind in "iu" else 1,
    }[reduction]
    return bool(np.all(value == identity))


EXPORTERS: dict[str, Exporter] = {
    **dict.fromkeys(ELEMENTWISE, export_elementwise),
    "stablehlo.rsqrt": export_rsqrt,
    "stablehlo.select": export_select,
    "stablehlo.compare": export_compare,
    "stablehlo.convert": export_convert,
    "stablehlo.constant": export_constant,
    "stablehlo.iota": export_iota,
    "stablehlo.broadcast_in_dim": export_broadcast_in_dim,
    "stablehlo.reshape": export_reshape,
    "stablehlo.transpose": export_transpose,
    "stablehlo.concatenate": export_concatenate,
    "stablehlo.slice": export_slice,
    "stablehlo.dot_general": export_dot_general,
    "stablehlo.reduce": export_reduce,
}


def export_op(b: GraphBuilder, op: Operation) -> str:
    exporter = EXPORTERS.get(op.name)
    if exporter is None:
        known = ", ".join(sorted(n.split(".", 1)[1] for n in EXPORTERS))
        raise OnnxExportError(
            f"ONNX export: {op_name(op)} has no ONNX mapping in partir; the ops that "
            f"export are {known}"
        )
    if len(op.results) != 1:
        raise OnnxExportError(f"ONNX export: {op_name(op)} has {len(op.results)} results")
    return exporter(b, op)
