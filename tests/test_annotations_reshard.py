"""A `reshard` that changes a sharding the program already states is a value
of its own (`partir.annotations.is_reshard`).

Under an explicit mesh on the 4x2 CPU mesh ("batch", "model"): an argument
typed `P("batch", None)` resharded whole, or with its split moved to the
other dim, is whole (moved) after the reshard, with jax.jit's numbers and
jax.jit's collective; a later tactic that splits the value the reshard
redistributes is a reported conflict.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import partir
from tests.numerics import assert_leaves_close
from tests.test_annotations import EXPLICIT, MESH, annotated, line_of, rand


def out_specs(lowered) -> str:
    return lowered.source.split("OUT_SPECS = (", 1)[1].split(")\n", 1)[0]


def jax_collectives(fn, *args) -> str:
    """jax.jit's compiled HLO, for the collectives it chose."""
    return jax.jit(fn).lower(*args).compile().as_text() or ""


def gathered(x, w):
    y = jax.sharding.reshard(x, P(None, None))
    return jnp.sin(y) @ w


def test_a_reshard_to_whole_of_an_argument_typed_split_is_honoured():
    """`x` arrives split over "batch" (its type); the reshard makes it
    whole: one all-gather, as jax.jit's, then the sine on the whole value
    on every device; the result leaves whole, as its type says."""
    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(rand(8, 6), P("batch", None))
        w = jax.device_put(rand(6, 3), P(None, None))
        want = jax.jit(gathered)(x, w)
        fn = partir.jit(gathered, mesh=MESH, check=True)  # the stages run on the interpreter
        lowered = fn.lower(x, w)
        got = fn(x, w)
        hlo = jax_collectives(gathered, x, w)
    assert_leaves_close(got, want)
    assert "all-gather" in hlo
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_gather", ("batch",))]
    assert "stablehlo.sine %0 {dist = !spmd.dtensor<8x6xf32, [{}, {}]>}" in lowered.stage("spmd")
    assert "P(None, None)" in out_specs(lowered) and lowered.conflicts == []
    line = line_of(gathered, "reshard(")
    (kept,) = [s for s in annotated(lowered) if s.dim is None]
    assert kept.reason == f"reshard at test_annotations_reshard.py:{line}"
    assert kept.leaf.startswith("@jit(gathered)/reshard at") and kept.split == "not split"
    assert "sdy.sharding_constraint" in lowered.stage("Annotations")  # kept, as a reshard


def moved(x, scale):
    y = jax.sharding.reshard(x, P(None, "batch"))
    return jnp.sin(y) * scale


def test_a_reshard_moving_a_split_to_the_other_dim_is_an_all_to_all():
    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(rand(8, 8), P("batch", None))
        scale = jax.device_put(rand(8, 8), P(None, "batch"))
        want = jax.jit(moved)(x, scale)
        fn = partir.jit(moved, mesh=MESH)
        lowered = fn.lower(x, scale)
        got = fn(x, scale)
        hlo = jax_collectives(moved, x, scale)
    assert_leaves_close(got, want)
    assert "all-to-all" in hlo
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_to_all", ("batch",))]
    assert "P(None, 'batch')" in out_specs(lowered) and lowered.conflicts == []


def kept_whole_then_added(x, bias):
    y = jax.sharding.reshard(x, P(None, None))
    return jnp.sin(y) + bias


def test_a_later_tactic_splitting_what_a_reshard_redistributes_is_a_reported_conflict():
    """BatchParallel splits `x` (typed over "model") over "batch" too and
    `bias` over "batch": the reshard gathers `x` whole (it wins over the
    tactic's split of it), and the tactic's split of the sum reaches the
    whole value's rows; both are reported, with the reshard's line."""
    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(rand(8, 8), P("model", None))
        bias = jax.device_put(rand(8, 8), P(None, None))
        want = jax.jit(kept_whole_then_added)(x, bias)
        fn = partir.jit(kept_whole_then_added, mesh=MESH, tactics=[partir.BatchParallel("batch")])
        lowered = fn.lower(x, bias)
        got = lowered.compile()(x, bias)
    assert_leaves_close(got, want)
    where = f"reshard at test_annotations_reshard.py:{line_of(kept_whole_then_added, 'reshard(')}"
    (undone, split) = lowered.conflicts
    assert (undone.winner, undone.axis) == (where, "batch")
    assert "BatchParallel of x" in undone.loser and "stops at the reshard" in undone.detail
    assert split.loser == where and "BatchParallel of bias" in split.winner
    assert "P(None, None) keeps dim 0 whole" in split.detail
    assert lowered.report().conflicts == lowered.conflicts
    gather = [c for c in lowered.collectives if c.kind == "all_gather"]
    assert gather and set(gather[0].axes) == {"model", "batch"}  # x made whole at the reshard


def test_a_second_constraint_on_a_value_is_its_own_value_in_auto_mode():
    """`with_sharding_constraint` twice on one value (auto mode): the value
    is split as the first says, then as the second, with jax.jit's numbers."""
    from jax.sharding import NamedSharding

    from tests.test_annotations import AUTO

    def f(x):
        h = jax.lax.with_sharding_constraint(jnp.tanh(x), NamedSharding(AUTO, P("batch", None)))
        h = jax.lax.with_sharding_constraint(h, NamedSharding(AUTO, P(None, "batch")))
        return h * 2.0

    x = rand(8, 8)
    fn = partir.jit(f, mesh=MESH)
    assert_leaves_close(fn(x), jax.jit(f)(x))
    lowered = fn.lower(x)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_to_all", ("batch",))]
    assert lowered.conflicts == []


def gathered_loss(w, x):
    h = jnp.tanh(x @ w)  # typed P("batch", None), as x is
    h = jax.sharding.reshard(h, P(None, None))
    return jnp.sum(jnp.sin(h) ** 2)


def sgd_step(w, x):
    loss, grad = jax.value_and_grad(gathered_loss)(w, x)
    return w - 0.1 * grad, loss


def test_a_training_step_through_a_reshard_to_whole_moves_what_jax_jit_moves():
    """The gradient flows back through the reshard (JAX's transpose is a
    reshard back to the split type): one all-gather forward, one all-reduce
    of the weight's gradient, as jax.jit's program has, and no conflict."""
    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(rand(8, 6), P("batch", None))
        w = jax.device_put(rand(6, 4), P(None, None))
        want = jax.jit(sgd_step)(w, x)
        lowered = partir.jit(sgd_step, mesh=MESH).lower(w, x)
        got = lowered.compile()(w, x)
        hlo = jax_collectives(sgd_step, w, x)
    assert_leaves_close(got, want)
    assert "all-gather(" in hlo and "all-reduce(" in hlo
    kinds = sorted((c.kind, c.axes) for c in lowered.collectives)
    assert kinds == [("all_gather", ("batch",)), ("all_reduce", ("batch",))]
    assert lowered.conflicts == []
