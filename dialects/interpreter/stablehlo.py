"""StableHLO semantics on NumPy arrays, written from the StableHLO spec.

This is the oracle for every partir rewrite, so each op is a direct reading of
https://github.com/openxla/stablehlo/blob/main/docs/spec.md, not a fast kernel.
Conventions that hold throughout:

- Floating-point and complex ops are evaluated on float64 / complex128 copies
  of their operands and rounded once to the result type, as StableHLO's own
  reference interpreter does (`mapWithUpcastToDouble`). For + - * / and sqrt
  this is the correctly rounded result in every type up to f32.
- Integer arithmetic wraps (two's complement).
- Where the spec leaves a case implementation-defined, the interpreter does
  what XLA does: integer x/0 = -1 and x%0 = x, INT_MIN/-1 = INT_MIN; float to
  integer conversion truncates and saturates (NaN -> 0); a scatter update
  whose window is not entirely inside the result is dropped. (Unlike XLA on
  CPU, subnormals are not flushed to zero, and reduce_precision to 0 mantissa
  bits turns NaN into inf, as the spec's reference interpreter does.)
- Regions (reduce, map, scatter bodies) are run through the interpreter. A
  region made only of elementwise ops is run once on whole arrays instead of
  once per element; for elementwise ops the two are the same computation.

The ops are implemented by family, one module each; `StableHLOFunctions`
combines them (xDSL's `register_impls` collects the `@impl`s of every base
class):

- `elementwise`: unary and binary arithmetic, logical and bitwise ops, select, clamp
- `conversions`: convert, bitcast_convert, reduce_precision, compare
- `reductions`: dot_general, reduce, reduce_window, select_and_scatter, sort, map
- `rng`: rng_bit_generator (its bits drawn by XLA on CPU: the spec leaves them open)
- `data_movement`: broadcast_in_dim, reshape, transpose, concatenate, slice,
  dynamic_slice, pad, gather, scatter, iota, constant
- `control_flow`: return, if, case, while, optimization_barrier, after_all,
  custom_call
- `common`: the helpers they share (types and attributes, running regions)

An op this module cannot give a meaning raises `InterpretationError` naming it.
"""

from __future__ import annotations

from xdsl.interpreter import register_impls

from dialects.interpreter.common import widen
from dialects.interpreter.control_flow import ControlFlowFunctions, Token
from dialects.interpreter.conversions import ConversionFunctions
from dialects.interpreter.data_movement import DataMovementFunctions
from dialects.interpreter.elementwise import ElementwiseFunctions, elementwise_impl, in_double
from dialects.interpreter.reductions import ReductionFunctions
from dialects.interpreter.rng import RngFunctions

__all__ = [
    "ControlFlowFunctions",
    "ConversionFunctions",
    "DataMovementFunctions",
    "ElementwiseFunctions",
    "ReductionFunctions",
    "RngFunctions",
    "StableHLOFunctions",
    "Token",
    "elementwise_impl",
    "in_double",
    "widen",
]


@register_impls
class StableHLOFunctions(
    ElementwiseFunctions,
    ConversionFunctions,
    ReductionFunctions,
    RngFunctions,
    DataMovementFunctions,
    ControlFlowFunctions,
):
    """Implementations of the StableHLO ops of `dialects.stablehlo_ext.StableHLO`."""
