"""Mesh axes of one device distribute nothing: no collective is made over
them, and a 1-device mesh's program compiles to jax.jit's (the same
transposes and copies, no collective, the same numbers)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import partir
from benchmarks.hlo_stats import collective_ops, op_census
from benchmarks.vs_jit import STRATEGIES, baseline
from examples import block_train_step, mlp_train_step
from tests.numerics import assert_leaves_close


def _compiled_hlo(program, args, mesh, tactics):
    """partir's compiled program, its XLA HLO text and the inputs placed as it takes them."""
    compiled = partir.jit(program, mesh=mesh, tactics=tactics).lower(*args).compile()
    _, in_shardings = baseline(program, args, compiled)
    leaves = jax.tree_util.tree_leaves(args)
    inputs = [jax.device_put(x, s) for x, s in zip(leaves, in_shardings, strict=True)]
    return compiled, compiled.run.lower(*inputs).compile().as_text()


def _jit_hlo(program, args) -> str:
    text = jax.jit(program).lower(*args).compile().as_text()
    assert text is not None
    return text




@pytest.mark.parametrize("strategy", ["DP+TP", "ZeRO-3"])
def test_a_one_device_mesh_compiles_to_jax_jits_program(strategy):
    """The block training step on {"batch": 1, "model": 1}: no collective in
    the SPMD program or XLA's, transposes and copies as jax.jit's (± 2:
    XLA's layout choices), and jax.jit's numbers."""
    args = block_train_step.make_args(batch=2, seq=8, width=16, mlp_width=32)
    program = block_train_step.program
    mesh = partir.Mesh({"batch": 1, "model": 1})
    lowered = partir.jit(program, mesh=mesh, tactics=STRATEGIES[strategy]).lower(*args)
    assert lowered.collectives == []
    assert "spmd." not in lowered.stage("spmd").replace("spmd.to_local", "").replace(
        "spmd.from_local", ""
    ).replace("spmd.dtensor", "")
    compiled, ours = _compiled_hlo(program, args, mesh, STRATEGIES[strategy])
    ref = _jit_hlo(program, args)
    got, want = op_census(ours), op_census(ref)
    assert collective_ops(ours) == []
    for op in ("transpose", "copy"):
        assert abs(got[op] - want[op]) <= 2, (op, got, want)
    assert_leaves_close(compiled(*args), jax.jit(program)(*args), what=strategy)


def test_an_axis_of_one_device_gets_no_collective_beside_a_real_one():
    """{"batch": 8, "model": 1} under DP + Megatron: the batch's gradient
    sums remain, over all 8 devices; nothing runs over "model", in the SPMD
    program or in XLA's (no group of one device), and the specs name only
    "batch"."""
    args = mlp_train_step.make_args(batch=16, d_in=16, hidden=32, d_out=8)
    program = mlp_train_step.program
    mesh = partir.Mesh({"batch": 8, "model": 1})
    lowered = partir.jit(program, mesh=mesh, tactics=STRATEGIES["DP+TP"]).lower(*args)
    assert lowered.collectives
    assert {c.axes for c in lowered.collectives} == {("batch",)}
    compiled, ours = _compiled_hlo(program, args, mesh, STRATEGIES["DP+TP"])
    specs = [*compiled.program.IN_SPECS, *compiled.program.OUT_SPECS]
    assert all("model" not in str(spec) for spec in specs)
    assert any("batch" in str(spec) for spec in specs)
    groups = [g for c in collective_ops(ours) for g in c.groups]
    assert groups and all(len(g) == 8 for g in groups), groups
    assert_leaves_close(compiled(*args), jax.jit(program)(*args), what="DP+TP on 8x1")


def test_a_halo_over_an_axis_of_one_device_is_zeros_not_a_permute():
    """A convolution's rows split over an axis of one device: its halos are
    the zeros past the ends, with no collective permute."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)

    def conv(x, w):
        return lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    mesh = partir.Mesh({"batch": 2, "rows": 1})
    tactics = [partir.ManualPartition({"x": {1: "rows", 0: "batch"}})]
    compiled = partir.jit(conv, mesh=mesh, tactics=tactics)
    lowered = compiled.lower(x, w)
    assert lowered.collectives == []
    assert "ppermute" not in lowered.source
    assert_leaves_close(compiled(x, w), jax.jit(conv)(x, w), what="conv, rows over 1 device")


def test_an_op_cloned_into_each_loop_that_slices_it_is_computed_once():
    """ZeRO-3 slices each gradient into its parameter's and both moments'
    updates. The rewrite engine (`partir-opt`'s passes) clones the
    gradient's transpose into each; the decided path builds each op once, so
    the ZeRO stage and the SPMD program transpose it once, as the imported
    program does (and one device's compiled program has jax.jit's census)."""
    args = block_train_step.make_args(batch=4, seq=8, width=16, mlp_width=32)
    mesh = partir.Mesh({"batch": 4, "model": 2})
    lowered = partir.jit(
        block_train_step.program, mesh=mesh, tactics=STRATEGIES["ZeRO-3"]
    ).lower(*args)
    count = [lowered.stage(s).count("stablehlo.transpose") for s in ("import", "ZeRO", "spmd")]
    assert count[1] == count[0] and count[2] == count[0], count
