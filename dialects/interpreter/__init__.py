"""The reference interpreter: runs a module of any partir stage on NumPy arrays.

It is the oracle for every rewrite and lowering, so each op's implementation
follows the StableHLO spec (or the partir dialect's definition) directly,
favouring obviousness over speed. An op with no implementation raises an
`InterpretationError` that names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp, TensorType, UnregisteredOp
from xdsl.interpreter import Interpreter
from xdsl.interpreters.func import FuncFunctions
from xdsl.ir import Operation
from xdsl.utils.exceptions import InterpretationError

from dialects.dtypes import numpy_dtype
from dialects.functions import entry_function
from dialects.names import op_name


def make_interpreter(module: ModuleOp) -> Interpreter:
    """An interpreter with every dialect's semantics registered. (Imported
    here, not at the top: importing this package for its helpers stays light.)"""
    from dialects.interpreter.chlo import ChloFunctions
    from dialects.interpreter.core import PartirFunctions
    from dialects.interpreter.sdy import SdyFunctions
    from dialects.interpreter.stablehlo import StableHLOFunctions

    interp = Interpreter(module)
    for functions in (
        FuncFunctions, PartirFunctions, StableHLOFunctions, ChloFunctions, SdyFunctions
    ):
        interp.register_implementations(functions())
    return interp


def check_implemented(function: Operation) -> None:
    """Fail before running anything on an op no dialect defines, naming it.

    (Every op of partir's dialects has an implementation; a test checks that.)
    """
    for op in function.walk():
        if isinstance(op, UnregisteredOp):
            raise InterpretationError(
                f"the reference interpreter has no implementation of {op_name(op)} "
                "(an op partir's dialects do not define)"
            )


def run_function(module: ModuleOp, args: Sequence[Any]) -> list[np.ndarray]:
    """Run the entry function of `module` on flat `args` and return its flat results."""
    try:
        entry = entry_function(module)
    except ValueError as err:
        raise InterpretationError(str(err)) from None
    function = entry.sym_name.data
    inputs = entry.function_type.inputs.data
    if len(args) != len(inputs):
        raise InterpretationError(
            f"@{function} takes {len(inputs)} arguments, {len(args)} were given"
        )
    check_implemented(entry)
    arrays = [_as_argument(i, a, t) for i, (a, t) in enumerate(zip(args, inputs, strict=True))]
    results = make_interpreter(module).call_op(function, tuple(arrays))
    return [np.asarray(r) for r in results]


def _as_argument(index: int, value: Any, ty: Any) -> np.ndarray:
    if not isinstance(ty, TensorType):
        raise InterpretationError(f"argument {index} has non-tensor type {ty}")
    dtype = numpy_dtype(ty.element_type)
    array = np.asarray(value)
    if tuple(array.shape) != tuple(ty.get_shape()):
        raise InterpretationError(
            f"argument {index} has shape {tuple(array.shape)} but the function takes {ty}"
        )
    if array.dtype != dtype:
        raise InterpretationError(
            f"argument {index} has dtype {array.dtype} but the function takes {ty}"
        )
    return array
