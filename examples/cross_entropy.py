"""(e) A cross-entropy loss over a vocabulary projection, with integer labels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from examples import layers


def program(params: layers.Params, x, labels):
    logits = x @ params["w_out"] + params["b_out"]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[:, None], axis=-1)
    return -jnp.mean(picked)


def make_args(seed: int = 0, batch: int = 16, width: int = 32, vocab: int = 64):
    rng = np.random.default_rng(seed)
    params = {"w_out": layers.normal(rng, width, vocab), "b_out": layers.normal(rng, vocab)}
    labels = rng.integers(0, vocab, size=(batch,), dtype=np.int32)
    return params, layers.normal(rng, batch, width, scale=1.0), labels
