"""The layer loops of a training step, found on the IR
(`partir.pipeline.layer_loops`, `dialects.counted_loops`): on stacks written
five ways, the stacked arguments are the ones the jaxpr-level structure
(`partir.pipeline.structure`) finds by tracing the step at a stage's
layers; the loops read in the SPMD form as in the import; a step without a
layer loop, or with two stacks, gets a `PipelineError`.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from dialects.counted_loops import counted_loop, trip_count
from examples import scanned_stack
from partir.pipeline.layer_loops import PipelineError, find_layer_loops
from partir.pipeline.structure import find_structure
from tests import client_models


def _scanned_mlp() -> tuple[Any, tuple[Any, ...]]:
    return scanned_stack.mlp_train_step, scanned_stack.mlp_train_args(layers_=4, batch=8)


def _scanned_transformer() -> tuple[Any, tuple[Any, ...]]:
    return scanned_stack.train_step, scanned_stack.make_args(layers_=4, batch=8)


def _client(build: str, library: str) -> Any:
    def make() -> tuple[Any, tuple[Any, ...]]:
        pytest.importorskip(library)
        pytest.importorskip("optax")
        client = getattr(client_models, build)()
        return client.step, client.make_args()

    return make


STACKS = {
    "lax.scan MLP + Adam": _scanned_mlp,
    "lax.scan transformer + Adam": _scanned_transformer,
    "flax nn.scan + optax": _client("flax_scanned_stack", "flax"),
    "haiku layer_stack + optax": _client("haiku_layer_stack", "haiku"),
    "equinox lax.scan + optax": _client("equinox_scanned_stack", "equinox"),
}


@pytest.mark.parametrize("name", list(STACKS))
def test_stacked_arguments_are_the_traced_structure_s(name: str) -> None:
    step, args = STACKS[name]()
    loops = find_layer_loops(partir.import_jax(step, *args))
    traced = find_structure(
        step, args, stages=2, microbatches=2, data_parts=1, stacked=None, axis="stage"
    )
    assert loops.layers == traced.layers
    assert loops.backward is not None and loops.backward.trips == loops.layers
    assert set(loops.stacked_arguments) == set(traced.stacked)
    assert set(loops.stacked_results) == set(traced.stacked_results)
    leaves = jax.tree.leaves(args)
    assert all(np.shape(leaves[i])[0] == loops.layers for i in loops.stacked_arguments)


def _sgd_step(p: dict[str, Any], x: Any, y: Any) -> Any:
    def loss(p: dict[str, Any]) -> Any:
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x @ p["in"], p["layers"])
        return jnp.mean((h - y) ** 2)

    value, grads = jax.value_and_grad(loss)(p)
    return value, jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)


def _sgd_args(layers: int = 6) -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    p = {
        "in": rng.normal(size=(3, 5)).astype(np.float32),
        "layers": rng.normal(size=(layers, 5, 5)).astype(np.float32),
    }
    return p, rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 5)).astype(np.float32)


def test_loops_read_alike_in_the_import_and_the_spmd_form() -> None:
    """The counter, the rows each loop reads and writes and their direction,
    and the stacked leaves, in both forms; the cost model's trip count is the loop's."""
    args = _sgd_args()
    imported = find_layer_loops(partir.import_jax(_sgd_step, *args))
    lowered = partir.jit(
        _sgd_step, mesh=partir.Mesh({"batch": 2}), tactics=[partir.BatchParallel("batch")]
    ).lower(*args)
    spmd = find_layer_loops(lowered.module)
    for a, b in ((imported.forward, spmd.forward), (imported.backward, spmd.backward)):
        assert b is not None and a is not None
        assert (a.counter, a.start, a.trips, a.reads, a.writes, a.reverse) == (
            b.counter, b.start, b.trips, b.reads, b.writes, b.reverse,
        )
        assert trip_count(b.op) == 6
    assert imported.forward.reverse is False and imported.backward.reverse is True
    assert imported.stacked_arguments == spmd.stacked_arguments == (1,)
    assert imported.stacked_results == spmd.stacked_results == (2,)


def test_a_fori_loop_is_counted_but_reads_no_rows() -> None:
    def f(x: Any) -> Any:
        return jax.lax.fori_loop(2, 7, lambda i, h: h * 2.0 + i, x)

    module = partir.import_jax(f, np.ones(3, np.float32))
    (loop,) = [c for op in module.walk() if (c := counted_loop(op)) is not None]
    assert (loop.trips, loop.reads, loop.writes, loop.reverse) == (5, (), (), None)
    with pytest.raises(PipelineError, match="no loop over stacked layers"):
        find_layer_loops(module)


def test_two_stacks_are_refused_naming_both_loops() -> None:
    def two(p: dict[str, Any], x: Any) -> Any:
        def loss(p: dict[str, Any]) -> Any:
            layer = lambda h, w: (jnp.tanh(h @ w), None)  # noqa: E731
            h, _ = jax.lax.scan(layer, x, p["encoder"])
            h, _ = jax.lax.scan(layer, h, p["decoder"])
            return jnp.sum(h)

        return jax.grad(loss)(p)

    p = {"encoder": np.ones((2, 3, 3), np.float32), "decoder": np.ones((4, 3, 3), np.float32)}
    with pytest.raises(PipelineError, match="2 forward and 2 backward loops"):
        find_layer_loops(partir.import_jax(two, p, np.ones((2, 3), np.float32)))
