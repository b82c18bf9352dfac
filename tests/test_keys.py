"""Typed PRNG keys (`jax.random.key`) as arguments and results of partir.jit.

partir runs a key as its data (`partir.keys`): the bits are those of
`jax.jit`, exactly, and keys come back as keys. With threefry keys (the
default) the bits are integer ops that partition like any others; with
`rbg` / `unsafe_rbg` keys they come from `stablehlo.rng_bit_generator`,
which every device runs whole (a part's bits are not a slice of the whole's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from dialects.interpreter import run_function
from dialects.stablehlo_ext import RngBitGeneratorOp
from tests.test_names_and_determinism import assert_stages_round_trip

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
    device's rows, and so does categorical's argmax (a reduce of two
    operands, each result in a loop of its own): no collective."""
    _, logits, _ = args()
    compiled = partir.jit(nucleus_step, mesh=MESH,
                          tactics=[partir.BatchParallel("batch", inputs="logits")])
    key, tokens = compiled(jax.random.key(7), logits)
    want_key, want_tokens = jax.jit(nucleus_step)(jax.random.key(7), logits)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(want_key))
    report = compiled.lower(jax.random.key(7), logits).report()
    assert report.collectives == []


def dropout_step(key, w, x):
    """A layer with dropout, and the key for the next step."""
    key, sub = jax.random.split(key)
    h = jnp.tanh(x @ w)
    keep = jax.random.bernoulli(sub, 0.8, h.shape)
    return key, jnp.where(keep, h / 0.8, 0.0), jnp.mean(h) + jax.random.normal(sub, ())


def dropout_args():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((16, 32)).astype(np.float32),
            rng.standard_normal((8, 16)).astype(np.float32))


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_a_dropout_step_with_an_rbg_key_matches_jax_jit_bit_for_bit(impl):
    """The mask's bits come from stablehlo.rng_bit_generator: drawn whole on
    every device (the report says why), then each device keeps its rows."""
    w, x = dropout_args()
    key = jax.random.key(11, impl=impl)
    compiled = partir.jit(dropout_step, mesh=MESH,
                          tactics=[partir.BatchParallel("batch", inputs="x")])
    next_key, h, mean = compiled(key, w, x)
    want_key, want_h, want_mean = jax.jit(dropout_step)(key, w, x)
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(jax.random.key_data(next_key), jax.random.key_data(want_key))
    np.testing.assert_allclose(mean, want_mean, rtol=1e-5)
    lowered = compiled.lower(key, w, x)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_reduce", ("batch",))]
    draws = [r for r in lowered.report().replicated_ops if r.op == "stablehlo.rng_bit_generator"]
    assert draws and all("not a slice" in r.detail for r in draws)
    assert "lax.rng_bit_generator(" in lowered.source
    assert_stages_round_trip(lowered)


def test_the_interpreter_draws_jax_jits_rbg_bits():
    """The bits are XLA's choice; the interpreter draws them as jax.jit does on CPU."""

    def bits(key_data):
        key = jax.random.wrap_key_data(key_data, impl="rbg")
        return jax.random.bits(key, (3, 5), jnp.uint8), jax.random.bits(key, (4,), jnp.uint32)

    data = jax.random.key_data(jax.random.key(2, impl="rbg"))
    module = partir.import_jax(bits, data)
    assert any(isinstance(op, RngBitGeneratorOp) for op in module.walk())
    for got, want in zip(run_function(module, [data]), jax.jit(bits)(data), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("partitionable", [True, False])
def test_threefry_noise_tiled_over_the_batch_matches_jax_jit_bit_for_bit(partitionable):
    """threefry (the default key) counts its blocks with iotas; tiled over
    the batch, the counter along the batch stays whole (iota's counting dim
    is blocked) and each device computes the bits of its own rows: the same
    bits, in either counting scheme (`jax_threefry_partitionable`), with no
    collective."""

    def noisy(key, x):
        dropped = jnp.where(jax.random.bernoulli(key, 0.5, x.shape), x, 0.0)
        return x * jax.random.normal(key, x.shape), dropped

    x = np.random.default_rng(6).standard_normal((16, 8)).astype(np.float32)
    key = jax.random.key(9)
    with jax.threefry_partitionable(partitionable):
        compiled = partir.jit(noisy, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
        got, want = compiled(key, x), jax.jit(noisy)(key, x)
        lowered = compiled.lower(key, x)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, e)
    assert lowered.collectives == []
    assert [r.local_shape for r in lowered.report().results] == [(4, 8), (4, 8)]  # tiled
