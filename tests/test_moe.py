"""A mixture-of-experts layer with top-2 routing (`lax.top_k`), trained.

The experts' weights are stacked on a leading expert dim; tokens are split
over "batch", and with expert parallelism the experts over "model". The
router's `top_k` runs on each device's tokens (a loop per result:
`tests/test_multi_result.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})


def moe(params, x):
    """Top-2 routed experts, with dense dispatch (as small MoE layers write it)."""
    logits = x @ params["router"]  # [tokens, experts]
    gates, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), 2)
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    weight = jnp.sum(jax.nn.one_hot(experts, logits.shape[-1]) * gates[..., None], axis=1)
    h = jax.nn.gelu(jnp.einsum("td,edh->teh", x, params["w_in"]))
    y = jnp.einsum("teh,ehd->ted", h, params["w_out"])
    return jnp.einsum("te,ted->td", weight, y)


def step(params, x, y):
    return jax.value_and_grad(lambda p: jnp.mean((moe(p, x) - y) ** 2))(params)


def make_args(experts=4, width=16, hidden=32, tokens=32):
    rng = np.random.default_rng(0)
    params = {
        "router": rng.standard_normal((width, experts)).astype(np.float32),
        "w_in": (rng.standard_normal((experts, width, hidden)) * 0.2).astype(np.float32),
        "w_out": (rng.standard_normal((experts, hidden, width)) * 0.2).astype(np.float32),
    }
    x = rng.standard_normal((tokens, width)).astype(np.float32)
    return params, x, rng.standard_normal((tokens, width)).astype(np.float32)


EXPERT_PARALLEL = partir.ManualPartition({"params/w_in": {0: "model"}, "params/w_out": {0: "model"}})


@pytest.mark.parametrize("tactics", [
    [partir.BatchParallel("batch")],
    [partir.BatchParallel("batch"), EXPERT_PARALLEL],
], ids=["dp", "dp+experts"])
def test_a_top2_moe_training_step_matches_jax_jit(tactics):
    args = make_args()
    compiled = partir.jit(step, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(*args), jax.jit(step)(*args), what="MoE step")
    lowered = compiled.lower(*args)
    assert lowered.conflicts == []
    kinds = {(c.kind, c.axes) for c in lowered.collectives}
    assert ("all_gather", ("model",)) not in kinds  # experts stay split where they are used
