"""`stablehlo.sort` (`jnp.sort`, `jnp.argsort`, `lax.sort` by keys) and
`chlo.top_k` (`lax.top_k`, MoE routing).

Semantics are exact (NaNs last, -0.0 equal to 0.0, stable); the emitter
recognises `lax.sort`'s ascending comparator by what it computes
(`lowering.jax_sort`); the rule passes every dim but the sorted one through.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from lowering.jax_ir import UnsupportedOpError
from tests.test_emit_jax import load, parse, replicated

MESH = partir.Mesh({"batch": 4, "model": 2})
DATA = [partir.BatchParallel("batch", inputs="x")]


def data() -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    x[0, 3], x[1, 2], x[1, 5], x[2, 7] = np.nan, -0.0, 0.0, np.inf
    return x


SORTS = {
    "sort the features": lambda x: jnp.sort(x, axis=1),
    "descending": lambda x: -jnp.sort(-x, axis=1),
    "argsort": lambda x: jnp.argsort(x, axis=1),
    "by two keys": lambda x: lax.sort((jnp.round(x), x), dimension=1, num_keys=2)[1],
    "sort the batch": lambda x: jnp.sort(x, axis=0),
    "median": lambda x: jnp.median(jnp.nan_to_num(x), axis=1),
}


@pytest.mark.parametrize("name", sorted(SORTS))
def test_sorts_match_jax_jit_bit_for_bit(name):
    fn, x = SORTS[name], data()
    compiled = partir.jit(fn, mesh=MESH, tactics=DATA)
    want = np.asarray(jax.jit(fn)(x))
    np.testing.assert_array_equal(np.asarray(compiled(x)), want)
    (core,) = run_function(partir.import_jax(fn, x), [x])
    np.testing.assert_array_equal(core, want)
    (spmd,) = run_spmd(compiled.lower(x).module, [x])
    np.testing.assert_array_equal(spmd, want)


def test_sorting_the_features_of_split_rows_needs_no_collective():
    x = data()
    lowered = partir.jit(SORTS["sort the features"], mesh=MESH, tactics=DATA).lower(x)
    assert lowered.collectives == []
    # sorting along the split batch dim gathers it first
    lowered = partir.jit(SORTS["sort the batch"], mesh=MESH, tactics=DATA).lower(x)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_gather", ("batch",))]


DESCENDING = """
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %r = "stablehlo.sort"(%x) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %gt = stablehlo.compare GT, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %gt : tensor<i1>
  }) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %r : tensor<4x8xf32>
}
"""


def test_a_comparator_lax_sort_cannot_express_is_refused_by_name():
    """A descending comparator (hand-written IR: JAX negates instead) runs in
    the interpreter but cannot be emitted: the error says what to write."""
    x = data()[:4, :8]
    (got,) = run_function(parse(DESCENDING), [np.nan_to_num(x)])
    np.testing.assert_array_equal(got, -np.sort(-np.nan_to_num(x), axis=1))
    with pytest.raises(UnsupportedOpError, match=r"stablehlo\.sort.*not lax\.sort's ascending"):
        load(replicated(parse(DESCENDING)))


TOP_K = {
    "top 3": lambda x: jax.lax.top_k(x, 3),
    "all, NaNs and zeros": lambda x: jax.lax.top_k(x, x.shape[-1]),
    "routing": lambda x: jax.lax.top_k(jax.nn.softmax(jnp.nan_to_num(x), axis=-1), 2),
}


@pytest.mark.parametrize("name", sorted(TOP_K))
def test_top_k_matches_jax_jit_bit_for_bit(name):
    """XLA's order: the IEEE total order (NaN above inf, 0.0 above -0.0),
    ties in index order."""
    fn, x = TOP_K[name], data()
    compiled = partir.jit(fn, mesh=MESH, tactics=DATA)
    want = jax.jit(fn)(x)
    for got, expected in zip(compiled(x), want, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    core = run_function(partir.import_jax(fn, x), [x])
    spmd = run_spmd(compiled.lower(x).module, [x])
    for (values, indices) in (core, spmd):
        np.testing.assert_array_equal(indices, np.asarray(want[1]))
        # the interpreters round the softmax once, from double precision
        np.testing.assert_allclose(values, np.asarray(want[0]), rtol=1e-6)
