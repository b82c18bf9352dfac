"""(c) A GPT-2 style transformer block forward pass.

Pre-layernorm, causal multi-head attention with softmax, a GELU MLP, residuals.
"""

from __future__ import annotations

import numpy as np

from examples import layers

HEADS = 4


def program(params: layers.Params, x):
    return layers.block(params, x, HEADS)


def make_args(seed: int = 0, batch: int = 4, seq: int = 8, width: int = 32, mlp_width: int = 64):
    rng = np.random.default_rng(seed)
    return layers.init_block(rng, width, mlp_width), layers.normal(
        rng, batch, seq, width, scale=1.0
    )
