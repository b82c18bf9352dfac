"""The op table: op name -> the emitter that writes it as JAX.

Elementwise ops share one emitter keyed by their `lax` function
(`lowering.jax_elementwise`); every other op has its own, from
`lowering.jax_literals` (constants), `lowering.jax_structural` and
`lowering.jax_reductions`; the SPMD ops' come as one table from
`lowering.jax_collectives`. An op missing here has no JAX translation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Operation
from xdsl_jax.dialects import stablehlo as shlo

from dialects.chlo import TopKOp
from dialects.convolution import ConvolutionOp
from dialects.sdy import ShardingConstraintOp
from dialects.stablehlo_ext import CompareOp as ExtCompareOp
from dialects.stablehlo_ext import (
    DynamicUpdateSliceOp,
    ReduceWindowOp,
    ReverseOp,
    RngBitGeneratorOp,
    SelectAndScatterOp,
    SortOp,
)
from dialects.stablehlo_ext import PadOp as ExtPadOp
from dialects.stablehlo_ext import ReduceOp as ExtReduceOp
from dialects.stablehlo_ext import SliceOp as ExtSliceOp
from lowering.jax_collectives import EMITTERS as SPMD_EMITTERS
from lowering.jax_control_flow import emit_case, emit_if, emit_optimization_barrier, emit_while
from lowering.jax_elementwise import (
    BINARY,
    CHLO,
    UNARY,
    emit_bitcast_convert,
    emit_clamp,
    emit_compare,
    emit_convert,
    emit_elementwise,
    emit_reduce_precision,
    emit_round,
    emit_select,
)
from lowering.jax_ir import OpEmitter, by_name, unsupported
from lowering.jax_literals import emit_constant
from lowering.jax_reductions import (
    emit_convolution,
    emit_dot_general,
    emit_reduce,
    emit_reduce_window,
    emit_select_and_scatter,
)
from lowering.jax_sort import emit_sort, emit_top_k
from lowering.jax_structural import (
    emit_broadcast_in_dim,
    emit_concatenate,
    emit_dynamic_slice,
    emit_dynamic_update_slice,
    emit_gather,
    emit_iota,
    emit_pad,
    emit_reshape,
    emit_reverse,
    emit_rng_bit_generator,
    emit_scatter,
    emit_slice,
    emit_transpose,
)

if TYPE_CHECKING:
    from lowering.jax_body import BodyEmitter, Emitter


def emit_sharding_constraint(em: BodyEmitter, op: ShardingConstraintOp) -> str:
    """A constraint left to emission was never applied: the `Annotations`
    tactic (`partir-annotations`) turns it into a tiling action and removes
    it. Refused here rather than emitted as its operand, which would drop the
    user's annotation silently. (Listed, so the import does not refuse it.)"""
    raise unsupported(
        op,
        "the annotation was not applied; run the partir-annotations pass "
        "(partir.Annotations) before lowering, which makes it a tiling action",
    )


_SPECIFIC: dict[type[Operation], OpEmitter] = {
    shlo.RoundNearestAfzOp: emit_round("AWAY_FROM_ZERO"),
    shlo.RoundNearestEvenOp: emit_round("TO_NEAREST_EVEN"),
    ExtCompareOp: emit_compare,
    shlo.SelectOp: emit_select,
    shlo.ClampOp: emit_clamp,
    shlo.ConvertOp: emit_convert,
    shlo.BitcastConvertOp: emit_bitcast_convert,
    shlo.ReducePrecisionOp: emit_reduce_precision,
    shlo.ConstantOp: emit_constant,
    shlo.IotaOp: emit_iota,
    RngBitGeneratorOp: emit_rng_bit_generator,
    shlo.BroadcastInDimOp: emit_broadcast_in_dim,
    shlo.ReshapeOp: emit_reshape,
    shlo.TransposeOp: emit_transpose,
    ReverseOp: emit_reverse,
    shlo.ConcatenateOp: emit_concatenate,
    ExtSliceOp: emit_slice,
    shlo.DynamicSliceOp: emit_dynamic_slice,
    ExtPadOp: emit_pad,
    shlo.GatherOp: emit_gather,
    shlo.ScatterOp: emit_scatter,
    shlo.WhileOp: emit_while,
    shlo.OptimizationBarrierOp: emit_optimization_barrier,
    shlo.CaseOp: emit_case,
    shlo.IfOp: emit_if,
    DynamicUpdateSliceOp: emit_dynamic_update_slice,
    shlo.DotGeneralOp: emit_dot_general,
    ConvolutionOp: emit_convolution,
    ExtReduceOp: emit_reduce,
    ReduceWindowOp: emit_reduce_window,
    SelectAndScatterOp: emit_select_and_scatter,
    SortOp: emit_sort,
    TopKOp: emit_top_k,
    ShardingConstraintOp: emit_sharding_constraint,
    **SPMD_EMITTERS,
}

EMITTERS: dict[str, Emitter] = {
    **{name: emit_elementwise for name in (*UNARY, *BINARY)},
    **{f"chlo.{name}": emit_elementwise for name in CHLO},
    **by_name(_SPECIFIC),
}
"""Op name -> emitter (keyed by name, see `lowering.jax_ir.by_name`)."""
