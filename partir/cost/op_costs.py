"""What one op of the SPMD program costs a device: FLOPs and memory traffic
from its local (per-device) types, the inputs of a roofline.

Every op partir can emit is in exactly one `Kind` (`KINDS`; a test checks
the emitter's op table against it, so a new op cannot go uncosted):

- `MATMUL`: dot_general and convolution, 2 FLOPs per multiply-add;
- `ELEMENTWISE`: one FLOP per result element. XLA fuses chains of these (and
  broadcasts, converts, iotas) into one kernel, so a fusible op whose every
  user is fusible too is `fused`: its result never goes to memory, and it
  launches no kernel of its own;
- `REDUCTION`: one FLOP per input element (reduce, reduce_window, sort's
  comparisons n log n);
- `MOVEMENT`: no FLOPs, its bytes in and out (transpose, slice, gather, ...).
  A transpose whose every user is elementwise is fused into them too, as
  XLA's loop fusion takes it: it writes nothing, and each kernel it is
  fused into reads its operand in the other order (`OpCost.strided_bytes`,
  at `Device.transposed_rate`: on a CPU a strided read that misses the
  caches, several times slower than a stream);
- `FREE`: a view or a boundary (reshape, to_local, a splat constant): nothing;
- `CONTROL`: while, if, case: the cost of their regions (`partir.cost.estimate`);
- `COLLECTIVE`: the SPMD collectives, costed by `partir.cost.collective_costs`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute, Operation, SSAValue

from dialects.dtypes import dense_to_numpy, tensor_bytes


class Kind(Enum):
    MATMUL = "matmul"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    MOVEMENT = "movement"
    FREE = "free"
    CONTROL = "control"
    COLLECTIVE = "collective"


_UNARY = (
    "abs cbrt ceil cosine count_leading_zeros exponential exponential_minus_one floor imag "
    "is_finite log log_plus_one logistic negate not popcnt real rsqrt sign sine sqrt tan tanh "
    "round_nearest_afz round_nearest_even reduce_precision"
)
_BINARY = (
    "add and atan2 complex divide maximum minimum multiply or power remainder shift_left "
    "shift_right_arithmetic shift_right_logical subtract xor compare select clamp convert"
)
_CHLO = (
    "acos acosh asin asinh atan atanh bessel_i1e conj cosh digamma erf erf_inv erfc is_inf "
    "is_neg_inf is_pos_inf lgamma next_after polygamma sinh square tan zeta"
)

KINDS: dict[str, Kind] = {
    **{f"stablehlo.{n}": Kind.ELEMENTWISE for n in (*_UNARY.split(), *_BINARY.split())},
    **{f"chlo.{n}": Kind.ELEMENTWISE for n in _CHLO.split()},
    "stablehlo.broadcast_in_dim": Kind.ELEMENTWISE,
    "stablehlo.iota": Kind.ELEMENTWISE,
    "spmd.axis_index": Kind.ELEMENTWISE,  # the device's index, like an iota
    "stablehlo.bitcast_convert": Kind.ELEMENTWISE,
    "stablehlo.rng_bit_generator": Kind.ELEMENTWISE,
    "stablehlo.constant": Kind.FREE,  # a literal in the executable (bytes, if not a splat)
    "stablehlo.reshape": Kind.FREE,
    "stablehlo.optimization_barrier": Kind.FREE,
    "sdy.sharding_constraint": Kind.FREE,  # the value itself (an annotation)
    "spmd.to_local": Kind.FREE,
    "spmd.from_local": Kind.FREE,
    "stablehlo.dot_general": Kind.MATMUL,
    "stablehlo.convolution": Kind.MATMUL,
    "stablehlo.reduce": Kind.REDUCTION,
    "stablehlo.reduce_window": Kind.REDUCTION,
    "stablehlo.select_and_scatter": Kind.REDUCTION,
    "stablehlo.sort": Kind.REDUCTION,
    "chlo.top_k": Kind.REDUCTION,
    "stablehlo.transpose": Kind.MOVEMENT,
    "stablehlo.reverse": Kind.MOVEMENT,
    "stablehlo.concatenate": Kind.MOVEMENT,
    "stablehlo.slice": Kind.MOVEMENT,
    "stablehlo.dynamic_slice": Kind.MOVEMENT,
    "stablehlo.dynamic_update_slice": Kind.MOVEMENT,
    "stablehlo.pad": Kind.MOVEMENT,
    "stablehlo.gather": Kind.MOVEMENT,
    "stablehlo.scatter": Kind.MOVEMENT,
    "spmd.local_slice": Kind.MOVEMENT,
    "stablehlo.while": Kind.CONTROL,
    "stablehlo.if": Kind.CONTROL,
    "stablehlo.case": Kind.CONTROL,
    "spmd.all_reduce": Kind.COLLECTIVE,
    "spmd.all_gather": Kind.COLLECTIVE,
    "spmd.reduce_scatter": Kind.COLLECTIVE,
    "spmd.all_to_all": Kind.COLLECTIVE,
    "spmd.collective_permute": Kind.COLLECTIVE,
}
"""Op name -> how it is costed (see the module docstring)."""

_FUSIBLE = frozenset({Kind.ELEMENTWISE, Kind.FREE})
_MATERIALISING = frozenset({"spmd.from_local", "stablehlo.optimization_barrier"})
"""Free ops whose operands are in memory all the same: a program's result is
written to its own buffer, and a barrier is where XLA stops fusing."""


@dataclass(frozen=True)
class OpCost:
    """One op on one device: FLOPs, bytes read and written, its element type
    (which peak applies), and whether it runs as a kernel of its own."""

    kind: Kind
    flops: float
    bytes: float
    element_type: str
    kernel: bool
    smallest_dim: int = 0
    """A matmul's smallest of M, N and K (its rate depends on it:
    `Device.efficiency`); 0 for other ops."""
    strided_bytes: float = 0
    """Bytes a fused transpose's kernels read in the other order (its
    operand's, once per kernel it is fused into), not in `bytes`."""
    strided_operand: float = 0
    """The bytes of that operand (the transposed read's rate depends on it)."""


