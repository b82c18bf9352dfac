"""Shardy's ops on NumPy arrays: a sharding constraint is its operand; a
manual region runs its body on every device.

`sdy.sharding_constraint` says where a value lives, not what it is, so every
stage that still holds one (the import stage, before `Annotations` turns it
into a tiling action) runs it as the identity. `sdy.manual_computation` (a
nested `jax.shard_map`) splits its operands as its `in_shardings` say, runs
its body on every device of its mesh in lockstep (its collectives combine
the devices' values, as in `dialects.interpreter.spmd`), and puts its
results together as its `out_shardings` say.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import TensorType
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls
from xdsl.ir import SSAValue

from dialects.manual_regions import mesh_of, operand_distributions, result_distributions
from dialects.sdy import ManualComputationOp, ShardingConstraintOp
from dialects.spmd import DTensorType


@register_impls
class SdyFunctions(InterpreterFunctions):
    """Implementations of the ops in `dialects.sdy` that compute a value."""

    @impl(ShardingConstraintOp)
    def run_sharding_constraint(
        self, interp: Interpreter, op: ShardingConstraintOp, args: PythonValues
    ) -> PythonValues:
        return args

    @impl(ManualComputationOp)
    def run_manual_computation(
        self, interp: Interpreter, op: ManualComputationOp, args: PythonValues
    ) -> PythonValues:
        from dialects.interpreter import make_interpreter
        from dialects.interpreter.spmd import Lockstep, across_devices, assemble, device_part

        mesh = mesh_of(op)
        devices = range(mesh.size)
        block = op.body.block
        values: dict[SSAValue, list[np.ndarray]] = {
            arg: [device_part(np.asarray(a), dist, d, mesh) for d in devices]
            for arg, a, dist in zip(block.args, args, operand_distributions(op), strict=True)
        }
        module = interp.module
        spmd = across_devices(module, mesh)
        returned, _ = Lockstep(mesh, make_interpreter(module), spmd, values).run(block)
        results = []
        for i, (result, parts, dist) in enumerate(
            zip(op.results, returned, result_distributions(op), strict=True)
        ):
            assert isinstance(result.type, TensorType)
            dtensor = DTensorType.of(result.type, dist)
            results.append(assemble(parts, dtensor, mesh, f"{op.name} result {i}"))
        return tuple(results)
