"""Collectives in an emitted program, read from its jaxpr (an independent count)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import jax

from lowering.to_jax import REDUCE_SCATTER_SCOPE

COLLECTIVE_PRIMITIVES = {
    "psum": "all_reduce",
    "psum_invariant": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_invariant": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "all_to_all": "all_to_all",
}


def axes_of(params: dict) -> tuple[str, ...]:
    axes = params.get("axes", params.get("axis_name"))
    return tuple(axes) if isinstance(axes, tuple | list) else (axes,)


def collective_eqns(compiled: Any, args: Any) -> Iterator[tuple[str, Any]]:
    """(kind, equation) for every collective, nested jaxprs included."""
    jaxpr = jax.make_jaxpr(compiled.run)(*jax.tree_util.tree_leaves(args))

    def walk(jp: Any) -> Iterator[tuple[str, Any]]:
        for eqn in jp.eqns:
            kind = COLLECTIVE_PRIMITIVES.get(eqn.primitive.name)
            if kind == "all_reduce" and REDUCE_SCATTER_SCOPE in str(eqn.source_info.name_stack):
                kind = "reduce_scatter"  # the sum of a scatter written as sum + slice (CPU)
            if kind is not None:
                yield kind, eqn
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple | list) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        yield from walk(inner)

    yield from walk(jaxpr.jaxpr)


def emitted_collectives(compiled: Any, args: Any) -> collections.Counter:
    """(kind, axes) of every collective in the emitted program's jaxpr."""
    return collections.Counter(
        (kind, axes_of(eqn.params)) for kind, eqn in collective_eqns(compiled, args)
    )
