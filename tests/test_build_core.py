"""Build once: the core IR of a plain-data decision equals the rewrite engine's in effect.

`partition(..., engine="decided")` decides every sharding in plain data
(`rewrites.factor_propagation`) and builds each op once in its loops
(`rewrites.build_core`). On straight-line programs under BatchParallel,
Megatron, ZeRO-1 and conflicting ManualPartitions, the built module verifies,
the reference interpreter on it equals `jax.jit`, its SPMD lowering has the
rewrite engine's collectives (kind, axes, count, bytes), the emitted JAX
program computes `jax.jit`'s numbers, and the selections, action numbers and
conflicts recorded on the module are the engine's; while and case bodies
are built inside them. What it does not build yet (a padded dim, a window
with a halo) goes to the rewrite engine unchanged.
"""

from __future__ import annotations

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partir
from dialects.errors import UnsupportedError
from dialects.interpreter import run_function
from dialects.spmd import CollectiveOp
from examples import (
    block_train_step,
    mlp_forward,
    mlp_train_step,
    scanned_stack,
    stack_train_step,
)
from lowering.collectives import collectives as lowered_collectives
from lowering.to_spmd import lower_to_spmd
from partir.partition import decide_partition, partition
from partir.validation import emitted_program
from rewrites.build_core import build_core
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
DP = partir.BatchParallel("batch")
SCHEDULES = {
    "dp": [DP],
    "dp+megatron": [DP, partir.Megatron("model")],
    "megatron+dp": [partir.Megatron("model"), DP],
    "zero1": [DP, partir.ZeRO("batch", 1)],
    "manual": [
        partir.ManualPartition({"x": {0: "batch"}}),
        partir.ManualPartition({"**/w*": {-1: "model"}}),  # conflicting splits
    ],
}
PROGRAMS = {
    "mlp_forward": (mlp_forward.program, mlp_forward.make_args),
    "mlp_train": (mlp_train_step.program, mlp_train_step.make_args),
    "block_train": (block_train_step.program, block_train_step.make_args),
    "stack_train": (stack_train_step.program, lambda: stack_train_step.make_args(layers_=2)),
}
CASES = [
    ("mlp_forward", "dp"), ("mlp_forward", "dp+megatron"), ("mlp_forward", "manual"),
    ("mlp_train", "dp"), ("mlp_train", "dp+megatron"), ("mlp_train", "megatron+dp"),
    ("mlp_train", "manual"),
    ("block_train", "dp"), ("block_train", "dp+megatron"), ("block_train", "zero1"),
]
SLOW_CASES = [("stack_train", "dp+megatron"), ("stack_train", "zero1")]
"""~1,200 ops, partitioned twice and interpreted: only in the slow run."""


def collectives(module) -> collections.Counter:
    """(kind, axes, local type) -> count, in the SPMD lowering of `module` (in place)."""
    lower_to_spmd(module)
    return collections.Counter(
        (op.name, str(op.properties), str(op.results[0].type))
        for op in module.walk()
        if isinstance(op, CollectiveOp)
    )


def _bytes(module) -> int:
    """Bytes per device the SPMD lowering's collectives move."""
    return sum(c.bytes_per_device for c in lowered_collectives(module))


def check_against_engine(program, args, tactics, mesh=MESH, fewer_bytes=False):
    """The decided path's program against the rewrite engine's: the numbers,
    the recorded selections, actions and conflicts, and the collectives
    (with `fewer_bytes`, others that move fewer bytes per device pass)."""
    leaves = jax.tree_util.tree_leaves(args)
    expected = jax.jit(program)(*args)
    built = partir.import_jax(program, *args)
    engine = built.clone()
    partition(built, mesh, tactics, engine="decided", verify=True)
    partition(engine, mesh, tactics, engine="rewrite")
    assert_leaves_close(run_function(built, leaves), expected, what="interpreted core IR")
    assert built.attributes == engine.attributes  # selections, actions, conflicts
    ours, theirs = collectives(built), collectives(engine)
    if ours != theirs:
        assert fewer_bytes and _bytes(built) < _bytes(engine), (ours, theirs)
    got = emitted_program(built)(*leaves)
    assert_leaves_close(list(got), jax.tree_util.tree_leaves(expected), what="emitted JAX")
    return built


