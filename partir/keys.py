"""Typed PRNG keys cross partir's boundary as their raw data.

`jax.random.key(0)` is an array of an extended dtype (`key<fry>`) that no
device buffer holds as such; its data is a `uint32[..., 2]` array
(`jax.random.key_data`). partir imports, partitions and runs that data:
each key argument is unwrapped on the way in and rewrapped (with its own
implementation) inside the traced function, and each key result the other
way round, so a `partir.jit` function takes and returns keys as `jax.jit`'s
does, with the same bits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax


def is_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _impls(leaves: list[Any]) -> tuple[Any, ...]:
    return tuple(jax.random.key_impl(leaf) if is_key(leaf) else None for leaf in leaves)


def _unwrapped(leaves: list[Any]) -> list[Any]:
    return [jax.random.key_data(leaf) if is_key(leaf) else leaf for leaf in leaves]


def _wrapped(leaves: list[Any], impls: tuple[Any, ...]) -> list[Any]:
    return [
        leaf if impl is None else jax.random.wrap_key_data(leaf, impl=impl)
        for leaf, impl in zip(leaves, impls, strict=True)
    ]


@dataclass
class KeyBoundary:
    """Which argument and result leaves are typed keys, and their
    implementations (the results' are known once the function is traced)."""

    args: tuple[Any, ...] = ()
    results: tuple[Any, ...] = ()

    @staticmethod
    def of(args: tuple[Any, ...]) -> KeyBoundary:
        return KeyBoundary(_impls(jax.tree_util.tree_leaves(args)))

    @property
    def takes_keys(self) -> bool:
        return any(i is not None for i in self.args)

    def raw(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """`args` with each key replaced by its data."""
        if not self.takes_keys:
            return args
        leaves, tree = jax.tree_util.tree_flatten(args)
        return jax.tree_util.tree_unflatten(tree, _unwrapped(leaves))

    def raw_function(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` on raw key data: rewraps the keys it is given, unwraps the keys
        it returns (recording which results they are). A function given no
        key is left as it is (its source locations name the user's code)."""
        if not self.takes_keys:
            return fn

        @functools.wraps(fn)
        def on_data(*args: Any) -> Any:
            leaves, tree = jax.tree_util.tree_flatten(args)
            outs = fn(*jax.tree_util.tree_unflatten(tree, _wrapped(leaves, self.args)))
            out_leaves, out_tree = jax.tree_util.tree_flatten(outs)
            self.results = _impls(out_leaves)
            return jax.tree_util.tree_unflatten(out_tree, _unwrapped(out_leaves))

        return on_data

    def typed(self, outs: Any) -> Any:
        """`outs` with each key result rewrapped."""
        if not any(i is not None for i in self.results):
            return outs
        leaves, tree = jax.tree_util.tree_flatten(outs)
        return jax.tree_util.tree_unflatten(tree, _wrapped(leaves, self.results))
