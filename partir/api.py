"""`partir.jit`: partition a JAX function over a mesh and run it there.

    mesh = partir.Mesh({"batch": 4, "model": 2})   # or a jax.sharding.Mesh

    @partir.jit(mesh=mesh, tactics=[partir.BatchParallel("batch"), partir.Megatron("model")])
    def train_step(params, opt_state, x, y): ...

Calling `train_step` imports the function as StableHLO, applies the tactics
(each followed by propagation), lowers to SPMD, emits a `jax.shard_map`
program and compiles it; the result is cached per pytree structure, shapes and
dtypes of the arguments. `train_step.lower(*args)` stops before running and
exposes every stage.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np

from dialects.errors import PartirTypeError
from dialects.heap import paused_gc
from partir.devices import devices_for
from partir.importer import check_arguments
from partir.keys import KeyBoundary
from partir.lowered import Compiled, Lowered, lower
from partir.mesh import Mesh
from partir.tactics import Tactic, check_tactics
from partir.validation import CheckedCall

__all__ = ["Compiled", "Lowered", "PartitionedFunction", "devices_for", "jit", "lower"]


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    leaves, tree = jax.tree_util.tree_flatten(args)

    def dtype(x: Any) -> Any:
        return x.dtype if hasattr(x, "dtype") else np.result_type(x)

    return (
        tree,
        tuple(
            (
                np.shape(x),
                str(jax.dtypes.canonicalize_dtype(dtype(x))),
                isinstance(x, int | float | complex | bool),
            )
            for x in leaves
        ),
    )


class PartitionedFunction:
    """What `partir.jit` returns: call it like the function, or `.lower` it."""

    def __init__(
        self,
        fn: Callable[..., Any],
        mesh: Mesh | jax.sharding.Mesh,
        tactics: Sequence[Tactic],
        check: bool = False,
    ):
        self.fn = fn
        self.check = check
        self._checked: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.jax_mesh = mesh if isinstance(mesh, jax.sharding.Mesh) else None
        self.mesh = Mesh(mesh) if not isinstance(mesh, Mesh) else mesh
        self.tactics = check_tactics(tactics)
        self._compiled: dict[tuple[Any, ...], Any] = {}
        # what `.lower` made and no call has compiled yet: the call reuses it
        self._lowered: dict[tuple[Any, ...], Lowered] = {}
        functools.update_wrapper(self, fn)

    def _positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Keyword arguments bound to their positions, as the signature says
        (the program's arguments are named by parameter, so names survive)."""
        if not kwargs:
            return args
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        if bound.kwargs:
            raise PartirTypeError(
                f"partir.jit: {', '.join(bound.kwargs)} can only be passed by keyword; "
                "partir needs every argument to have a position: make the parameter "
                "positional (drop the `*`), or fix it with functools.partial"
            )
        return tuple(bound.args)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """A `Lowered`. A later call at the same shapes runs it rather than
        partitioning again."""
        args = self._positional(args, kwargs)
        lowered = lower(self.fn, args, self.mesh, self.tactics, jax_mesh=self.jax_mesh)
        key = _signature(KeyBoundary.of(args).raw(args))
        if key not in self._compiled:
            self._lowered[key] = lowered
        return lowered

    def _lowered_for(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Lowered:
        """The lowering `.lower` made at these shapes (taken: the call
        compiles it once), or a new one."""
        lowered = self._lowered.pop(key, None)
        if lowered is None:
            lowered = self.lower(*args)
            self._lowered.pop(key, None)
        return lowered

    def _compile(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Compiled:
        """The program compiled at these shapes. Its `Lowered` is not kept
        (unless `check` runs its stages), nor held past this call."""
        lowered = self._lowered_for(key, args)
        compiled = self._compiled[key] = lowered.compile()
        if self.check:
            # checked on the keys' data, as the stages hold them
            on_data = replace(compiled, keys=KeyBoundary())
            function = lowered.keys.raw_function(self.fn)
            self._checked[key] = CheckedCall(function, lowered, on_data)
        return compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self._positional(args, kwargs)
        raw = KeyBoundary.of(args).raw(args)
        check_arguments(self.fn, raw)
        key = _signature(raw)
        compiled = self._compiled.get(key)
        if compiled is None:
            # the stages (xDSL modules, cycles) go before the first run traces
            # the program and XLA compiles it (85 MiB at 96 layers), in one
            # collection: with the collector resuming as `lower` returns, its
            # first collection scanned every object the stages made, and this
            # one scanned them again
            with paused_gc():
                compiled = self._compile(key, args)
                gc.collect(1)
        if self.check:
            return compiled.keys.typed(self._checked[key](*raw))
        return compiled(*args)


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    mesh: Mesh | jax.sharding.Mesh,
    tactics: Sequence[Tactic] = (),
    check: bool = False,
) -> Any:
    """Partition `fn` over `mesh` with `tactics`; usable as `@partir.jit(...)`.

    With `check=True` every call also runs each stage on its arguments and
    raises `partir.ValidationError` at the first whose numbers differ from
    `jax.jit(fn)` (slow: for finding a partitioning bug, see `partir.validation`)."""
    if fn is None:
        return lambda f: PartitionedFunction(f, mesh, tactics, check)
    return PartitionedFunction(fn, mesh, tactics, check)
