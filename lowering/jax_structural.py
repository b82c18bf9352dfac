"""Emitters for data movement: ops that build, rearrange or select elements.

Iota, random bits, broadcasts, reshapes, transposes, reversals, concatenation, static and dynamic
slices, padding and gathers, each as one `lax` call with the op's static
shapes and indices written out as literals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Operation
from xdsl_jax.dialects import stablehlo as shlo

from dialects import stablehlo_ext as ext
from dialects.attributes import ints
from dialects.regions import binary_combiner, returns_update
from lowering.jax_ir import int_value, static_shape, unsupported
from lowering.jax_literals import tuple_literal

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter


def emit_iota(em: BodyEmitter, op: shlo.IotaOp) -> str:
    ty = op.results[0].type
    shape = static_shape(op, op.results[0])
    dim = int_value(op.iota_dimension)
    return f"lax.broadcasted_iota({em.dtype(op, ty)}, {shape!r}, {dim})"


def emit_rng_bit_generator(em: BodyEmitter, op: ext.RngBitGeneratorOp) -> str:
    """`lax.rng_bit_generator(state, shape, dtype, algorithm)`: (next state, bits)."""
    em.dtype(op, op.output_state.type)  # a ui64 state needs 64-bit types on
    shape = static_shape(op, op.output)
    return (
        f"lax.rng_bit_generator({em.name(op.initial_state)}, {shape!r}, "
        f"{em.dtype(op, op.output.type)}, lax.RandomAlgorithm.RNG_{op.algorithm.value})"
    )


def emit_broadcast_in_dim(em: BodyEmitter, op: shlo.BroadcastInDimOp) -> str:
    shape = static_shape(op, op.results[0])
    dims = ints(op.broadcast_dimensions)
    return f"lax.broadcast_in_dim({em.args(op)}, {shape!r}, {dims!r})"


def emit_reshape(em: BodyEmitter, op: Operation) -> str:
    return f"lax.reshape({em.args(op)}, {static_shape(op, op.results[0])!r})"


def emit_transpose(em: BodyEmitter, op: shlo.TransposeOp) -> str:
    return f"lax.transpose({em.args(op)}, {ints(op.permutation)!r})"


def emit_reverse(em: BodyEmitter, op: ext.ReverseOp) -> str:
    return f"lax.rev({em.args(op)}, {ints(op.dimensions)!r})"


def emit_concatenate(em: BodyEmitter, op: shlo.ConcatenateOp) -> str:
    return f"lax.concatenate([{em.args(op)}], {int_value(op.dimension)})"


def emit_slice(em: BodyEmitter, op: ext.SliceOp) -> str:
    start, limit, strides = ints(op.start_indices), ints(op.limit_indices), ints(op.strides)
    stride_arg = "" if all(s == 1 for s in strides) else f", {strides!r}"
    return f"lax.slice({em.name(op.operand)}, {start!r}, {limit!r}{stride_arg})"


def emit_dynamic_slice(em: BodyEmitter, op: shlo.DynamicSliceOp) -> str:
    """lax.dynamic_slice clamps the start indices as StableHLO does."""
    starts = tuple_literal([em.name(v) for v in op.start_indices])
    sizes = ints(op.slice_sizes)
    return f"lax.dynamic_slice({em.name(op.operand)}, {starts}, {sizes!r})"


def emit_pad(em: BodyEmitter, op: ext.PadOp) -> str:
    config = tuple(
        zip(
            ints(op.edge_padding_low),
            ints(op.edge_padding_high),
            ints(op.interior_padding),
            strict=True,
        )
    )
    return f"lax.pad({em.name(op.operand)}, {em.name(op.padding_value)}, {config!r})"


def _vector_last(
    em: BodyEmitter, op: Operation, indices_value, vector_dim: int, batching: tuple[int, ...]
) -> tuple[str, tuple[int, ...]]:
    """lax wants the index vector in the last dimension of the indices: move
    it there (keeping the batch dims' order) and renumber the batch dims."""
    indices = em.name(indices_value)
    rank = len(static_shape(op, indices_value))
    if vector_dim == rank:
        return f"lax.expand_dims({indices}, ({rank},))", batching
    if vector_dim != rank - 1:
        perm = (*(d for d in range(rank) if d != vector_dim), vector_dim)
        indices = f"lax.transpose({indices}, {perm!r})"
        batching = tuple(d - (d > vector_dim) for d in batching)
    return indices, batching


def emit_dynamic_update_slice(em: BodyEmitter, op: ext.DynamicUpdateSliceOp) -> str:
    """`lax.dynamic_update_slice`, which clamps the start indices as StableHLO does."""
    starts = tuple_literal([em.name(v) for v in op.start_indices])
    return f"lax.dynamic_update_slice({em.name(op.operand)}, {em.name(op.update)}, {starts})"


def emit_gather(em: BodyEmitter, op: shlo.GatherOp) -> str:
    """`lax.gather` in CLIP mode (StableHLO clamps start indices)."""
    dn = op.dimension_numbers
    indices, batching = _vector_last(
        em,
        op,
        op.start_indices,
        int_value(dn.index_vector_dim),
        ints(dn.start_indices_batching_dims),
    )
    numbers = (
        "lax.GatherDimensionNumbers("
        f"offset_dims={ints(dn.offset_dims)!r}, "
        f"collapsed_slice_dims={ints(dn.collapsed_slice_dims)!r}, "
        f"start_index_map={ints(dn.start_index_map)!r}, "
        f"operand_batching_dims={ints(dn.operand_batching_dims)!r}, "
        f"start_indices_batching_dims={batching!r})"
    )
    sorted_ = bool(op.indices_are_sorted.value.data) if op.indices_are_sorted else False
    return (
        f"lax.gather({em.name(op.operand)}, {indices}, {numbers}, "
        f"slice_sizes={ints(op.slice_sizes)!r}, indices_are_sorted={sorted_}, "
        "mode=lax.GatherScatterMode.CLIP)"
    )


_SCATTERS = {
    "stablehlo.add": "lax.scatter_add",
    "stablehlo.multiply": "lax.scatter_mul",
    "stablehlo.maximum": "lax.scatter_max",
    "stablehlo.minimum": "lax.scatter_min",
}


def _scatter_function(op: shlo.ScatterOp) -> str | None:
    """The lax scatter whose combiner is the update computation: replace
    (`return %update`), or one add/multiply/max/min of the two arguments."""
    if len(op.inputs) != 1:
        return None
    if returns_update(op.update_computation):
        return "lax.scatter"
    combine = binary_combiner(op.update_computation)
    return _SCATTERS.get(combine.name) if combine is not None else None


def emit_scatter(em: BodyEmitter, op: shlo.ScatterOp) -> str:
    """`lax.scatter_add` & co. in FILL_OR_DROP mode (StableHLO skips an
    update window that falls outside the operand, as that mode does)."""
    function = _scatter_function(op)
    if function is None:
        raise unsupported(
            op,
            "a scatter whose update computation is not a replace, add, "
            "multiply, max or min of its arguments",
        )
    dn = op.scatter_dimension_numbers
    indices, batching = _vector_last(
        em,
        op,
        op.scatter_indices,
        int_value(dn.index_vector_dim),
        ints(dn.scatter_indices_batching_dims),
    )
    numbers = (
        "lax.ScatterDimensionNumbers("
        f"update_window_dims={ints(dn.update_window_dims)!r}, "
        f"inserted_window_dims={ints(dn.inserted_window_dims)!r}, "
        f"scatter_dims_to_operand_dims={ints(dn.scatter_dims_to_operand_dims)!r}, "
        f"operand_batching_dims={ints(dn.input_batching_dims)!r}, "
        f"scatter_indices_batching_dims={batching!r})"
    )
    flags = {
        name: bool(getattr(op, name).value.data) if getattr(op, name) else False
        for name in ("indices_are_sorted", "unique_indices")
    }
    return (
        f"{function}({em.name(op.inputs[0])}, {indices}, {em.name(op.updates[0])}, {numbers}, "
        f"indices_are_sorted={flags['indices_are_sorted']}, "
        f"unique_indices={flags['unique_indices']}, mode=lax.GatherScatterMode.FILL_OR_DROP)"
    )
