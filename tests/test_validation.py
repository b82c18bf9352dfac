"""Translation validation: `partir.jit(check=True)` and `partir-opt --check-numerics`.

Clean runs pass on the example training steps; a fault injected into one
stage (a registry rule, the SPMD lowering, the emitted program) is caught at
that stage, by name, where the unchecked run returns wrong numbers silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from dialects.functions import entry_function
from dialects.spmd import AllReduceOp
from examples import block_train_step, mlp_train_step
from lowering import distributions
from partir.opt import main as partir_opt
from partir.validation import (
    Reference,
    ValidationError,
    index_bounds,
    positive_arguments,
    random_arguments,
)
from rewrites import registry
from rewrites.registry import FactorKind, OpRule
from tests.numerics import assert_close

MESH = partir.Mesh({"batch": 4, "model": 2})
DATA = partir.Mesh({"batch": 4})
DP_TP = [partir.BatchParallel("batch"), partir.Megatron("model")]
DP_ZERO = [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)]


def small_mlp():
    return mlp_train_step.make_args(batch=8, d_in=8, hidden=16, d_out=8)


def small_block():
    return block_train_step.make_args(batch=4, seq=4, width=16, mlp_width=32)


@pytest.mark.parametrize(
    ("example", "make_args", "mesh", "tactics"),
    [
        (mlp_train_step, small_mlp, MESH, DP_TP),
        (mlp_train_step, small_mlp, DATA, DP_ZERO),
        (block_train_step, small_block, MESH, DP_TP),
        (block_train_step, small_block, DATA, DP_ZERO),
    ],
    ids=["mlp-dp+megatron", "mlp-dp+zero3", "block-dp+megatron", "block-dp+zero3"],
)
def test_check_passes_every_stage_of_the_training_steps(example, make_args, mesh, tactics):
    args = make_args()
    got = partir.jit(example.program, mesh=mesh, tactics=tactics, check=True)(*args)
    want = jax.jit(example.program)(*args)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert_close(np.asarray(g), np.asarray(w))


# --------------------------------------------------------------------------
# Fault injection: each broken stage is named, and unchecked it is silent


def max_and_sum(x):
    return {"max": jnp.max(x, axis=1), "sum": jnp.sum(x, axis=1)}


X = np.arange(32, dtype=np.float32).reshape(4, 8)
COLUMNS = [partir.ManualPartition({"x": {1: "model"}})]


def reduce_max_as_sum(op) -> OpRule | None:
    """The bug: the reduced dims of any reduce are sum factors, a max's too."""
    rule = registry.reduce_rule(op)
    if rule is None:
        return None
    factors = tuple(
        f if f.kind is not FactorKind.BLOCKED else type(f)(f.size, FactorKind.SUM)
        for f in rule.factors
    )
    return OpRule(factors, rule.operands, rule.results, rule.localize)


def test_a_broken_registry_rule_is_caught_at_the_tactic_that_used_it(monkeypatch):
    monkeypatch.setitem(registry.RULES, "stablehlo.reduce", reduce_max_as_sum)
    mesh = partir.Mesh({"model": 2})
    silent = partir.jit(max_and_sum, mesh=mesh, tactics=COLUMNS)(X)
    np.testing.assert_array_equal(silent["max"], X[:, 3] + X[:, 7])  # max of each half, summed
    with pytest.raises(ValidationError) as caught:
        partir.jit(max_and_sum, mesh=mesh, tactics=COLUMNS, check=True)(X)
    err = caught.value
    assert err.stage == "ManualPartition"
    assert err.difference is not None
    assert (err.difference.output, err.difference.index) == ("result['max']", (0,))
    assert (err.difference.got, err.difference.want) == (10.0, 7.0)
    message = str(err)
    assert "\n" not in message
    assert message.startswith(
        "check=True: stage 'ManualPartition' (tactic ManualPartition with its propagation, "
        "on the reference interpreter) changes the numbers: result['max'] at index (0,) is 10 "
        "but the original gives 7 (float32: |difference| must be <= 1e-05*|original| + "
    )
    assert "the stages before it agree: import." in message


