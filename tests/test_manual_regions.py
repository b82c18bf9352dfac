"""A nested `jax.shard_map` (a manual region, `sdy.manual_computation`) is
kept per device as written, with its own collectives; partir partitions the
program around it.

On the 4x2 CPU mesh: a hand-written kernel (a local matmul, then
`jax.lax.psum` over "model") between work partir partitions under
BatchParallel; the numbers are jax.jit's, `check=True` runs every stage
through it (the reference interpreter simulates the region's devices), and
what partir cannot keep is refused by name.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import partir
from dialects.context import make_context
from dialects.parser import PartirParser
from dialects.sdy import ManualComputationOp
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
AUTO = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)
RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def row_parallel_matmul(x, w):
    """Each device: its rows and columns of `x` times its rows of `w`, summed over "model"."""
    return jax.lax.psum(x @ w, "model")


def step(x, w):
    h = jnp.tanh(x)
    y = jax.shard_map(
        row_parallel_matmul, mesh=AUTO,
        in_specs=(P("batch", "model"), P("model", None)), out_specs=P("batch", None),
    )(h, w)
    return jnp.sum(y * 2.0, axis=1)


def batch_parallel(fn, **kwargs):
    return partir.jit(
        fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs=["x"])], **kwargs
    )


def test_a_shard_map_kernel_inside_partitions_with_jax_jits_numbers():
    x, w = rand(16, 8), rand(8, 4)
    assert_leaves_close(batch_parallel(step)(x, w), jax.jit(step)(x, w))


def test_check_runs_every_stage_through_the_region():
    x, w = rand(16, 8), rand(8, 4)
    assert_leaves_close(batch_parallel(step, check=True)(x, w), jax.jit(step)(x, w))


def test_the_regions_psum_is_kept_as_written():
    lowered = batch_parallel(step).lower(rand(16, 8), rand(8, 4))
    assert "lax.psum(" in lowered.source
    reduced = [c for c in lowered.report().collectives if c.kind == "all_reduce"]
    assert [c.axes for c in reduced] == [("model",)]
