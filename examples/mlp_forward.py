"""(a) A 2-layer MLP forward pass."""

from __future__ import annotations

import numpy as np

from examples import layers


def program(params: layers.Params, x):
    return layers.mlp(params, x)


def make_args(seed: int = 0, batch: int = 16, d_in: int = 32, hidden: int = 64, d_out: int = 16):
    rng = np.random.default_rng(seed)
    return layers.init_mlp(rng, d_in, hidden, d_out), layers.normal(rng, batch, d_in, scale=1.0)
