"""`stablehlo.reduce_window` (`jnp.cumsum`, `lax.cummax`, max and average
pooling): reference semantics, emission, and its rule: a dim whose window is
one element passes through (the batch of a pooled image), a window dim is
blocked until halo exchange exists (issue 16)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from tests.numerics import assert_leaves_close
from tests.test_names_and_determinism import assert_stages_round_trip

MESH = partir.Mesh({"batch": 4, "model": 2})
WINDOWS = {
    "cumsum": lambda x: jnp.cumsum(x, axis=1),
    "cumprod": lambda x: jnp.cumprod(x, axis=2),
    "cummax": lambda x: lax.cummax(x, axis=1),
    "max pool": lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                            "VALID"),
    "average pool, SAME": lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1),
                                                      (1, 2, 2, 1), "SAME") / 9,
    "dilated, cropped": lambda x: lax.reduce_window(
        x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), ((0, 0), (1, 2), (-1, 1), (0, 0)),
        base_dilation=(1, 2, 1, 1), window_dilation=(1, 1, 2, 1)),
}


def images(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((8, 9, 8, 4)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_a_window_over_a_batch_split_input_runs_on_shards(name):
    fn, x = WINDOWS[name], images()
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    want = jax.jit(fn)(x)
    assert_leaves_close(compiled(x), want, what=name)
    lowered = compiled.lower(x)
    assert lowered.collectives == []  # the batch dim passes through every window
    assert_leaves_close(run_function(partir.import_jax(fn, x), [x]), want, what="core interpreter")
    assert_leaves_close(run_spmd(lowered.module, [x]), want, what="SPMD interpreter")


def test_a_split_window_dim_is_gathered_and_the_report_says_why():
    """Splitting the pooled height over "model": the pool's window would need
    the neighbouring part's rows, so it runs on the whole height (a halo
    exchange would be cheaper: issue 16)."""
    fn, x = WINDOWS["max pool"], images()[:, :8]
    tactics = [partir.ManualPartition({"x": {0: "batch", 1: "model"}})]
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(x), jax.jit(fn)(x), what="max pool over split rows")
    lowered = compiled.lower(x)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_gather", ("model",))]
    assert_stages_round_trip(lowered)


def test_position_ids_from_a_cumsum_of_the_mask():
    """The position ids of a padded batch (`cumsum(mask) - 1`), split over
    the batch with the tokens they index."""

    def positions(mask, table):
        ids = jnp.cumsum(mask, axis=1) - 1
        return jnp.take(table, jnp.maximum(ids, 0), axis=0) * mask[..., None]

    rng = np.random.default_rng(1)
    mask = (rng.random((8, 16)) > 0.3).astype(np.int32)
    table = rng.standard_normal((16, 4)).astype(np.float32)
    compiled = partir.jit(positions, mesh=MESH,
                          tactics=[partir.BatchParallel("batch", inputs="mask")])
    assert_leaves_close(compiled(mask, table), jax.jit(positions)(mask, table), what="positions")