@pytest.mark.parametrize(
    ("program", "schedule"),
    [*CASES, *(pytest.param(p, s, marks=pytest.mark.slow) for p, s in SLOW_CASES)],
    ids=[f"{p}-{s}" for p, s in [*CASES, *SLOW_CASES]],
)
def test_built_once_computes_the_engines_program(program, schedule):
    fn, make_args = PROGRAMS[program]
    check_against_engine(fn, make_args(), SCHEDULES[schedule])


def test_mlp_forward_core_ir_is_the_engines_text():
    args = mlp_forward.make_args()
    built = partir.import_jax(mlp_forward.program, *args)
    engine = built.clone()
    partition(built, MESH, [DP], engine="decided")
    partition(engine, MESH, [DP], engine="rewrite")
    assert str(built) == str(engine)


def test_a_program_nobody_designed_it_around():
    """Other names, a pytree of three layers, a tanh and a mean, odd widths."""

    def step(weights, inputs):
        def loss(ws):
            h = inputs["tokens"]
            for layer in ws:
                h = jnp.tanh(h @ layer["kernel"] + layer["offset"])
            return jnp.mean(h**2)

        value, grads = jax.value_and_grad(loss)(weights)
        return value, jax.tree.map(lambda w, g: w - 0.05 * g, weights, grads)

    rng = np.random.default_rng(3)
    sizes = [(24, 40), (40, 40), (40, 8)]
    weights = [
        {"kernel": rng.normal(size=s).astype(np.float32) / 6, "offset": np.zeros(s[1], np.float32)}
        for s in sizes
    ]
    inputs = {"tokens": rng.normal(size=(32, 24)).astype(np.float32)}
    manual = partir.ManualPartition({"**/kernel": {1: "model"}})
    check_against_engine(step, (weights, inputs), [partir.BatchParallel("batch"), manual])


@pytest.mark.parametrize(
    "tactics",
    [[DP], [DP, partir.Megatron("model")]],
    ids=["dp", "dp+megatron"],
)
def test_a_scanned_stack_is_built_inside_its_while_bodies(tactics):
    """`lax.scan` over stacked layers (forward and backward whiles): each
    body's ops are built in loops inside the body, a value carried split
    enters and is returned as a tile loop of slices (the engine's form), so
    the collectives are the engine's and nothing is gathered per layer."""
    built = check_against_engine(
        scanned_stack.train_step, scanned_stack.make_args(layers_=2), tactics
    )
    assert "stablehlo.while" in str(built)


def test_a_split_argument_carried_by_a_loop_arrives_split():
    """An argument a tactic splits whose only use is a while: it enters
    the loop split (a tile loop of slices), not gathered."""

    def unrolled(h, ws):
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), h, ws)[0].sum()

    rng = np.random.default_rng(4)
    h = rng.standard_normal((8, 12)).astype(np.float32)
    ws = rng.standard_normal((3, 12, 12)).astype(np.float32) / 4
    built = check_against_engine(
        unrolled, (h, ws), [partir.ManualPartition({"h": {0: "batch"}})], partir.Mesh({"batch": 4})
    )
    assert not [op for op in built.walk() if op.name == "spmd.all_gather"]  # lowered already


def test_a_conditional_step_is_built_in_its_branches():
    from tests.test_conditionals import clipped_step

    check_against_engine(clipped_step, block_train_step.make_args(), [DP, partir.ZeRO("batch", 3)])


