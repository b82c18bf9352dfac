"""`stablehlo.rng_bit_generator`: random bits from a generator state.

The spec leaves the bits to the implementation (the `DEFAULT` algorithm is
the backend's own; `THREE_FRY` and `PHILOX` name a family, not a bit
layout). So this is the one op whose reference semantics is not a reading
of the spec: the interpreter asks XLA on CPU, through
`lax.rng_bit_generator`, for the bits and the next state. They are the bits
`jax.jit` computes on CPU (what partir's tests compare against); another
backend may draw others.
"""

from __future__ import annotations

import numpy as np
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.utils.exceptions import InterpretationError

from dialects.interpreter.common import element_dtype, typed
from dialects.stablehlo_ext import RngAlgorithm, RngBitGeneratorOp

STATE_TYPES = {(np.dtype(np.uint64), (2,)), (np.dtype(np.uint32), (4,))}
"""The generator states XLA takes: `ui64[2]` (what JAX emits) or `ui32[4]`."""


def rng_bit_generator(
    state: np.ndarray, algorithm: RngAlgorithm, shape: tuple[int, ...], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """(next state, bits of `shape` and unsigned `dtype`), as XLA on CPU draws them."""
    import jax
    from jax import lax

    algorithms = {
        RngAlgorithm.DEFAULT: lax.RandomAlgorithm.RNG_DEFAULT,
        RngAlgorithm.THREE_FRY: lax.RandomAlgorithm.RNG_THREE_FRY,
        RngAlgorithm.PHILOX: lax.RandomAlgorithm.RNG_PHILOX,
    }
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        new_state, bits = lax.rng_bit_generator(
            jax.numpy.asarray(state), shape, dtype, algorithms[algorithm]
        )
        return np.asarray(new_state), np.asarray(bits)


@register_impls
class RngFunctions(InterpreterFunctions):
    """rng_bit_generator."""

    @impl(RngBitGeneratorOp)
    def run_rng_bit_generator(
        self, interp: Interpreter, op: RngBitGeneratorOp, args: PythonValues
    ) -> PythonValues:
        state = np.asarray(args[0])
        dtype = element_dtype(op.output.type)
        if (state.dtype, state.shape) not in STATE_TYPES or dtype.kind != "u":
            raise InterpretationError(
                f"{op.name}: XLA draws unsigned bits from a ui64[2] or ui32[4] state; got a "
                f"{state.dtype}{list(state.shape)} state and {dtype} bits"
            )
        shape = tuple(op.output.type.get_shape())
        new_state, bits = rng_bit_generator(state, op.algorithm, shape, dtype)
        return typed(new_state, op.output_state.type), typed(bits, op.output.type)
