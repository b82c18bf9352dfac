"""Emitters for the SPMD ops: boundaries and collectives.

Inside `shard_map` the `to_local`/`from_local` boundaries are the identity,
and each collective is the `lax` collective over the same mesh axes, typed so
that JAX's `check_vma` accepts every replication claim it makes. `EMITTERS`
has one entry per SPMD op (`lowering.jax_ops` merges it into the op table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Operation

from dialects import spmd
from lowering.jax_ir import OpEmitter, int_value, static_shape
from lowering.jax_literals import axes_literal

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter


def emit_boundary(em: BodyEmitter, op: Operation) -> None:
    """to_local/from_local are the identity inside `shard_map`: alias the value."""
    em.alias(op.results[0], op.operands[0])


_ALL_REDUCE = {"sum": "psum", "max": "pmax", "min": "pmin"}


def emit_all_reduce(em: BodyEmitter, op: spmd.AllReduceOp) -> str:
    """psum's (pmax's, pmin's) result is invariant over the axes (JAX types it so)."""
    return f"lax.{_ALL_REDUCE[op.combines]}({em.args(op)}, {axes_literal(op.axis_names)})"


def emit_axis_index(em: BodyEmitter, op: spmd.AxisIndexOp) -> str:
    """`lax.axis_index` over the axes (major first), in the result's dtype."""
    dtype = em.dtype(op, op.result.type)
    return f"lax.axis_index({axes_literal(op.axis_names)}).astype({dtype})"


def emit_all_gather(em: BodyEmitter, op: spmd.AllGatherOp) -> str:
    """to='invarying': the gathered value *is* the same on every device of the
    group; JAX's default ('varying') would reject outputs declared replicated."""
    axes = axes_literal(op.axis_names)
    dim = int_value(op.dim)
    return f"lax.all_gather({em.args(op)}, {axes}, axis={dim}, tiled=True, to='invarying')"


def emit_reduce_scatter(em: BodyEmitter, op: spmd.ReduceScatterOp) -> str:
    """`_reduce_scatter` (the generated module's helper, `lowering.to_jax`):
    the backend picks how the scatter is written."""
    axes = axes_literal(op.axis_names)
    dim = int_value(op.dim)
    size = static_shape(op, op.results[0])[dim]
    return f"_reduce_scatter({em.args(op)}, {axes}, {dim}, {size})"


def _group(op: spmd.CollectiveOp) -> str:
    """The op's axes as a literal; one axis as a str (JAX's all_to_all and
    ppermute record a single axis that way)."""
    names = op.axis_names
    return repr(names[0]) if len(names) == 1 else axes_literal(names)


def emit_all_to_all(em: BodyEmitter, op: spmd.AllToAllOp) -> str:
    axes = _group(op)
    split, concat = int_value(op.split_dim), int_value(op.concat_dim)
    return f"lax.all_to_all({em.args(op)}, {axes}, {split}, {concat}, tiled=True)"


def emit_local_slice(em: BodyEmitter, op: spmd.LocalSliceOp) -> str:
    """The device's own part: its index in the axis group (major first) times the size."""
    dim = int_value(op.dim)
    size = static_shape(op, op.results[0])[dim]
    index = f"lax.axis_index({axes_literal(op.axis_names)})"
    return f"lax.dynamic_slice_in_dim({em.args(op)}, {index} * {size}, {size}, axis={dim})"


def emit_collective_permute(em: BodyEmitter, op: spmd.CollectivePermuteOp) -> str:
    """`lax.ppermute` over the same group (positions numbered as the op's)."""
    axes = _group(op)
    return f"lax.ppermute({em.args(op)}, {axes}, {op.source_target_pairs})"


EMITTERS: dict[type[Operation], OpEmitter] = {
    spmd.ToLocalOp: emit_boundary,
    spmd.FromLocalOp: emit_boundary,
    spmd.AllReduceOp: emit_all_reduce,
    spmd.AllGatherOp: emit_all_gather,
    spmd.ReduceScatterOp: emit_reduce_scatter,
    spmd.AllToAllOp: emit_all_to_all,
    spmd.LocalSliceOp: emit_local_slice,
    spmd.CollectivePermuteOp: emit_collective_permute,
    spmd.AxisIndexOp: emit_axis_index,
}
"""SPMD op class -> its emitter."""
