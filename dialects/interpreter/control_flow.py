"""StableHLO control flow: return, if, case and while.

Also the ops that only order or pass values through (optimization_barrier,
after_all and its tokens) and custom_call, which has no semantics here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    ReturnedValues,
    TerminatorValue,
    impl,
    impl_terminator,
    register_impls,
)
from xdsl.ir import Region
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo

from dialects.interpreter.common import run_region
from dialects.stablehlo_ext import WhileOp


@dataclass(frozen=True)
class Token:
    """The value of a `!stablehlo.token`: carries no data, only ordering."""


def picked_branch(op: shlo.CaseOp | shlo.IfOp, index: Any) -> Region:
    """The region a conditional runs for `index` (its predicate, for `if`):
    a case index outside [0, number of branches) runs the last branch."""
    if isinstance(op, shlo.IfOp):
        return op.true_branch if bool(np.asarray(index)) else op.false_branch
    k, branches = int(np.asarray(index)), list(op.branches)
    return branches[k] if 0 <= k < len(branches) else branches[-1]


# --------------------------------------------------------------------------
# The interpreter functions


@register_impls
class ControlFlowFunctions(InterpreterFunctions):
    """Terminators, regions run conditionally or in a loop, tokens and barriers."""

    @impl_terminator(shlo.ReturnOp)
    def run_return(
        self, interp: Interpreter, op: shlo.ReturnOp, args: PythonValues
    ) -> tuple[TerminatorValue, PythonValues]:
        return ReturnedValues(args), ()

    @impl(shlo.IfOp)
    def run_if(self, interp: Interpreter, op: shlo.IfOp, args: PythonValues) -> PythonValues:
        return run_region(interp, picked_branch(op, args[0]), (), "stablehlo.if")

    @impl(shlo.CaseOp)
    def run_case(self, interp: Interpreter, op: shlo.CaseOp, args: PythonValues) -> PythonValues:
        return run_region(interp, picked_branch(op, args[0]), (), "stablehlo.case")

    @impl(WhileOp)
    def run_while(self, interp: Interpreter, op: WhileOp, args: PythonValues) -> PythonValues:
        values = tuple(args)
        while bool(np.asarray(run_region(interp, op.cond, values, "stablehlo.while cond")[0])):
            values = run_region(interp, op.body, values, "stablehlo.while body")
        return values

    @impl(shlo.OptimizationBarrierOp)
    def run_optimization_barrier(
        self, interp: Interpreter, op: shlo.OptimizationBarrierOp, args: PythonValues
    ) -> PythonValues:
        return tuple(args)

    @impl(shlo.AfterAllOp)
    def run_after_all(
        self, interp: Interpreter, op: shlo.AfterAllOp, args: PythonValues
    ) -> PythonValues:
        return (Token(),)

    @impl(shlo.CustomCallOp)
    def run_custom_call(
        self, interp: Interpreter, op: shlo.CustomCallOp, args: PythonValues
    ) -> PythonValues:
        target = op.call_target_name.data
        raise InterpretationError(
            f"stablehlo.custom_call @{target}: the interpreter has no semantics for this target"
        )