def test_a_padded_dim_goes_to_the_engine():
    """A batch of 6 over 4 devices is padded: not built here, the engine's result."""
    args = mlp_forward.make_args(batch=6)
    module = partir.import_jax(mlp_forward.program, *args)
    engine = module.clone()
    with pytest.raises(UnsupportedError, match="padded"):
        build_core(module, decide_partition(module, MESH, [DP]))
    partition(module, MESH, [DP], engine="decided")
    partition(engine, MESH, [DP], engine="rewrite")
    assert str(module) == str(engine)
    assert_leaves_close(run_function(module, jax.tree_util.tree_leaves(args)),
                        jax.jit(mlp_forward.program)(*args))


def test_an_unknown_engine_is_refused():
    args = mlp_forward.make_args()
    with pytest.raises(partir.PartirError, match="engine='fast'"):
        partition(partir.import_jax(mlp_forward.program, *args), MESH, [DP], engine="fast")


def test_a_slice_after_a_split_producer_keeps_its_global_bounds():
    """A `stablehlo.slice` whose kept dim is split reads its bounds from its
    operand's global shape, though that operand's producer was built (made a
    part) first."""

    def loss(w, x):
        y = jnp.flip(x @ w, axis=1)
        return jnp.sum(jnp.tanh(y[:, 5:1:-1]) * y[:, :4])

    def step(w, x):
        return jax.value_and_grad(loss, argnums=(0, 1))(w, x)

    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 6)).astype(np.float32)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    check_against_engine(step, (w, x), [partir.BatchParallel("batch", inputs="x")],
                         partir.Mesh({"batch": 4}))


def test_a_window_split_with_a_halo_is_built_as_the_engine_builds_it():
    """Rows of a 3x3 SAME convolution split over "model": each part reads its
    neighbours' edge rows through a `partir.halo_slice` of the whole input;
    the builder makes the engine's module."""

    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 8, 8, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 5)).astype(np.float32)
    tactics = [partir.ManualPartition({"x": {1: "model"}})]
    module = partir.import_jax(conv, x, w)
    engine = module.clone()
    with pytest.raises(partir.PartirError, match="another module"):
        build_core(engine.clone(), decide_partition(module, MESH, tactics))
    partition(module, MESH, tactics, engine="decided")
    assert "partir.halo_slice" in str(module)
    partition(engine, MESH, tactics, engine="rewrite")
    assert str(module) == str(engine)
    assert_leaves_close(run_function(module, [x, w]), jax.jit(conv)(x, w))


@given(st.lists(st.integers(0, 12), max_size=24))
@settings(max_examples=300, deadline=None)
def test_the_ops_kept_in_place_are_a_longest_increasing_run(values):
    """`_move_into_order` keeps in place the ops whose positions run in
    order (`_longest_increasing`) and moves the rest: the run kept is
    increasing, and as long as any (the fewest ops move)."""
    from rewrites.build_core import _longest_increasing

    kept = sorted(_longest_increasing(values))
    assert all(values[a] < values[b] for a, b in itertools.pairwise(kept))
    best = [1] * len(values)  # the longest increasing run ending at each index
    for k in range(len(values)):
        for j in range(k):
            if values[j] < values[k]:
                best[k] = max(best[k], best[j] + 1)
    assert len(kept) == max(best, default=0)


@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(n)))))
@settings(max_examples=200, deadline=None)
def test_a_body_is_moved_into_the_order_wanted(case):
    """`_move_into_order` leaves a block's ops in the order wanted, whatever
    the permutation (its first ops already in place)."""
    from xdsl.dialects.test import TestOp
    from xdsl.ir import Block

    from rewrites.build_core import _move_into_order

    n, order = case
    ops = [TestOp() for _ in range(n)]
    block = Block(ops)
    wanted = [ops[k] for k in order]
    first = next((k for k in range(n) if ops[k] is not wanted[k]), None)
    if first is not None:
        _move_into_order(block, ops, wanted, first)
    assert [id(op) for op in block.ops] == [id(op) for op in wanted]
