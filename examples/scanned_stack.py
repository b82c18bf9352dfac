"""Layer stacks written as loops, the way large models are written.

- `program` / `train_step`: N GPT-2 blocks whose parameters are stacked on a
  leading layer dim (`params["blocks"]["attn"]["wq"]` is `[N, C, C]`) and run
  by `lax.scan`, as flax `nn.scan`, MaxText and equinox write them; the
  training step is `value_and_grad` + Adam, as in `examples.stack_train_step`.
- `mlp_program`: a plain `lax.scan` over a stacked residual MLP
  (`layers["w_in"]` is `[N, D, H]`, `layers["w_out"]` is `[N, H, D]`);
  `mlp_train_step` trains it (the pipelined MLP stack of `tests/test_pipeline.py`).
- `fori_program`: a `fori_loop` carrying an activation through one shared
  MLP layer (`layer(layers, 0)`) a fixed number of times.
- `until_program`: a `while_loop` through that layer whose trip count the
  data decides.

Each unrolls to the same numbers as its Python-loop form (the tests check it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from examples import layers
from examples.block_forward import HEADS


def stack(per_layer: list[layers.Params]) -> layers.Params:
    """One pytree whose leaves have a leading layer dim, from per-layer pytrees."""
    return jax.tree.map(lambda *leaves: np.stack(leaves), *per_layer)


def program(params: layers.Params, x):
    def one_block(h, block_params):
        return layers.block(block_params, h, HEADS), None

    h, _ = jax.lax.scan(one_block, x, params["blocks"])
    return layers.layer_norm(params["ln_f"], h)


def loss(params: layers.Params, x, y):
    return layers.mse(program(params, x), y)


def train_step(params: layers.Params, opt_state: layers.Params, x, y):
    return adam_step(loss, params, opt_state, x, y)


def adam_step(loss_fn, params: layers.Params, opt_state: layers.Params, x, y):
    """`value_and_grad` of `loss_fn`, then Adam: one training step."""
    value, grads = jax.value_and_grad(loss_fn)(params, x, y)
    new_params, new_state = layers.adam_update(params, grads, opt_state)
    return value, new_params, new_state


def make_args(
    seed: int = 0,
    layers_: int = 4,
    batch: int = 8,
    seq: int = 8,
    width: int = 32,
    mlp_width: int = 64,
):
    """(params, opt_state, x, y) for `train_step`; `program` takes (params, x)."""
    rng = np.random.default_rng(seed)
    params = {
        "blocks": stack([layers.init_block(rng, width, mlp_width) for _ in range(layers_)]),
        "ln_f": {"scale": 1 + layers.normal(rng, width), "bias": layers.normal(rng, width)},
    }
    x = layers.normal(rng, batch, seq, width, scale=1.0)
    opt_state = layers.adam_state_in_training(params, rng)
    return params, opt_state, x, layers.normal(rng, *x.shape)


def unrolled(params: layers.Params, x):
    """`program` with a Python loop: the reference the loop form must equal."""
    blocks = params["blocks"]
    for i in range(jax.tree.leaves(blocks)[0].shape[0]):
        x = layers.block(jax.tree.map(lambda leaf, i=i: leaf[i], blocks), x, HEADS)
    return layers.layer_norm(params["ln_f"], x)


def unrolled_loss(params: layers.Params, x, y):
    return layers.mse(unrolled(params, x), y)


def unrolled_train_step(params: layers.Params, opt_state: layers.Params, x, y):
    """`train_step` on the Python-loop form."""
    return adam_step(unrolled_loss, params, opt_state, x, y)


# --- smaller loops ---------------------------------------------------------------


def mlp_layer(p: layers.Params, h):
    """One residual MLP layer: `h + tanh(h @ w_in + b_in) @ w_out`."""
    return h + jnp.tanh(h @ p["w_in"] + p["b_in"]) @ p["w_out"]


def mlp_program(blocks: layers.Params, x):
    h, _ = jax.lax.scan(lambda h, p: (mlp_layer(p, h), None), x, blocks)
    return h


def mlp_args(seed: int = 0, layers_: int = 4, batch: int = 16, width: int = 32, hidden: int = 64):
    """(stacked layers, x) for `mlp_program`."""
    rng = np.random.default_rng(seed)
    stacked = {
        "w_in": layers.normal(rng, layers_, width, hidden),
        "b_in": layers.normal(rng, layers_, hidden),
        "w_out": layers.normal(rng, layers_, hidden, width),
    }
    return stacked, layers.normal(rng, batch, width, scale=1.0)


def mlp_loss(params: layers.Params, x, y):
    return layers.mse(mlp_program(params, x), y)


def mlp_train_step(params: layers.Params, opt_state: layers.Params, x, y):
    """`mlp_program`'s training step (`value_and_grad` + Adam): the pipelined MLP stack."""
    return adam_step(mlp_loss, params, opt_state, x, y)


def mlp_train_args(
    seed: int = 0, layers_: int = 8, batch: int = 16, width: int = 32, hidden: int = 64
):
    """(params, opt_state, x, y) for `mlp_train_step`."""
    params, x = mlp_args(seed, layers_, batch, width, hidden)
    rng = np.random.default_rng(seed + 1)
    opt_state = layers.adam_state_in_training(params, rng)
    return params, opt_state, x, layers.normal(rng, *x.shape)


def layer(stacked: layers.Params, i: int) -> layers.Params:
    """Layer `i` of a stack: the shared layer of `fori_program` and `until_program`."""
    return jax.tree.map(lambda leaf: leaf[i], stacked)


def fori_program(p: layers.Params, x, steps: int = 3):
    return jax.lax.fori_loop(0, steps, lambda i, h: mlp_layer(p, h) + 0.1 * i, x)


def until_program(p: layers.Params, x):
    """Apply the layer until the activations' mean magnitude falls below 0.1
    (at most 20 times): the data decides how often."""

    def cond(state):
        i, h = state
        return (i < 20) & (jnp.mean(jnp.abs(h)) > 0.1)

    def body(state):
        i, h = state
        return i + 1, 0.5 * jnp.tanh(mlp_layer(p, h))

    return jax.lax.while_loop(cond, body, (jnp.int32(0), x))
