"""(f) A stack of N GPT-2 blocks (N up to 24) with a final layernorm."""

from __future__ import annotations

import numpy as np

from examples import layers
from examples.block_forward import HEADS


def program(params: layers.Params, x):
    for block_params in params["blocks"]:
        x = layers.block(block_params, x, HEADS)
    return layers.layer_norm(params["ln_f"], x)


def make_args(
    seed: int = 0,
    layers_: int = 4,
    batch: int = 4,
    seq: int = 8,
    width: int = 32,
    mlp_width: int = 64,
):
    rng = np.random.default_rng(seed)
    params = {
        "blocks": [layers.init_block(rng, width, mlp_width) for _ in range(layers_)],
        "ln_f": {"scale": 1 + layers.normal(rng, width), "bias": layers.normal(rng, width)},
    }
    return params, layers.normal(rng, batch, seq, width, scale=1.0)
