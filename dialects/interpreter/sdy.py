"""Shardy's ops on NumPy arrays: a sharding constraint is its operand.

`sdy.sharding_constraint` says where a value lives, not what it is, so every
stage that still holds one (the import stage, before `Annotations` turns it
into a tiling action) runs it as the identity.
"""

from __future__ import annotations

from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls

from dialects.sdy import ShardingConstraintOp


@register_impls
class SdyFunctions(InterpreterFunctions):
    """Implementations of the ops in `dialects.sdy` that compute a value."""

    @impl(ShardingConstraintOp)
    def run_sharding_constraint(
        self, interp: Interpreter, op: ShardingConstraintOp, args: PythonValues
    ) -> PythonValues:
        return args
