"""Emitters for data movement: ops that build, rearrange or select elements.

Iota, broadcasts, reshapes, transposes, concatenation, static and dynamic
slices, padding and gathers, each as one `lax` call with the op's static
shapes and indices written out as literals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Operation

from lowering.jax_ir import int_value, ints, static_shape
from lowering.jax_literals import tuple_literal

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter


def emit_iota(em: BodyEmitter, op: Operation) -> str:
    ty = op.results[0].type
    shape = static_shape(op, op.results[0])
    dim = int_value(op.iota_dimension)
    return f"lax.broadcasted_iota({em.dtype(op, ty)}, {shape!r}, {dim})"


def emit_broadcast_in_dim(em: BodyEmitter, op: Operation) -> str:
    shape = static_shape(op, op.results[0])
    dims = ints(op.broadcast_dimensions)
    return f"lax.broadcast_in_dim({em.args(op)}, {shape!r}, {dims!r})"


def emit_reshape(em: BodyEmitter, op: Operation) -> str:
    return f"lax.reshape({em.args(op)}, {static_shape(op, op.results[0])!r})"


def emit_transpose(em: BodyEmitter, op: Operation) -> str:
    return f"lax.transpose({em.args(op)}, {ints(op.permutation)!r})"


def emit_concatenate(em: BodyEmitter, op: Operation) -> str:
    return f"lax.concatenate([{em.args(op)}], {int_value(op.dimension)})"


def emit_slice(em: BodyEmitter, op: Operation) -> str:
    start, limit, strides = ints(op.start_indices), ints(op.limit_indices), ints(op.strides)
    stride_arg = "" if all(s == 1 for s in strides) else f", {strides!r}"
    return f"lax.slice({em.name(op.operand)}, {start!r}, {limit!r}{stride_arg})"


def emit_dynamic_slice(em: BodyEmitter, op: Operation) -> str:
    """lax.dynamic_slice clamps the start indices as StableHLO does."""
    starts = tuple_literal([em.name(v) for v in op.start_indices])
    sizes = ints(op.slice_sizes)
    return f"lax.dynamic_slice({em.name(op.operand)}, {starts}, {sizes!r})"


def emit_pad(em: BodyEmitter, op: Operation) -> str:
    config = tuple(
        zip(
            ints(op.edge_padding_low),
            ints(op.edge_padding_high),
            ints(op.interior_padding),
            strict=True,
        )
    )
    return f"lax.pad({em.name(op.operand)}, {em.name(op.padding_value)}, {config!r})"


def emit_gather(em: BodyEmitter, op: Operation) -> str:
    """`lax.gather` in CLIP mode (StableHLO clamps start indices).

    lax wants the index vector in the last dimension of the indices, so other
    layouts are moved there first (which keeps the batch dims' order).
    """
    dn = op.dimension_numbers
    indices = em.name(op.start_indices)
    rank = len(static_shape(op, op.start_indices))
    vector_dim = int_value(dn.index_vector_dim)
    batching = ints(dn.start_indices_batching_dims)
    if vector_dim == rank:
        indices = f"lax.expand_dims({indices}, ({rank},))"
    elif vector_dim != rank - 1:
        perm = (*(d for d in range(rank) if d != vector_dim), vector_dim)
        indices = f"lax.transpose({indices}, {perm!r})"
        batching = tuple(d - (d > vector_dim) for d in batching)
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
