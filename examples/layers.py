"""Model pieces shared by the examples: MLP, GPT-2 block, Adam, initialisers.

Parameter names follow common conventions (`wq`/`wk`/`wv`/`wo` for attention,
`w_in`/`w_out` for the MLP) so name-based tactics can find them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Params = dict[str, Any]


def normal(rng: np.random.Generator, *shape: int, scale: float = 0.2) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(np.float32)


# --- MLP ---------------------------------------------------------------------


def init_mlp(rng: np.random.Generator, d_in: int, hidden: int, d_out: int) -> Params:
    return {
        "w1": normal(rng, d_in, hidden),
        "b1": normal(rng, hidden),
        "w2": normal(rng, hidden, d_out),
        "b2": normal(rng, d_out),
    }


def mlp(params: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def mse(pred: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean((pred - target) ** 2)


# --- GPT-2 block ---------------------------------------------------------------


def init_block(rng: np.random.Generator, width: int, mlp_width: int) -> Params:
    return {
        "ln1": {"scale": 1 + normal(rng, width), "bias": normal(rng, width)},
        "attn": {
            "wq": normal(rng, width, width),
            "bq": normal(rng, width),
            "wk": normal(rng, width, width),
            "bk": normal(rng, width),
            "wv": normal(rng, width, width),
            "bv": normal(rng, width),
            "wo": normal(rng, width, width),
            "bo": normal(rng, width),
        },
        "ln2": {"scale": 1 + normal(rng, width), "bias": normal(rng, width)},
        "mlp": {
            "w_in": normal(rng, width, mlp_width),
            "b_in": normal(rng, mlp_width),
            "w_out": normal(rng, mlp_width, width),
            "b_out": normal(rng, width),
        },
    }


def layer_norm(params: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * params["scale"] + params["bias"]


def causal_attention(params: Params, x: jax.Array, heads: int) -> jax.Array:
    batch, seq, width = x.shape
    head_dim = width // heads

    def split_heads(t: jax.Array) -> jax.Array:  # [B,T,C] -> [B,H,T,D]
        return t.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    q = split_heads(x @ params["wq"] + params["bq"])
    k = split_heads(x @ params["wk"] + params["bk"])
    v = split_heads(x @ params["wv"] + params["bv"])
    # a Python float: JAX keeps it weakly typed, so bf16 activations stay bf16
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / float(np.sqrt(head_dim))
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", weights, v)
    out = out.transpose(0, 2, 1, 3).reshape(batch, seq, width)
    return out @ params["wo"] + params["bo"]


def gelu_mlp(params: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w_in"] + params["b_in"])
    return h @ params["w_out"] + params["b_out"]


def block(params: Params, x: jax.Array, heads: int) -> jax.Array:
    h = x + causal_attention(params["attn"], layer_norm(params["ln1"], x), heads)
    return h + gelu_mlp(params["mlp"], layer_norm(params["ln2"], h))


# --- Adam, written in jax.numpy ------------------------------------------------


def adam_init(params: Params) -> Params:
    zeros = jax.tree.map(np.zeros_like, params)
    return {"m": zeros, "v": jax.tree.map(np.zeros_like, params), "count": np.int32(0)}


def adam_state_in_training(params: Params, rng: np.random.Generator) -> Params:
    """Adam's state some steps into training. From zeros, Adam's first update
    is g/|g|, which turns rounding noise in near-zero gradients into O(lr) jumps."""
    state = adam_init(params)
    state["m"] = jax.tree.map(lambda p: normal(rng, *p.shape, scale=0.01), params)
    state["v"] = jax.tree.map(lambda p: np.abs(normal(rng, *p.shape, scale=0.01)), params)
    state["count"] = np.int32(3)
    return state


def adam_update(
    params: Params,
    grads: Params,
    state: Params,
    lr: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> tuple[Params, Params]:
    count = state["count"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    step = count.astype(jnp.float32)
    m_scale = 1 / (1 - jnp.power(b1, step))
    v_scale = 1 / (1 - jnp.power(b2, step))
    new_params = jax.tree.map(  # the scales in the state's type: bf16 stays bf16
        lambda p, m, v: p - lr * (m * m_scale.astype(m.dtype))
        / (jnp.sqrt(v * v_scale.astype(v.dtype)) + eps),
        params, m, v,
    )
    return new_params, {"m": m, "v": v, "count": count}