def kind_of(op: Operation) -> Kind:
    kind = KINDS.get(op.name)
    if kind is None:
        raise KeyError(
            f"{op.name} has no cost in partir.cost.op_costs.KINDS; add it there "
            "(as the op it behaves like)"
        )
    return kind


def elements(ty: Attribute) -> int:
    return math.prod(ty.get_shape()) if isinstance(ty, TensorType) else 1


def value_bytes(ty: Attribute) -> int:
    return tensor_bytes(ty) if isinstance(ty, TensorType) else 0


def element_type_name(op: Operation) -> str:
    """The element type the op computes in: its first tensor operand's."""
    for value in (*op.operands, *op.results):
        if isinstance(value.type, TensorType):
            return _type_name(value.type.element_type)
    return "f32"


@functools.cache
def _type_name(element_type: Attribute) -> str:
    """An element type's text (printing it per op cost as much as the rest of
    the op's estimate; there are a handful of element types)."""
    return str(element_type)


def fused(op: Operation) -> bool:
    """Whether XLA would fuse `op` into its users: it is fusible, and so is
    every user (its result then stays in registers), none of which needs it
    in memory (`_MATERIALISING`: a program's result, a barrier). A transpose
    is fused into users that are all elementwise (a reshape or a dot after
    it reads it from memory)."""
    fusible = _FUSIBLE
    if op.name == "stablehlo.transpose":
        fusible = frozenset({Kind.ELEMENTWISE})
    elif KINDS.get(op.name) not in _FUSIBLE:
        return False
    if not op.results:
        return False
    return all(
        KINDS.get(use.operation.name) in fusible
        and use.operation.name not in _MATERIALISING
        and use.operation.parent is op.parent
        for result in op.results
        for use in result.uses
    )


def fused_into(op: Operation, is_fused: Callable[[Operation], bool] = fused) -> int:
    """How many kernels a fused `op` is computed in: XLA copies a fused
    producer into every fusion that uses it (the unfused ops its users'
    chains end at; a transposed gradient Adam's two moments read, twice)."""
    kernels: set[Operation] = set()
    seen: set[Operation] = set()
    todo = [use.operation for result in op.results for use in result.uses]
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if is_fused(user):
            todo.extend(use.operation for result in user.results for use in result.uses)
        else:
            kernels.add(user)
    return max(len(kernels), 1)


