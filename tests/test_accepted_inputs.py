"""Inputs that look unusual but are fine: partir.jit runs them as jax.jit does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from partir.report.memory import XlaMemory
from partir.selectors import select

MESH = partir.Mesh({"batch": 4, "model": 2})
X = np.arange(32, dtype=np.float32).reshape(8, 4)


def noisy(x):
    return x + jax.random.normal(jax.random.PRNGKey(0), x.shape)


def dropout(key, x):
    keep = jax.random.bernoulli(key, 0.7, x.shape)
    return jnp.where(keep, x / 0.7, 0.0) + jax.random.uniform(key, x.shape)


@pytest.mark.parametrize(("fn", "args"), [(noisy, (X,)), (dropout, (jax.random.PRNGKey(3), X))],
                         ids=["normal", "bernoulli-uniform"])
def test_random_programs_with_64bit_internals_run_without_x64(fn, args):
    """jax.random lowers to uint64 counters although the data is 32-bit."""
    assert not jax.config.jax_enable_x64
    lowered = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")]).lower(*args)
    assert "USES_64BIT_TYPES = True" in lowered.source
    got = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])(*args)
    want = jax.jit(fn)(*args)
    assert got.dtype == want.dtype and not jax.config.jax_enable_x64
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    xla = XlaMemory.of(lowered.compile(), args)  # through build()'s x64 wrapper's .lower
    assert xla.arguments >= X.nbytes // 4  # x split over "batch" (plus a key)


def test_a_key_holding_a_slash_is_one_segment():
    paths = ["d['a']['b']", "d['a/b']"]
    assert select("d['a']['b']", paths) == [0]
    assert select("d['a/b']", paths) == [1]
    assert select("d/a/b", paths) == [0]
    assert select("d/*", paths) == [1]
    assert select("d/**", paths) == [0, 1]


def test_quoted_keys_are_read_as_python_reads_them():
    paths = ["d[\"x'y\"]", "d['é\\\\']"]
    assert select("d/x'y", paths) == [0]
    assert select("d/é\\", paths) == [1]


def test_a_sharding_constraint_in_user_code_is_honoured_before_the_tactics():
    """`with_sharding_constraint` is the user's annotation (`partir.Annotations`
    runs first): the constrained value's rows are split over "model", and
    BatchParallel then splits them further over "batch" (rows over both);
    the numbers are jax.jit's, and no stage after the annotations holds it."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)

    def f(x):
        y = jnp.sin(x)
        return 2 * jax.lax.with_sharding_constraint(y, NamedSharding(mesh, PartitionSpec("model")))

    compiled = partir.jit(f, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    np.testing.assert_allclose(compiled(X), jax.jit(f)(X), rtol=1e-6)
    lowered = compiled.lower(X)
    assert [s.name for s in lowered.stages] == ["import", "Annotations", "BatchParallel", "spmd"]
    assert "sdy.sharding_constraint" in lowered.stage("import")
    assert "sdy." not in lowered.stage("Annotations")
    assert lowered.collectives == []
