"""The layer loops of a training step, found on the IR
(`partir.pipeline.layer_loops`, `dialects.counted_loops`): on stacks written
five ways, the stacked arguments are the state's leaves that lead with the
layer count, and the stacked results their updates; the loops read in the
SPMD form as in the import; a step without a layer loop, or with two
stacks, gets a `PipelineError`.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, TensorType, i64
from xdsl.ir import Operation
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl_jax.dialects import stablehlo as shlo

import partir
from dialects.counted_loops import CountedLoop, counted_loop, trip_count
from dialects.functions import entry_function
from dialects.interpreter import run_function
from dialects.stablehlo_ext import SliceOp
from examples import scanned_stack
from partir.pipeline.layer_loops import LayerLoops, PipelineError, find_layer_loops
from partir.pipeline.stage_loops import split_rows
from tests import client_models


def stacked(module: Any, loops: LayerLoops) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The entry arguments and results whose dim 0 is the layers."""
    entry = entry_function(module)
    returned = entry.body.block.last_op
    assert returned is not None
    args, results = (
        tuple(i for i, v in enumerate(values) if loops.layer_dim.get(v) == 0)
        for values in (entry.body.block.args, returned.operands)
    )
    return args, results


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
IN_CI = ("lax.scan MLP + Adam",)


@pytest.mark.parametrize(
    "name", [n if n in IN_CI else pytest.param(n, marks=pytest.mark.slow) for n in STACKS]
)
def test_stacked_arguments_are_the_state_s_layers(name: str) -> None:
    step, args = STACKS[name]()
    module = partir.import_jax(step, *args)
    loops = find_layer_loops(module)
    stacked_arguments, stacked_results = stacked(module, loops)
    assert loops.backward is not None and loops.backward.trips == loops.layers
    leaves = jax.tree.leaves(args)
    state = len(jax.tree.leaves(args[:2]))  # (params, opt_state, data...)
    layered = {
        i for i, x in enumerate(leaves[:state]) if np.ndim(x) and np.shape(x)[0] == loops.layers
    }
    assert set(stacked_arguments) == layered
    results = jax.eval_shape(step, *args)
    returned = jax.tree.leaves(results[1:3])  # the updated params and state, after the loss
    updated = {1 + i for i, x in enumerate(returned) if x.ndim and x.shape[0] == loops.layers}
    assert set(stacked_results) == updated


def sgd_step(p: dict[str, Any], x: Any, y: Any) -> Any:
    def loss(p: dict[str, Any]) -> Any:
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x @ p["in"], p["layers"])
        return jnp.mean((h - y) ** 2)

    value, grads = jax.value_and_grad(loss)(p)
    return value, jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)


def _fori_step(p: dict[str, Any], x: Any, y: Any) -> Any:
    """The layers indexed by a `fori_loop`'s own counter (`p["layers"][i]`)."""

    def loss(p: dict[str, Any]) -> Any:
        layer = lambda i, h: jnp.tanh(h @ p["layers"][i])  # noqa: E731
        h = jax.lax.fori_loop(0, p["layers"].shape[0], layer, x @ p["in"])
        return jnp.mean((h - y) ** 2)

    value, grads = jax.value_and_grad(loss)(p)
    return value, jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)


def sgd_args(layers: int = 6, batch: int = 4) -> tuple[Any, ...]:
    """(params, x, y) for `sgd_step`: `layers` stacked 5x5 layers, `batch` rows."""
    rng = np.random.default_rng(0)
    p = {
        "in": rng.normal(size=(3, 5)).astype(np.float32),
        "layers": rng.normal(size=(layers, 5, 5)).astype(np.float32) / 2,
    }
    return (
        p,
        rng.normal(size=(batch, 3)).astype(np.float32),
        rng.normal(size=(batch, 5)).astype(np.float32),
    )


def test_loops_read_alike_in_the_import_and_the_spmd_form() -> None:
    """The counter, the rows each loop reads and writes and their direction,
    and the stacked leaves, in both forms; the cost model's trip count is the loop's."""
    args = sgd_args()
    module = partir.import_jax(sgd_step, *args)
    imported = find_layer_loops(module)
    lowered = partir.jit(
        sgd_step, mesh=partir.Mesh({"batch": 2}), tactics=[partir.BatchParallel("batch")]
    ).lower(*args)
    spmd = find_layer_loops(lowered.module)
    for a, b in ((imported.forward, spmd.forward), (imported.backward, spmd.backward)):
        assert b is not None and a is not None
        assert (a.counter, a.start, a.trips, a.reads, a.writes, a.reverse) == (
            b.counter,
            b.start,
            b.trips,
            b.reads,
            b.writes,
            b.reverse,
        )
        assert trip_count(b.op) == 6
    assert imported.forward.reverse is False and imported.backward.reverse is True
    assert stacked(module, imported) == stacked(lowered.module, spmd) == ((1,), (2,))


