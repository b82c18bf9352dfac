"""(d) The transformer block's training step, with an Adam update in jax.numpy."""

from __future__ import annotations

import jax
import numpy as np

from examples import layers
from examples.block_forward import HEADS


def loss(params: layers.Params, x, y):
    return layers.mse(layers.block(params, x, HEADS), y)


def program(params: layers.Params, opt_state: layers.Params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    new_params, new_state = layers.adam_update(params, grads, opt_state)
    return value, new_params, new_state


def make_args(seed: int = 0, batch: int = 4, seq: int = 8, width: int = 32, mlp_width: int = 64):
    rng = np.random.default_rng(seed)
    params = layers.init_block(rng, width, mlp_width)
    opt_state = layers.adam_init(params)
    # A state a few steps in, so the update does not start from zeros.
    opt_state["m"] = jax.tree.map(lambda p: layers.normal(rng, *p.shape, scale=0.01), params)
    opt_state["v"] = jax.tree.map(
        lambda p: np.abs(layers.normal(rng, *p.shape, scale=0.01)), params
    )
    opt_state["count"] = np.int32(3)
    x = layers.normal(rng, batch, seq, width, scale=1.0)
    return params, opt_state, x, layers.normal(rng, batch, seq, width)