def test_every_call_is_checked_on_its_own_arguments(monkeypatch):
    """With the broken rule, data whose second half of each row is zero gives
    the right maximum (max + 0); the next call's data does not."""
    monkeypatch.setitem(registry.RULES, "stablehlo.reduce", reduce_max_as_sum)
    step = partir.jit(max_and_sum, mesh=partir.Mesh({"model": 2}), tactics=COLUMNS, check=True)
    lucky = np.concatenate([X[:, :4], np.zeros((4, 4), np.float32)], axis=1)
    np.testing.assert_array_equal(step(lucky)["max"], lucky.max(axis=1))
    with pytest.raises(ValidationError, match="stage 'ManualPartition'"):
        step(X)


def test_a_dropped_collective_is_caught_at_the_spmd_stage(monkeypatch):
    """The lowering forgets the all-reduces over "model": devices that the
    SPMD types call replicas disagree, which the SPMD interpreter refuses.
    (A result's all-reduce is left alone: the emitter refuses a pending
    partial sum at the boundary before any stage runs.)"""
    monkeypatch.setattr(
        distributions,
        "AllReduceOp",
        lambda value, axes: AllReduceOp(value, tuple(a for a in axes if a != "model")),
    )
    args = small_mlp()
    with pytest.raises(ValidationError, match=r"^check=True: stage 'spmd' \(pass partir-lower-"):
        partir.jit(mlp_train_step.program, mesh=MESH, tactics=DP_TP, check=True)(*args)


def test_a_wrong_emitted_collective_is_caught_at_the_emitted_stage(monkeypatch):
    """The emitted program takes a maximum where it should sum over devices:
    every interpreted stage agrees, only the JAX run differs."""
    monkeypatch.setattr(jax.lax, "psum", jax.lax.pmax)
    mesh = partir.Mesh({"model": 2})
    silent = partir.jit(max_and_sum, mesh=mesh, tactics=COLUMNS)(X)
    assert not np.allclose(silent["sum"], X.sum(axis=1))
    with pytest.raises(ValidationError) as caught:
        partir.jit(max_and_sum, mesh=mesh, tactics=COLUMNS, check=True)(X)
    assert caught.value.stage == "emitted"
    assert caught.value.difference is not None
    assert caught.value.difference.output == "result['sum']"
    assert "the stages before it agree: import, ManualPartition, spmd." in str(caught.value)


# --------------------------------------------------------------------------
# partir-opt --check-numerics

MLP_PIPELINE = (
    'partir-declare-mesh{axes="batch=4","model=2"},partir-batch-parallel{axis=batch},'
    "partir-megatron{axis=model},partir-lower-spmd"
)


