"""(b) The MLP's training step: `jax.value_and_grad` of an MSE loss, then SGD."""

from __future__ import annotations

import jax
import numpy as np

from examples import layers

LEARNING_RATE = 0.1


def loss(params: layers.Params, x, y):
    return layers.mse(layers.mlp(params, x), y)


def program(params: layers.Params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    new_params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return value, new_params


def make_args(seed: int = 0, batch: int = 16, d_in: int = 32, hidden: int = 64, d_out: int = 16):
    rng = np.random.default_rng(seed)
    params = layers.init_mlp(rng, d_in, hidden, d_out)
    return params, layers.normal(rng, batch, d_in, scale=1.0), layers.normal(rng, batch, d_out)
