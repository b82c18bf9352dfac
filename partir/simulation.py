"""`partir.simulate`: estimate a strategy on a machine you do not have:
abstract shapes in, an `Estimate` out, nothing allocated on any device
(import, partition, `lower_to_spmd`, then the cost model's `estimate`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from dialects.heap import paused_gc
from lowering.to_spmd import lower_to_spmd
from partir.cost.estimate import Estimate, estimate
from partir.cost.profile import Profile
from partir.importer import import_program
from partir.keys import KeyBoundary
from partir.mesh import Mesh
from partir.partition import partition
from partir.tactics import Tactic, check_tactics


def abstract(args: Sequence[Any]) -> tuple[Any, ...]:
    """`args` as `jax.ShapeDtypeStruct`s (typed keys kept as key types)."""
    def shape_of(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        return jax.ShapeDtypeStruct(np.shape(x), getattr(x, "dtype", None) or np.result_type(x))

    return tuple(jax.tree_util.tree_map(shape_of, tuple(args)))


@paused_gc()  # between the stages too: a collection rescans the whole IR
def simulate(
    fn: Callable[..., Any],
    args: Sequence[Any],
    mesh: Mesh | Mapping[str, int],
    tactics: Sequence[Tactic],
    profile: Profile | str,
) -> Estimate:
    """Partition `fn` at `args` (arrays or `jax.ShapeDtypeStruct`s) over
    `mesh` (any size: no devices are used) with `tactics`, and estimate one
    step on `profile` (a `Profile`, a shipped profile's name or a JSON file)."""
    chosen = profile if isinstance(profile, Profile) else Profile.load(profile)
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(dict(mesh))
    keys = KeyBoundary.of(tuple(args))
    fn, raw = keys.raw_function(fn), keys.raw(tuple(args))
    module = import_program(fn, *abstract(raw), supported_only=True).module
    partition(module, mesh, check_tactics(tactics))
    lower_to_spmd(module)
    return estimate(module, chosen)
