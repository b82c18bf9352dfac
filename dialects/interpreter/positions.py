"""What a device computes from its position in the mesh alone.

A pipelined program picks each time step's work per device: a
`stablehlo.case` on a constant table indexed by `spmd.axis_index` (which
stage runs which branch), a `stablehlo.if` on the stage being the first or
the last. Such a selector is a function of the device's coordinates and
nothing else, so a static question ("which branch does stage 2 run at step
5?") has one answer per position. `Positions` finds those values and folds
them per position with the reference interpreter's own ops, so what the cost
model and the exports read is what the program runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.interpreter import Interpreter
from xdsl.ir import Operation, OpResult, Region, SSAValue
from xdsl_jax.dialects import stablehlo as shlo

from dialects.dtypes import numpy_dtype
from dialects.interpreter import make_interpreter
from dialects.interpreter.control_flow import picked_branch
from dialects.mesh import Mesh
from dialects.spmd import AxisIndexOp, CollectiveOp

Coords = Mapping[str, int]

_RANDOM = ("stablehlo.rng", "stablehlo.rng_bit_generator")


class Positions:
    """Folds the values of `module` that depend on the device's position only."""

    def __init__(self, module: ModuleOp, mesh: Mesh) -> None:
        self.module, self.mesh = module, mesh
        self._interp: Interpreter | None = None  # made on the first fold
        self._axes: dict[SSAValue, frozenset[str] | None] = {}
        self._values: dict[tuple[SSAValue, tuple[int, ...]], np.ndarray] = {}

    def axes_of(self, value: SSAValue) -> frozenset[str] | None:
        """The mesh axes `value` depends on, if constants and `spmd.axis_index`
        alone make it (no argument, region or collective on the way); else None."""
        if value in self._axes:
            return self._axes[value]
        owner = value.owner
        found: frozenset[str] | None
        if isinstance(owner, AxisIndexOp):
            found = frozenset(owner.axis_names)
        elif (
            not isinstance(owner, Operation)
            or owner.regions
            or isinstance(owner, CollectiveOp)
            or owner.name in _RANDOM
        ):
            found = None
        else:
            found = frozenset()
            for operand in owner.operands:
                axes = self.axes_of(operand)
                if axes is None:
                    found = None
                    break
                found |= axes
        self._axes[value] = found
        return found

    def value(self, value: SSAValue, coords: Coords) -> np.ndarray:
        """`value` on the device at `coords` (which names at least `axes_of(value)`)."""
        axes = self.axes_of(value)
        if axes is None:
            raise ValueError(f"{value} does not depend on the device's position alone")
        key = (value, tuple(coords[a] for a in sorted(axes)))
        if key in self._values:
            return self._values[key]
        owner = value.owner
        assert isinstance(owner, Operation)
        if isinstance(owner, AxisIndexOp):
            ty = owner.result.type
            assert isinstance(ty, TensorType)
            index = self.mesh.group_index(dict(coords), owner.axis_names)
            found = np.asarray(index, numpy_dtype(ty.element_type))
        else:
            assert isinstance(value, OpResult)
            args = tuple(self.value(v, coords) for v in owner.operands)
            if self._interp is None:
                self._interp = make_interpreter(self.module)
            found = self._interp.run_op(owner, args)[value.index]
        self._values[key] = found
        return found

    def selector_axes(self, op: Operation) -> frozenset[str] | None:
        """The axes a conditional's choice depends on, if on the position alone."""
        if not isinstance(op, shlo.CaseOp | shlo.IfOp):
            return None
        axes = self.axes_of(op.operands[0])
        return axes or None

    def branch(self, op: shlo.CaseOp | shlo.IfOp, coords: Coords) -> Region:
        """The region `op` runs on the device at `coords`."""
        return picked_branch(op, self.value(op.operands[0], coords))
