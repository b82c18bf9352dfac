"""Every SPMD op carries its whole meaning: semantics, NumPy `@impl`, JAX emitter.

A collective is defined in one class (dialects/spmd.py) and implemented in
exactly two other places, each beside the ops of its kind: an `@impl` of
`SpmdFunctions` (the reference interpreter) and an entry of
`lowering.jax_collectives.EMITTERS` (the JAX emitter). Its accounting (kind,
bytes, whether it communicates) is the op's own, so `collectives()` and the
report count a new collective with no table to update. These tests fail for
an op that misses a piece, shown on a throwaway op that misses all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType, f32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, result_def

from dialects import spmd
from dialects.distribution import Distribution
from dialects.interpreter.spmd import SpmdFunctions, run_spmd
from dialects.mesh import Mesh
from dialects.partir import MeshOp
from dialects.spmd import SPMD, CollectiveOp, DTensorType, _axes
from lowering.collectives import collectives
from lowering.jax_ops import EMITTERS


def missing_pieces(ops: Iterable[type[Operation]]) -> list[str]:
    """What each SPMD op lacks of: `result_distribution` (collectives), an
    `@impl` in `SpmdFunctions`, an emitter in the JAX op table."""
    implemented = {op for op, _ in SpmdFunctions._impls()}
    gaps = []
    for op in ops:
        if issubclass(op, CollectiveOp) and (
            op.result_distribution is CollectiveOp.result_distribution
        ):
            gaps.append(f"{op.name}: no result_distribution")
        if op not in implemented:
            gaps.append(f"{op.name}: no @impl in SpmdFunctions")
        if op.name not in EMITTERS:
            gaps.append(f"{op.name}: no entry in the JAX emitter")
    return gaps


def test_every_spmd_op_has_semantics_an_impl_and_an_emitter() -> None:
    assert list(SPMD.operations)
    assert missing_pieces(SPMD.operations) == []
    collective_ops = {op for op in SPMD.operations if issubclass(op, CollectiveOp)}
    assert collective_ops == set(CASES), "each collective needs a case in CASES below"


# --------------------------------------------------------------------------
# result_distribution agrees with the op's shape rule and its NumPy meaning

MESH = Mesh({"batch": 4, "model": 2})
X = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)


def _grown(ty: TensorType, dim: int, by: int) -> TensorType:
    shape = list(ty.get_shape())
    shape[dim] *= by
    return TensorType(ty.element_type, shape)


def _part(ty: TensorType, dim: int, by: int) -> TensorType:
    shape = list(ty.get_shape())
    shape[dim] //= by
    return TensorType(ty.element_type, shape)


Make = Callable[[SSAValue, TensorType], CollectiveOp]

CASES: dict[type[CollectiveOp], tuple[Distribution, Make, Callable[[np.ndarray], np.ndarray]]] = {
    # A partial argument: each of the 2 "model" devices holds X, so the value is 2 X.
    spmd.AllReduceOp: (Distribution(((), ()), ("model",)), lambda v, t: spmd.AllReduceOp(v, ["model"]), lambda x: 2 * x),
    spmd.AllGatherOp: (
        Distribution((("batch",), ("model",))),
        lambda v, t: spmd.AllGatherOp(v, 1, ["model"], _grown(t, 1, 2)),
        lambda x: x,
    ),
    spmd.ReduceScatterOp: (
        Distribution(((), ("batch",)), ("model",)),
        lambda v, t: spmd.ReduceScatterOp(v, 0, ["model"], _part(t, 0, 2)),
        lambda x: 2 * x,
    ),
    spmd.AllToAllOp: (
        Distribution((("batch", "model"), ())),
        lambda v, t: spmd.AllToAllOp(v, 1, 0, ["model"], _part(_grown(t, 0, 2), 1, 2)),
        lambda x: x,
    ),
    spmd.LocalSliceOp: (
        Distribution(((), ("model",))),
        lambda v, t: spmd.LocalSliceOp(v, 0, ["batch"], _part(t, 0, 4)),
        lambda x: x,
    ),
    # Not a distributed value (each device holds its source's part): read
    # back, device 1 holds device 0's half and device 0, which no pair targets, zeros.
    spmd.CollectivePermuteOp: (
        Distribution((("model",), ())),
        lambda v, t: spmd.CollectivePermuteOp(v, ["model"], [(0, 1)]),
        lambda x: np.concatenate([np.zeros_like(x[:8]), x[:8]]),
    ),
}


@pytest.mark.parametrize("op_class", list(CASES), ids=lambda c: c.name)
def test_result_distribution_matches_shapes_and_values(op_class: type[CollectiveOp]) -> None:
    """The op's result, typed by `result_distribution`, verifies (local shapes
    agree) and the SPMD interpreter gives the expected global value."""
    before, make, expected = CASES[op_class]
    arg = DTensorType.of(TensorType(f32, X.shape), before)
    block = Block(arg_types=[arg])
    local = spmd.ToLocalOp(block.args[0], arg.local_type(MESH))
    op = make(local.result, local.result.type)
    after = DTensorType.of(arg.global_type, op.result_distribution(before))
    back = spmd.FromLocalOp(op.results[0], after)
    block.add_ops([local, op, back, func.ReturnOp(back.result)])
    main = func.FuncOp("main", ((arg,), (after,)), Region(block))
    module = ModuleOp([MESH.to_op(), main])
    module.verify()
    (got,) = run_spmd(module, [X])
    np.testing.assert_array_equal(got, expected(X))


@irdl_op_definition
class ThrowawayOp(CollectiveOp):
    """A collective someone started to add: the class only."""

    name = "spmd.throwaway"
    input = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, value, axes):
        super().__init__(
            operands=[value], result_types=[value.type], properties={"axes": _axes(axes)}
        )


def test_an_op_missing_its_pieces_is_named() -> None:
    assert missing_pieces([*SPMD.operations, ThrowawayOp]) == [
        "spmd.throwaway: no result_distribution",
        "spmd.throwaway: no @impl in SpmdFunctions",
        "spmd.throwaway: no entry in the JAX emitter",
    ]
    op = next(op for op in _module_with(ThrowawayOp).walk() if isinstance(op, ThrowawayOp))
    with pytest.raises(NotImplementedError, match=r"spmd\.throwaway does not say how"):
        op.result_distribution(Distribution(((), ())))


def _module_with(make: type[CollectiveOp]) -> ModuleOp:
    """`@main(%x: tensor<8x4xf32>)` applying `make(%x, ["model"])` and the
    all-reduce every program has, on a 4x2 mesh."""
    ty = TensorType(f32, [8, 4])
    main = func.FuncOp("main", ((ty,), (ty, ty)))
    x = main.body.block.args[0]
    new = make(x, ["model"])  # type: ignore[call-arg]
    known = spmd.AllReduceOp(x, ["model"])
    main.body.block.add_ops([new, known, func.ReturnOp(new.results[0], known.results[0])])
    return ModuleOp([MeshOp({"batch": 4, "model": 2}), main])


def test_a_new_collective_is_counted_with_no_table_to_update() -> None:
    found = collectives(_module_with(ThrowawayOp))
    assert [(c.kind, c.axes, c.bytes_per_device) for c in found] == [
        ("throwaway", ("model",), 8 * 4 * 4),
        ("all_reduce", ("model",), 8 * 4 * 4),
    ]