def in_registers(value: SSAValue, is_fused: Callable[[Operation], bool] = fused) -> bool:
    """Whether a kernel gets `value` computed in registers by a fused
    producer rather than reading it from memory. A fused view (a reshape,
    the SPMD boundary `spmd.to_local` of an argument) computes nothing: the
    kernel reads what it views."""
    owner = value.owner
    while (
        isinstance(owner, Operation)
        and KINDS.get(owner.name) is Kind.FREE
        and owner.name != "stablehlo.constant"  # a splat is made in the kernel
        and owner.operands
        and is_fused(owner)
    ):
        owner = owner.operands[0].owner
    return isinstance(owner, Operation) and is_fused(owner)


def op_cost(op: Operation, is_fused: Callable[[Operation], bool] = fused) -> OpCost:
    """The FLOPs and memory traffic of `op` on one device (not CONTROL or
    COLLECTIVE ops, whose cost is their regions' or their links'). A walk
    over a whole program passes `fused` memoised: a value used by every
    update (Adam's scalars) is otherwise rechecked per use, O(uses²)."""
    kind = kind_of(op)
    out = sum(elements(r.type) for r in op.results)
    if kind is Kind.FREE:
        constant = op.name == "stablehlo.constant" and not _splat(op)
        written = sum(value_bytes(r.type) for r in op.results) if constant else 0
        return OpCost(kind, 0, written, element_type_name(op), False)
    # inputs a fused producer computed in registers are not read from memory
    read = sum(value_bytes(v.type) for v in op.operands if not in_registers(v, is_fused))
    op_fused = is_fused(op)
    written = 0 if op_fused else sum(value_bytes(r.type) for r in op.results)
    if kind is Kind.MOVEMENT and op_fused:  # a transpose in its users' kernels
        return OpCost(kind, 0, 0, element_type_name(op), False, 0, read * fused_into(op, is_fused),
                      read)
    flops: float
    smallest = 0
    if kind is Kind.MATMUL:
        flops = 2 * out * _contracted(op)
        smallest = _smallest_dim(op)
    elif kind is Kind.ELEMENTWISE:
        flops = out
    elif kind is Kind.REDUCTION:
        inputs = elements(op.operands[0].type) if op.operands else out
        sort = op.name in ("stablehlo.sort", "chlo.top_k")
        flops = inputs * max(1, math.ceil(math.log2(max(inputs, 2)))) if sort else inputs
    else:
        flops = 0
    return OpCost(kind, flops, read + written, element_type_name(op), not op_fused, smallest)


def _smallest_dim(op: Operation) -> int:
    """The smallest of a dot_general's M (the lhs's free elements), N (the
    rhs's) and K (the contracted), batch dims aside; a convolution's of its
    output features, its contracted elements per output and its output
    positions (batch x spatial)."""
    lhs, rhs, result = op.operands[0].type, op.operands[1].type, op.results[0].type
    assert isinstance(lhs, TensorType) and isinstance(rhs, TensorType)
    k = _contracted(op)
    if op.name == "stablehlo.dot_general":
        dims = op.properties["dot_dimension_numbers"]
        batch = math.prod(
            lhs.get_shape()[d.value.data] for d in dims.lhs_batching_dimensions  # type: ignore[attr-defined]
        )
        m = elements(lhs) // max(batch * k, 1)
        n = elements(rhs) // max(batch * k, 1)
        return max(min(m, n, k), 1)
    numbers = op.properties["dimension_numbers"]
    features = rhs.get_shape()[numbers.kernel_output_feature_dimension.data]  # type: ignore[attr-defined]
    positions = elements(result) // max(features, 1)
    return max(min(features, k, positions), 1)


def _contracted(op: Operation) -> int:
    """Multiply-adds per result element of a dot_general or a convolution."""
    lhs = op.operands[0].type
    rhs = op.operands[1].type
    assert isinstance(lhs, TensorType) and isinstance(rhs, TensorType)
    if op.name == "stablehlo.dot_general":
        dims = op.properties["dot_dimension_numbers"]
        contracting = [d.value.data for d in dims.lhs_contracting_dimensions]  # type: ignore[attr-defined]
        return math.prod(lhs.get_shape()[d] for d in contracting)
    numbers = op.properties["dimension_numbers"]
    out_features = rhs.get_shape()[numbers.kernel_output_feature_dimension.data]  # type: ignore[attr-defined]
    return elements(rhs) // max(out_features, 1)


def _splat(op: Operation) -> bool:
    """A constant of one repeated value (XLA materialises it in the kernel)."""
    array = dense_to_numpy(op.properties["value"])
    return array.size <= 1 or bool((array == array.reshape(-1)[0]).all())
