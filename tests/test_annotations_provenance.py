"""Whose replicated constraint is it: the user's (honoured) or JAX's own
(explicit mode types every op's result)? Decided by what JAX emits
(`partir.annotations.states_replication`), not by names the user picks; and
in IR with no locations, every constraint is taken as stated, which each
conflict says."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from dialects.context import make_context
from dialects.interpreter.spmd import run_spmd
from dialects.parser import PartirParser
from dialects.sdy import ShardingConstraintOp
from partir.annotations import UNLOCATED, states_replication
from partir.opt import main as partir_opt
from partir.report import parse_module
from rewrites.conflicts import recorded_conflicts
from tests.numerics import assert_leaves_close
from tests.test_annotations import AUTO, EXPLICIT, MESH, line_of, rand


@jax.jit
def _step(p, x):
    hidden = jnp.tanh(x @ p["layers"][0])
    hidden = jax.lax.with_sharding_constraint(hidden, NamedSharding(AUTO, P(None, None)))
    return hidden @ p["layers"][1]


def train(p, x):
    return _step(p, x).sum(axis=1)


def test_a_users_replicated_constraint_in_a_nested_jit_named_with_an_underscore():
    """The user's nested `jax.jit` is named `_step` (JAX writes
    `jit(train)/jit(_step)/sharding_constraint`): its `P(None, None)` is the
    user's, so BatchParallel splitting the value is a reported conflict."""
    p = {"layers": [rand(6, 5), rand(5, 3)]}
    x = rand(8, 6)
    fn = partir.jit(train, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    assert_leaves_close(fn(p, x), jax.jit(train)(p, x))
    (conflict,) = fn.lower(p, x).conflicts
    line = line_of(_step, "with_sharding_constraint")
    assert conflict.loser == f"with_sharding_constraint at test_annotations_provenance.py:{line}"
    assert "BatchParallel" in conflict.winner and conflict.axis == "batch"


LOCATED = """
func.func @main(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %a = sdy.sharding_constraint %x <@mesh, [{}, {}]> : tensor<8x4xf32> loc("jit(f)/jit(_step)/sharding_constraint"("model.py":3:4))
  %b = sdy.sharding_constraint %a <@mesh, [{}, {}]> : tensor<8x4xf32> loc("jit(f)/reshard"("layers.py":9:2))
  %c = sdy.sharding_constraint %b <@mesh, [{}, {}]> : tensor<8x4xf32> loc("jit(f)/jit(p)/add"("model.py":5:4))
  %d = sdy.sharding_constraint %c <@mesh, [{}, {}]> : tensor<8x4xf32> loc("jit(f)/transpose(jvp(p))/reshard")
  %e = sdy.sharding_constraint %d <@mesh, [{}, {}]> : tensor<8x4xf32>
  func.return %e : tensor<8x4xf32>
}
"""


def test_the_rule_reads_what_jax_emits():
    """The user's call (`sharding_constraint`, `reshard`) at a frame of the
    user's code is a statement, whatever the functions are called; a
    constraint typing an op (`add`) is JAX's, and so is one JAX made with no
    frame of the user's on the stack (a name stack and no file); IR with no
    location at all is taken as stated."""
    module = PartirParser(make_context(), LOCATED).parse_module()
    ops = [op for op in module.walk() if isinstance(op, ShardingConstraintOp)]
    assert [states_replication(op) for op in ops] == [True, True, False, False, True]


def typed(x, w):
    return jnp.tanh(x @ w) * 2.0


@pytest.fixture(scope="module")
def explicit_program():
    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(rand(8, 6), P())
        w = jax.device_put(rand(6, 4), P())
        lowered = jax.jit(typed).lower(x, w)
        want = jax.jit(typed)(x, w)
        ours = partir.jit(typed, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
        conflicts = ours.lower(x, w).conflicts
    return lowered.as_text(), (x, w), want, conflicts


def test_partir_opt_on_text_without_locations_takes_every_constraint_as_stated(
    explicit_program, tmp_path
):
    """Explicit mode types every op's result `P(None, None)`. partir.jit
    reads the locations and splits through JAX's own types with no conflict;
    `partir-opt` on the text printed without debug info cannot tell them
    from the user's: each split one is a reported conflict that says so,
    and the numbers are jax.jit's."""
    text, args, want, located_conflicts = explicit_program
    assert located_conflicts == []
    source, out = tmp_path / "typed.mlir", tmp_path / "typed.spmd.mlir"
    source.write_text(text)
    pipeline = (
        'inline-calls,partir-declare-mesh{axes="batch=4","model=2"},partir-annotations,'
        'partir-batch-parallel{axis=batch inputs="args/0"},partir-lower-spmd'
    )
    assert partir_opt([str(source), "-p", pipeline, "-o", str(out)]) == 0
    module = parse_module(out.read_text(), str(out))
    conflicts = recorded_conflicts(module)
    assert len(conflicts) == 4  # the dot, the tanh, the broadcast 2.0 and the product
    for conflict in conflicts:
        assert conflict.loser == UNLOCATED and "BatchParallel" in conflict.winner
        assert "the IR has no locations, so every constraint is taken as stated" in conflict.detail
    assert_leaves_close(run_spmd(module, [*args]), [want])
