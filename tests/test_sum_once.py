"""A partial sum is summed once, whatever reads it (`lowering.distributions`).

A bf16 step with dynamic loss scaling reads each gradient twice: whole, for
the `isfinite` check that decides whether to apply the step, and, under
ZeRO-1, split, for the Adam update of the optimizer state's shard. The
gradient was summed once per reader (an all-reduce for the check and a
reduce-scatter for the update: twice what plain data parallelism moves).
Now the second reader reuses the first one's sum: the update takes its part
of the all-reduced gradient, or the check all-gathers the reduce-scattered
parts. Written here, not in `examples/`: a two-layer MLP with its layers in a
list, bf16 parameters and compute, f32 master copies for optax's Adam.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import partir
from benchmarks.hlo_stats import collective_ops
from benchmarks.vs_jit import baseline

MESH = partir.Mesh({"batch": 4, "model": 2})
DATA = partir.BatchParallel("batch")
ADAM = optax.adam(1e-3)


def loss_fn(layers, x, y):
    h = x.astype(jnp.bfloat16)
    for i, layer in enumerate(layers):
        h = h @ layer["kernel"] + layer["bias"]
        if i < len(layers) - 1:
            h = jax.nn.gelu(h)
    return jnp.mean((h.astype(jnp.float32) - y) ** 2)


def make_step(check_first: bool):
    """A loss-scaled step: the gradients are unscaled in f32, checked with
    `isfinite` and applied only if all are finite; the scale doubles or halves.
    `check_first` orders the check before Adam's update (else after)."""

    def all_finite(grads):
        return jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))

    def step(layers, opt_state, scale, x, y):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(p, x, y) * scale)(layers)
        grads = jax.tree.map(lambda g: g.astype(jnp.float32) / scale, grads)
        master = jax.tree.map(lambda w: w.astype(jnp.float32), layers)
        if check_first:
            finite = all_finite(grads)
        updates, new_state = ADAM.update(grads, opt_state, master)
        if not check_first:
            finite = all_finite(grads)
        new_layers = jax.tree.map(
            lambda w, u: jnp.where(finite, (w.astype(jnp.float32) + u).astype(w.dtype), w),
            layers, updates)
        new_state = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_state, opt_state)
        return loss / scale, new_layers, new_state, jnp.where(finite, scale * 2, scale / 2)

    return step


def make_args(width=32, hidden=64, batch=16, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    layers = [
        {"kernel": (jax.random.normal(k[0], (width, hidden)) * 0.1).astype(jnp.bfloat16),
         "bias": jnp.zeros(hidden, jnp.bfloat16)},
        {"kernel": (jax.random.normal(k[1], (hidden, width)) * 0.1).astype(jnp.bfloat16),
         "bias": jnp.zeros(width, jnp.bfloat16)},
    ]
    opt_state = ADAM.init(jax.tree.map(lambda w: w.astype(jnp.float32), layers))
    x = jax.random.normal(k[2], (batch, width))
    y = jax.random.normal(k[3], (batch, width))
    # One step taken: Adam's first update is lr * sign(gradient), which flips
    # with the summation order where a gradient is near zero.
    _, layers, opt_state, scale = jax.jit(make_step(True))(
        layers, opt_state, jnp.float32(2.0**10), x, y)
    return layers, opt_state, scale, x, y


def assert_close_bf16(got, want):
    """jax.jit's numbers to two bf16 ulps (the partial sums are added in
    another order, and bf16 parameters round the difference up)."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        scale = float(np.abs(w).max()) if w.size else 0.0
        np.testing.assert_allclose(g, w, rtol=2**-7, atol=2**-7 * scale)


def lower(step, args, tactics):
    return partir.jit(step, mesh=MESH, tactics=tactics).lower(*args)


def xla_bytes(step, args, lowered) -> int:
    """Per-device bytes XLA's compiled program moves per run."""
    compiled = lowered.compile()
    _, shardings = baseline(step, args, compiled)
    placed = [jax.device_put(a, s)
              for a, s in zip(jax.tree.leaves(args), shardings, strict=True)]
    hlo = compiled.run.lower(*placed).compile().as_text()
    return sum(c.bytes * c.times for c in collective_ops(hlo))


def summing_collectives(lowered) -> list[str]:
    """The SPMD program's all-reduces and reduce-scatters of non-scalars
    (each gradient's sum; the scalar loss's is left out)."""
    return [op.name for op in lowered.module.walk()
            if op.name in ("spmd.all_reduce", "spmd.reduce_scatter")
            and op.operands[0].type.get_shape()]


@pytest.mark.parametrize("check_first", [True, False], ids=["check-first", "update-first"])
def test_zero1_sums_each_loss_scaled_gradient_once(check_first):
    step, args = make_step(check_first), make_args()
    dp_bytes = xla_bytes(step, args, lower(step, args, [DATA]))
    zero = lower(step, args, [DATA, partir.ZeRO("batch", stage=1)])
    zero_bytes = xla_bytes(step, args, zero)
    assert_close_bf16(zero.compile()(*args), jax.jit(step)(*args))
    assert len(summing_collectives(zero)) == len(jax.tree.leaves(args[0]))
    gradient_bytes = sum(4 * w.size for w in jax.tree.leaves(args[0]))  # f32 once
    # ZeRO's own all-gather: stage 1 returns the updated (f32) parameters
    # whole, as they came, gathering each update's shards once.
    returned_whole = gradient_bytes
    if check_first:  # the check's all-reduce, the update's shard taken from it
        assert zero_bytes <= dp_bytes + returned_whole, (zero_bytes, dp_bytes)
    else:  # the update's reduce-scatter, gathered for the check
        assert zero_bytes <= dp_bytes + returned_whole + gradient_bytes, (zero_bytes, dp_bytes)


@pytest.mark.slow
def test_a_loss_scaled_step_of_other_shapes_under_zero1_matches_jax_jit():
    step, args = make_step(True), make_args(width=16, hidden=24, batch=8, seed=1)
    zero = lower(step, args, [DATA, partir.ZeRO("batch", stage=1)])
    assert_close_bf16(zero.compile()(*args), jax.jit(step)(*args))
    assert len(summing_collectives(zero)) == len(jax.tree.leaves(args[0]))
