"""Recurrent steps under BatchParallel: the state a loop carries, started from
`jnp.zeros((batch, hidden))`, stays split by examples.

A scanned LSTM reads its previous state twice: in the gates (sliced by the
examples of the step's input) and whole, saved per step for the backward
pass. The carried state has one distribution, so both reads take the split
(`rewrites.control_flow`); before, the saved copy kept the state whole and
every step all-gathered it (24 all-gathers at 12 steps, jax.jit has none).
Tested on a hand-written `lax.scan` cell and on flax's `nn.RNN(LSTMCell)`,
with `jax.grad` taken: no all-gather inside a loop, jax.jit's numbers, and
no more bytes than jax.jit moves (both all-reduce the weight gradients per
step inside the backward loop).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import partir
from benchmarks.hlo_stats import collective_ops
from benchmarks.vs_jit import baseline
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
DATA = [partir.BatchParallel("batch")]


def lstm_cell(p, carry, x_t):
    h, c = carry
    gates = x_t @ p["w_x"] + h @ p["w_h"] + p["bias"]
    i, f, o, u = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def scanned_lstm_step(p, x, y):
    """One SGD step of an LSTM over x's time dim (batch, time, features)."""

    def loss(p):
        zeros = jnp.zeros((x.shape[0], p["w_h"].shape[0]), x.dtype)
        _, hs = jax.lax.scan(lambda carry, x_t: lstm_cell(p, carry, x_t),
                             (zeros, zeros), jnp.swapaxes(x, 0, 1))
        return jnp.mean((hs[-1] @ p["w_out"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(p)
    return value, jax.tree.map(lambda w, g: w - 0.1 * g, p, grads)


def lstm_args(batch=8, steps=12, features=8, hidden=16, outputs=4, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    p = {
        "w_x": jax.random.normal(k[0], (features, 4 * hidden)) * 0.1,
        "w_h": jax.random.normal(k[1], (hidden, 4 * hidden)) * 0.1,
        "bias": jnp.zeros(4 * hidden),
        "w_out": jax.random.normal(k[2], (hidden, outputs)) * 0.1,
    }
    x = jax.random.normal(k[3], (batch, steps, features))
    y = jax.random.normal(k[4], (batch, outputs))
    return p, x, y


def flax_rnn_step():
    """flax linen's `nn.RNN(nn.LSTMCell)` (its carry is `jnp.zeros` of the
    batch), a dense head, one SGD step; (step, args)."""
    import flax.linen as nn

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            hs = nn.RNN(nn.LSTMCell(features=12))(x)
            return nn.Dense(3)(hs[:, -1])

    model = Model()
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 6, 5))
    y = jax.random.normal(jax.random.PRNGKey(2), (16, 3))
    params = model.init(jax.random.PRNGKey(0), x)

    def step(params, x, y):
        def loss(params):
            return jnp.mean((model.apply(params, x) - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)

    return step, (params, x, y)


def gathers_in_loops(lowered) -> list[str]:
    """The SPMD program's all-gathers inside a `stablehlo.while`."""
    return [
        inner.name
        for loop in lowered.module.walk()
        if loop.name == "stablehlo.while"
        for inner in loop.walk()
        if inner.name == "spmd.all_gather"
    ]


def xla_collectives(step, compiled, args) -> tuple[list, list]:
    """The collectives XLA's compiled programs run per step: partir's, and
    jax.jit's with partir's input and output shardings."""
    reference, shardings = baseline(step, args, compiled)
    placed = [jax.device_put(a, s) for a, s in zip(jax.tree.leaves(args), shardings, strict=True)]
    return tuple(  # type: ignore[return-value]
        collective_ops(run.lower(*placed).compile().as_text())
        for run in (compiled.run, reference)
    )


def check_no_gathered_state(step, args):
    partitioned = partir.jit(step, mesh=MESH, tactics=DATA)
    assert_leaves_close(partitioned(*args), jax.jit(step)(*args), what="LSTM step")
    lowered = partitioned.lower(*args)
    assert gathers_in_loops(lowered) == []
    ours, theirs = xla_collectives(step, lowered.compile(), args)
    assert not [c for c in ours if c.kind == "all-gather"]
    assert sum(c.bytes * c.times for c in ours) <= sum(c.bytes * c.times for c in theirs)


def test_a_scanned_lstm_keeps_its_zeros_started_state_split():
    check_no_gathered_state(scanned_lstm_step, lstm_args())


@pytest.mark.slow
def test_an_lstm_of_other_shapes_and_names_keeps_its_state_split():
    check_no_gathered_state(scanned_lstm_step, lstm_args(batch=12, steps=5, hidden=8, seed=3))


def test_flax_rnn_lstm_keeps_its_state_split():
    step, args = flax_rnn_step()
    check_no_gathered_state(step, args)