def test_the_gradient_of_a_fori_loop_over_layers_is_refused() -> None:
    """`fori_loop`'s body reading `p["layers"][i]` is a forward layer loop, but
    the backward loop JAX makes of it indexes the layers by the indices the
    forward saved: a stage could not tell its own, so the step is refused."""
    module = partir.import_jax(_fori_step, *sgd_args(layers=6))
    (forward, backward) = [c for op in module.walk() if (c := counted_loop(op)) is not None]
    assert forward.reads == (0,) and forward.reverse is False
    assert backward.writes == ()
    with pytest.raises(PipelineError, match="other than one layer per step"):
        find_layer_loops(module)


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


def _rows_of(value: Any, start: int, stop: int) -> Operation:
    ty = value.type
    shape = list(ty.get_shape())
    return SliceOp.create(
        operands=[value],
        result_types=[TensorType(ty.get_element_type(), [stop - start, *shape[1:]])],
        properties={
            "start_indices": DenseArrayBase.from_list(i64, [start] + [0] * (len(shape) - 1)),
            "limit_indices": DenseArrayBase.from_list(i64, [stop, *shape[1:]]),
            "strides": DenseArrayBase.from_list(i64, [1] * len(shape)),
        },
    )


def _chain_stages(loop: CountedLoop, parts: int) -> None:
    """Replace `loop` by `parts` copies of it, each split to one stage's rows
    (`split_rows`) and run on them, one after another (the last rows first
    for a reversed loop), the carried values flowing from each to the next:
    the pipeline's reading of the loop, as a program the interpreter runs."""
    op, rows = loop.op, loop.trips // parts
    stacked = {*loop.reads, *loop.writes}
    carry = list(op.operands)
    written: dict[int, dict[int, Any]] = {k: {} for k in loop.writes}
    for s in range(parts)[::-1] if loop.reverse else range(parts):
        operands = []
        for k, value in enumerate(op.operands):
            if k in stacked:
                part = _rows_of(value, s * rows, (s + 1) * rows)
                Rewriter.insert_op(part, InsertPoint.before(op))
                operands.append(part.results[0])
            else:
                operands.append(value if k == loop.counter else carry[k])
        stage = op.clone()
        stage.operands = operands
        Rewriter.insert_op(stage, InsertPoint.before(op))
        split = counted_loop(stage)
        assert split is not None
        split_rows(split, parts)
        carry = list(stage.results)
        for k in loop.writes:
            written[k][s] = stage.results[k]
    for k, result in enumerate(op.results):
        if k in loop.writes:
            whole = shlo.ConcatenateOp.create(
                operands=[written[k][s] for s in range(parts)],
                result_types=[result.type],
                properties={"dimension": IntegerAttr(0, i64)},
            )
            Rewriter.insert_op(whole, InsertPoint.before(op))
            result.replace_all_uses_with(whole.results[0])
        elif k in stacked:
            result.replace_all_uses_with(op.operands[k])
        elif k != loop.counter:
            result.replace_all_uses_with(carry[k])
    assert not op.results[loop.counter].uses
    op.detach()
    op.erase()


@pytest.mark.parametrize("stages", [2, 3, 6])
@pytest.mark.parametrize(
    "name", ["sgd", pytest.param("lax.scan transformer + Adam", marks=pytest.mark.slow)]
)
def test_stages_running_their_rows_in_turn_compute_the_whole_loop(name: str, stages: int) -> None:
    """Both loops of a training step, each replaced by `stages` per-stage loops
    (`split_rows`) run in turn, give the step's numbers (reference interpreter)."""
    if name == "sgd":
        step, args = sgd_step, sgd_args(layers=6)
    else:
        step, args = scanned_stack.train_step, scanned_stack.make_args(layers_=6, batch=4)
    leaves = jax.tree.leaves(args)
    want = run_function(partir.import_jax(step, *args), leaves)
    module = partir.import_jax(step, *args)
    loops = find_layer_loops(module)
    assert loops.backward is not None
    for loop in (loops.forward, loops.backward):
        _chain_stages(loop, stages)
    module.verify()
    got = run_function(module, leaves)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_a_body_reading_every_layer_is_refused() -> None:
    """A scan whose body reads its whole stacked carry (here: its sum) cannot run
    on one stage's layers: the error names the op and says what to do."""

    def f(ws: Any, x: Any) -> Any:
        def layer(i: Any, h: Any) -> Any:
            return jnp.tanh(h @ ws[i]) + jnp.sum(ws)

        return jax.lax.fori_loop(0, ws.shape[0], layer, x)

    module = partir.import_jax(f, np.ones((4, 3, 3), np.float32), np.ones((2, 3), np.float32))
    (loop,) = [c for op in module.walk() if (c := counted_loop(op)) is not None]
    with pytest.raises(PipelineError, match="reads all layers"):
        split_rows(loop, 2)
