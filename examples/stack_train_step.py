"""An N-layer transformer stack's training step (`value_and_grad` + Adam).

Used by the propagation and lowering benchmarks; `make_args(layers_=N)`.
"""

from __future__ import annotations

import jax
import numpy as np

from examples import layers, transformer_stack


def loss(params: layers.Params, x, y):
    return layers.mse(transformer_stack.program(params, x), y)


def program(params: layers.Params, opt_state: layers.Params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    new_params, new_state = layers.adam_update(params, grads, opt_state)
    return value, new_params, new_state


def make_args(
    seed: int = 0,
    layers_: int = 2,
    batch: int = 8,
    seq: int = 8,
    width: int = 32,
    mlp_width: int = 64,
):
    params, x = transformer_stack.make_args(seed, layers_, batch, seq, width, mlp_width)
    rng = np.random.default_rng(seed + 1)
    opt_state = layers.adam_state_in_training(params, rng)
    return params, opt_state, x, layers.normal(rng, *x.shape)
