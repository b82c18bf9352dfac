"""Typed PRNG keys (`jax.random.key`) as arguments and results of partir.jit.

partir runs a key as its data (`partir.keys`): the bits are those of
`jax.jit`, exactly, and keys come back as keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import partir

MESH = partir.Mesh({"batch": 4, "model": 2})


def sampling_step(key, logits, temperature):
    """Sample a token per row at a temperature, and the key for the next step."""
    key, sample_key = jax.random.split(key)
    tokens = jax.random.categorical(sample_key, logits / temperature, axis=-1)
    noise = jax.random.normal(sample_key, logits.shape)
    return key, tokens, jnp.mean(noise * logits)


def args():
    logits = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    return jax.random.key(42), logits, np.float32(0.7)


def test_a_sampling_step_takes_and_returns_keys_with_jax_jits_bits():
    tactics = [partir.BatchParallel("batch", inputs="logits")]
    compiled = partir.jit(sampling_step, mesh=MESH, tactics=tactics)
    key, tokens, mean = compiled(*args())
    want_key, want_tokens, want_mean = jax.jit(sampling_step)(*args())
    assert key.dtype == want_key.dtype  # a key, of the same implementation
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(want_key))
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-5)
    # the next step takes the returned key as it is
    again = compiled(key, *args()[1:])
    np.testing.assert_array_equal(again[1], jax.jit(sampling_step)(want_key, *args()[1:])[1])
    lowered = compiled.lower(*args())
    assert "ui32" in lowered.stage("import")  # the key's data, uint32[2]


def test_keys_pass_the_stage_checks():
    compiled = partir.jit(sampling_step, mesh=MESH, check=True,
                          tactics=[partir.BatchParallel("batch", inputs="logits")])
    key, tokens, _ = compiled(*args())
    np.testing.assert_array_equal(tokens, jax.jit(sampling_step)(*args())[1])
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


def test_a_batch_of_keys_splits_with_its_data():
    """A key per example (`split` into 16), tiled over "batch" like data."""

    def noisy(keys, x):
        return x + jax.vmap(lambda k: jax.random.normal(k, (32,)))(keys)

    keys = jax.random.split(jax.random.key(3), 16)
    x = np.zeros((16, 32), np.float32)
    compiled = partir.jit(noisy, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    np.testing.assert_array_equal(compiled(keys, x), jax.jit(noisy)(keys, x))


def nucleus_step(key, logits, top_p=0.9):
    """Top-p sampling, as decoding loops write it: sort the probabilities,
    keep the smallest set whose cumulative sum reaches `top_p` (`cumsum`),
    sample from it with `categorical` on a typed key, return the next key."""
    key, sample_key = jax.random.split(key)
    probs = jax.nn.softmax(logits, axis=-1)
    ordered = -jnp.sort(-probs, axis=-1)
    cutoff_index = jnp.sum(jnp.cumsum(ordered, axis=-1) < top_p, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(ordered, cutoff_index, axis=-1)
    kept = jnp.where(probs >= cutoff, logits, -jnp.inf)
    return key, jax.random.categorical(sample_key, kept, axis=-1)


def test_a_nucleus_sampling_step_with_sort_cumsum_and_a_typed_key():
    """Issue 16's sampling program, split over the batch: the same tokens
    and next key as jax.jit. The sort, cumsum and masking run on each
    device's rows; the one collective gathers the noisy logits for
    categorical's argmax, a variadic reduce (two results: whole to
    propagation, issue 16)."""
    _, logits, _ = args()
    compiled = partir.jit(nucleus_step, mesh=MESH,
                          tactics=[partir.BatchParallel("batch", inputs="logits")])
    key, tokens = compiled(jax.random.key(7), logits)
    want_key, want_tokens = jax.jit(nucleus_step)(jax.random.key(7), logits)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(want_key))
    report = compiled.lower(jax.random.key(7), logits).report()
    assert [(c.kind, c.axes, c.needed_by) for c in report.collectives] == [
        ("all_gather", ("batch",), "stablehlo.reduce")
    ]
