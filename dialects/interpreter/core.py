"""Sequential semantics of the partir core dialect, on NumPy arrays.

A `tile<d>` loop runs its body once per range index and concatenates the
results along d; a `sum` loop adds them, left to right. `partir.slice d x[r]`
is part r of x split into N equal parts along d; `partir.halo_slice` adds the
neighbouring elements (zeros past the edges). This is the oracle every
rewrite is checked against, so it is written to be obviously right, not fast.
"""

from __future__ import annotations

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

from dialects.partir import HaloSliceOp, LoopOp, MeshOp, RangeType, SliceOp, TileAttr, YieldOp


@register_impls
class PartirFunctions(InterpreterFunctions):
    @impl(SliceOp)
    def run_slice(self, interp: Interpreter, op: SliceOp, args: PythonValues) -> PythonValues:
        x, index = args
        assert isinstance(op.index.type, RangeType)
        parts = op.index.type.size.data
        return (np.split(np.asarray(x), parts, axis=op.dim_index)[index],)

    @impl(HaloSliceOp)
    def run_halo_slice(
        self, interp: Interpreter, op: HaloSliceOp, args: PythonValues
    ) -> PythonValues:
        x, index = np.asarray(args[0]), args[1]
        assert isinstance(op.index.type, RangeType)
        d, (lo, hi) = op.dim_index, op.low_high
        size = x.shape[d] // op.index.type.size.data
        pads = [(0, 0)] * x.ndim
        pads[d] = (lo, hi)
        padded = np.pad(x, pads)  # element i of x is element i + lo of padded
        start = index * size
        return (np.take(padded, np.arange(start, start + lo + size + hi), axis=d),)

    @impl(LoopOp)
    def run_loop(self, interp: Interpreter, op: LoopOp, args: PythonValues) -> PythonValues:
        size = op.size
        parts = [interp.run_ssacfg_region(op.body, (i,), "partir.loop")[0] for i in range(size)]
        if isinstance(op.action, TileAttr):
            return (np.concatenate(parts, axis=op.action.dim.data),)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return (np.asarray(total, dtype=parts[0].dtype),)

    @impl_terminator(YieldOp)
    def run_yield(
        self, interp: Interpreter, op: YieldOp, args: PythonValues
    ) -> tuple[TerminatorValue, PythonValues]:
        return ReturnedValues(args), ()

    @impl(MeshOp)
    def run_mesh(self, interp: Interpreter, op: MeshOp, args: PythonValues) -> PythonValues:
        return ()
