"""One collective of each kind as a runnable JAX program, to time it.

The calibration (`partir.cost.calibrate`) measures how long each of the
SPMD dialect's collectives takes on the machine; the `lax` call each kind
becomes lives here, beside the emitters (`lowering.jax_collectives`), so no
module outside `lowering/` calls a `jax.lax` collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def probe(kind: str, axis: str, per_device: int) -> Callable[[Any], Callable[[], Any]]:
    """Given a JAX mesh, a run of collective `kind` over `axis` on
    `per_device` float32 elements per device (a multiple of the axis's size)."""

    def build(jax_mesh: Any) -> Callable[[], Any]:
        n = jax_mesh.shape[axis]
        spec = PartitionSpec(tuple(jax_mesh.axis_names))
        x = jax.device_put(
            jnp.ones((jax_mesh.size * per_device,), jnp.float32), NamedSharding(jax_mesh, spec)
        )
        perm = [(i, (i + 1) % n) for i in range(n)]
        bodies: dict[str, Callable[[Any], Any]] = {
            "all_reduce": lambda v: jax.lax.psum(v, axis),
            "all_gather": lambda v: jax.lax.all_gather(v[: per_device // n], axis, tiled=True),
            "reduce_scatter": lambda v: jax.lax.psum_scatter(v, axis, tiled=True),
            "all_to_all": lambda v: jax.lax.all_to_all(v, axis, 0, 0, tiled=True),
            "collective_permute": lambda v: jax.lax.ppermute(v, axis, perm),
        }
        f = jax.jit(jax.shard_map(bodies[kind], mesh=jax_mesh, in_specs=spec, out_specs=spec))
        return lambda: f(x).block_until_ready()

    return build