def test_partir_opt_names_the_pass_that_changed_the_numbers(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(registry.RULES, "stablehlo.reduce", reduce_max_as_sum)
    source = tmp_path / "max.mlir"
    source.write_text(str(partir.import_jax(max_and_sum, X)))
    pipeline = 'partir-declare-mesh{axes="model=2"},partir-tile{value=x dim=1 axis=model}'
    pipeline += ",partir-propagate,partir-lower-spmd"
    assert partir_opt([str(source), "-p", pipeline]) == 0  # unchecked: wrong, silently
    capsys.readouterr()
    assert partir_opt([str(source), "-p", pipeline, "--check-numerics"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "error: --check-numerics: pass partir-propagate changes the numbers: result['max'] at "
        "index (0,) is "
    )
    assert "(random inputs, seed 0); the stages before it agree: partir-declare-mesh, " in err
    assert "partir-tile." in err


def test_partir_opt_check_numerics_passes_a_correct_pipeline(capsys):
    argv = ["examples/mlp_train_step.mlir", "-p", MLP_PIPELINE + ",partir-emit-jax"]
    assert partir_opt([*argv, "--check-numerics"]) == 0
    assert "lax.psum" in capsys.readouterr().out


def test_partir_opt_runs_the_emitted_program_on_jax(monkeypatch, capsys):
    """Every interpreted pass agrees; the emitted program takes a maximum
    where it should sum over devices, and only its run on JAX shows that."""
    monkeypatch.setattr(jax.lax, "psum", jax.lax.pmax)
    argv = ["examples/mlp_train_step.mlir", "-p", MLP_PIPELINE + ",partir-emit-jax"]
    assert partir_opt([*argv, "--check-numerics"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "error: --check-numerics: pass partir-emit-jax (the emitted jax.shard_map program, run "
        "by JAX) changes the numbers: result[0] is "
    )
    assert "partir-megatron, partir-lower-spmd. This is a bug in partir" in err


# --------------------------------------------------------------------------
# Random inputs the program is defined on


def test_random_indices_stay_in_bounds_and_domains_positive():
    def program(table, rows, start, v):
        picked = jnp.take(table, rows, axis=0)  # a gather over 10 rows
        window = jax.lax.dynamic_slice_in_dim(table, start, 4, axis=0)  # 10 - 4 + 1 starts
        return picked.sum() + window.sum() + jnp.sqrt(v).sum()

    table, rows = np.ones((10, 3), np.float32), np.zeros((64,), np.int32)
    module = partir.import_jax(program, table, rows, np.int32(0), np.ones(5, np.float32))
    entry = entry_function(module)
    assert index_bounds(entry) == {1: 10, 2: 7}
    assert positive_arguments(entry) == {3}
    _, got_rows, got_start, got_v = random_arguments(module, seed=3)
    assert got_rows.min() >= 0 and got_rows.max() < 10 and len(set(got_rows.tolist())) > 5
    assert 0 <= int(got_start) < 7
    assert got_v.min() >= 0.5
    assert [a.tolist() for a in random_arguments(module, seed=3)[1:3]] == [
        got_rows.tolist(),
        got_start.tolist(),
    ]  # deterministic


@dataclass
class Amplifies:
    """An original that moves `gain` times as far as its input does (an
    ill-conditioned program, when `gain` is large), around the output `x0`."""

    x0: np.ndarray
    gain: float

    def __call__(self, args):
        (x,) = args
        return [((x.astype(np.float64) - self.x0) * self.gain + self.x0).astype(np.float32)]


def test_the_tolerance_grows_with_the_originals_own_rounding_noise():
    x = np.linspace(1, 2, 16, dtype=np.float32)
    calm = Reference.of(Amplifies(x, 1.0), [x], ["y"])
    assert calm.first_difference([calm.outputs[0] * (1 + 5e-6)]) is None
    assert calm.first_difference([calm.outputs[0] * (1 + 1e-3)]) is not None
    wild = Reference.of(Amplifies(x, 1e4), [x], ["y"])
    assert wild.first_difference([wild.outputs[0] * (1 + 1e-3)]) is None
    assert wild.first_difference([wild.outputs[0] * 2]) is not None


def test_a_bfloat16_discontinuity_rounded_the_other_way_is_not_a_bug():
    """Adam's first step on a bfloat16 bias whose gradient cancels to ~0:
    XLA's float32 fusions and the interpreter's per-op rounding may give the
    gradient opposite signs, so one element moves by 2 * lr (an NNX GPT, 1 of
    256). A few such elements pass in 16-bit floats, never in float32, and
    never more than 1% or outside the output's range."""
    import ml_dtypes

    lr = 1e-3
    signs = np.where(np.arange(256) % 3, 1.0, -1.0)
    for dtype, allowed in ((ml_dtypes.bfloat16, True), (np.float16, True), (np.float32, False)):
        want = (-lr * signs).astype(dtype)
        reference = Reference(("bias",), (want,), (0.0,))
        flipped = want.copy()
        flipped[2] = -flipped[2]
        assert (reference.first_difference([flipped]) is None) == allowed, dtype
        many = want.copy()
        many[:8] = -many[:8]  # 8 of 256: a broken slice, not rounding
        assert reference.first_difference([many]) is not None
        out_of_range = want.copy()
        out_of_range[2] = 10 * lr
        assert reference.first_difference([out_of_range]) is not None
