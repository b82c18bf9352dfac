"""A ResNet-style CNN's training step, in plain JAX: convolutions, batch norm,
max and average pooling, residual blocks, SGD with momentum.

NHWC images. A stem (3x3 conv, batch norm, relu, 2x2 max pooling), residual
blocks of two 3x3 convs, a downsampling block (a strided conv, its shortcut
an average pool and a 1x1 conv), global average pooling and a dense head,
trained on softmax cross-entropy. Batch norm normalises by the batch's own
statistics, so under data parallelism they are sums over every device's
images. The parameters are a nested dict whose convolution kernels are all
named `kernel` (HWIO), a list of blocks under `layers`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Params = dict

NHWC = ("NHWC", "HWIO", "NHWC")


def conv(p: Params, x: jax.Array, stride: int = 1) -> jax.Array:
    return lax.conv_general_dilated(
        x, p["kernel"], (stride, stride), "SAME", dimension_numbers=NHWC
    )


def batch_norm(p: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """By the batch's statistics, per channel."""
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
    return (x - mean) * lax.rsqrt(var + eps) * p["scale"] + p["offset"]


def conv_norm(p: Params, x: jax.Array, stride: int = 1) -> jax.Array:
    return batch_norm(p["norm"], conv(p, x, stride))


def max_pool(x: jax.Array) -> jax.Array:
    """2x2, stride 2 (its gradient is a select_and_scatter)."""
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def average_pool(x: jax.Array) -> jax.Array:
    """2x2, stride 2."""
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4


def forward(params: Params, images: jax.Array) -> jax.Array:
    h = max_pool(jax.nn.relu(conv_norm(params["stem"], images)))
    for block in params["layers"]:
        r = jax.nn.relu(conv_norm(block["conv1"], h))
        h = jax.nn.relu(h + conv_norm(block["conv2"], r))
    down = params["down"]
    r = jax.nn.relu(conv_norm(down["conv1"], h, stride=2))
    r = conv_norm(down["conv2"], r)
    h = jax.nn.relu(r + conv_norm(down["shortcut"], average_pool(h)))
    pooled = jnp.mean(h, axis=(1, 2))
    return pooled @ params["head"]["w"] + params["head"]["b"]


def loss(params: Params, images: jax.Array, labels: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(forward(params, images))
    return -jnp.mean(jnp.sum(labels * log_probs, axis=-1))


def program(params: Params, momentum: Params, images, labels, lr: float = 0.05):
    value, grads = jax.value_and_grad(loss)(params, images, labels)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - lr * m, params, momentum)
    return value, params, momentum


def _conv_init(rng: np.random.Generator, size: int, c_in: int, c_out: int) -> Params:
    scale = (2.0 / (size * size * c_in)) ** 0.5
    return {
        "kernel": (rng.standard_normal((size, size, c_in, c_out)) * scale).astype(np.float32),
        "norm": {
            "scale": (1 + 0.1 * rng.standard_normal(c_out)).astype(np.float32),
            "offset": (0.1 * rng.standard_normal(c_out)).astype(np.float32),
        },
    }


def make_args(
    seed: int = 0,
    batch: int = 16,
    size: int = 16,
    channels: int = 8,
    blocks: int = 2,
    classes: int = 10,
):
    rng = np.random.default_rng(seed)
    wide = 2 * channels
    params = {
        "stem": _conv_init(rng, 3, 3, channels),
        "layers": [
            {"conv1": _conv_init(rng, 3, channels, channels),
             "conv2": _conv_init(rng, 3, channels, channels)}
            for _ in range(blocks)
        ],
        "down": {
            "conv1": _conv_init(rng, 3, channels, wide),
            "conv2": _conv_init(rng, 3, wide, wide),
            "shortcut": _conv_init(rng, 1, channels, wide),
        },
        "head": {
            "w": (rng.standard_normal((wide, classes)) * wide**-0.5).astype(np.float32),
            "b": np.zeros(classes, np.float32),
        },
    }
    momentum = jax.tree.map(lambda p: (0.01 * rng.standard_normal(p.shape)).astype(p.dtype), params)
    images = rng.standard_normal((batch, size, size, 3)).astype(np.float32)
    labels = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, batch)]
    return params, momentum, images, labels
