"""What used to fall back to the rewrite engine is decided and built once.

`partition`'s default path hands a program to the rewrite-at-a-time engine
only for what the builder does not build yet (a dim a later tactic pads
for divisibility, a window or a pick split over two axes), `Annotations`
placed after another tactic, and `Automatic`'s search. These programs
reached it before: ZeRO-1's whole results, a ZeRO planned again after a
tactic that split its leaves, JAX's own shardings, an op resizing its
properties for two split factors, dims the first tactic pads, split ops
of several results, picks along a split dim and windows with halos. Each runs
here with the rewrite engine made to fail, and matches `jax.jit`.
"""

from __future__ import annotations

import collections
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from examples import scanned_stack
from partir.partition import partition
from tests.numerics import assert_leaves_close
from tests.test_build_core import _bytes, collectives


@pytest.fixture
def no_rewrite_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    partition_module = sys.modules["partir.partition"]  # `partir.partition` is the function

    def refuse(*_args, **_kwargs):
        raise AssertionError("the default path handed the program to the rewrite engine")

    monkeypatch.setattr(partition_module, "_rewrite", refuse)


def _run(step, args, tactics, mesh):
    fn = partir.jit(step, mesh=partir.Mesh(mesh), tactics=tactics)
    lowered = fn.lower(*args)
    assert_leaves_close(
        jax.tree.leaves(lowered.compile()(*args)), jax.tree.leaves(jax.jit(step)(*args)),
        what="decided",
    )
    return lowered


def _gathers_in_loops(lowered) -> int:
    """all_gathers inside a loop body (run once per iteration)."""
    return sum(
        1 for line in str(lowered.module).splitlines()
        if "spmd.all_gather" in line and "while body" in line
    )


def test_zero1_beside_data_parallelism_carries_gradients_whole_through_the_layer_loop(
    no_rewrite_engine: None,
) -> None:
    """The backward loop writes each layer's gradient row at a run-time
    index: its accumulator is carried whole (no gather per layer) and split
    for ZeRO's update after the loop, for free; the updated parameters are
    gathered once, at the return."""
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=16, hidden=32)
    tactics = [partir.BatchParallel("batch"), partir.ZeRO("batch", 1)]
    lowered = _run(scanned_stack.mlp_train_step, args, tactics, {"batch": 4})
    kinds = collections.Counter(c.kind for c in lowered.collectives)
    assert _gathers_in_loops(lowered) == 0
    assert kinds["all_gather"] == len(args[0])  # each updated parameter, whole as it came


@pytest.mark.parametrize("second", ["zero1", "megatron", "megatron first"])
def test_two_batch_axes_with_zero_or_megatron_gather_no_activation(
    no_rewrite_engine: None, second: str
) -> None:
    """The batch split over two axes beside ZeRO-1 or Megatron (a
    pipeline's microbatch axis is such a second batch axis): per-layer
    slices split on two factors are built, and no activation is gathered."""
    if second == "zero1":
        step, args = scanned_stack.mlp_train_step, scanned_stack.mlp_train_args(
            layers_=4, batch=8, width=16, hidden=32
        )
        tactics = [partir.BatchParallel("batch"), partir.BatchParallel("b2"),
                   partir.ZeRO("batch", 1)]
        mesh = {"batch": 2, "b2": 4}
    else:  # "megatron first": the backward loop reads the saved activations
        # sliced over "model" then "batch" in one op, the other way round in
        # another; slices of different dims commute, so they arrive split
        step, args = scanned_stack.train_step, scanned_stack.make_args(
            layers_=2, batch=8, seq=4, width=16, mlp_width=32
        )
        tactics = [partir.BatchParallel("batch"), partir.BatchParallel("b2"),
                   partir.Megatron("model")]
        if second == "megatron first":
            tactics = [tactics[2], *tactics[:2]]
        mesh = {"batch": 2, "b2": 2, "model": 2}
    lowered = _run(step, args, tactics, mesh)
    assert _gathers_in_loops(lowered) == 0
    gathered = [c for c in lowered.collectives if c.kind == "all_gather"]
    assert all(c.axes == ("batch",) for c in gathered), gathered  # ZeRO-1's returns only


def test_zero_after_a_tactic_that_split_its_leaves_is_planned_again_on_the_decision(
    no_rewrite_engine: None,
) -> None:
    """A parameter ManualPartition split over ZeRO's axis comes back split
    (as it came); its optimizer state is split on the next dim."""

    def momentum(p, v, x):
        g = jax.grad(lambda p: ((x @ p["w"]) ** 2).mean())(p)
        v = jax.tree.map(lambda v, g: 0.9 * v + g, v, g)
        return jax.tree.map(lambda p, v: p - 0.1 * v, p, v), v

    rng = np.random.default_rng(0)
    args = ({"w": rng.normal(size=(8, 16)).astype(np.float32)},
            {"w": np.zeros((8, 16), np.float32)}, rng.normal(size=(4, 8)).astype(np.float32))
    tactics = [partir.ManualPartition({"p/w": {0: "model"}}), partir.ZeRO("model", stage=1)]
    lowered = _run(momentum, args, tactics, {"model": 2, "batch": 4})
    assert not [c for c in lowered.collectives if c.kind == "all_gather"]


def test_jax_shardings_are_decided_with_the_tactics(no_rewrite_engine: None) -> None:
    """`with_sharding_constraint` and argument shardings become actions of
    `Annotations`, placed first, on the decided path; a ManualPartition
    splitting a dim an annotation keeps whole is still a reported conflict."""
    mesh = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)

    def f(x, w):
        h = jax.lax.with_sharding_constraint(jax.numpy.tanh(x @ w), NamedSharding(mesh, P("batch")))
        return (h * 2).sum(axis=1)

    rng = np.random.default_rng(1)
    args = (rng.normal(size=(8, 6)).astype(np.float32), rng.normal(size=(6, 4)).astype(np.float32))
    lowered = _run(f, args, [partir.ManualPartition({"w": {1: "model"}})], {"batch": 4, "model": 2})
    assert isinstance(lowered.tactics[0], partir.Annotations)
    assert any("keeps" in c.detail for c in lowered.conflicts), lowered.conflicts


def test_an_annotated_program_the_builder_refuses_runs_from_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taking JAX's shardings out, and padding a batch of 6 over 4 devices,
    change the module before the builder can refuse (here: the annotation
    names a value the padding rebuilt): the rewrite engine then starts from
    the copy taken before, and the numbers are jax.jit's."""
    partition_module = sys.modules["partir.partition"]
    restored = []
    original = partition_module.adopt
    monkeypatch.setattr(
        partition_module, "adopt", lambda *a: restored.append(1) or original(*a)
    )
    mesh = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)

    def f(x, w):
        h = jax.lax.with_sharding_constraint(
            jax.numpy.tanh(x @ w), NamedSharding(mesh, P(None, "model"))
        )
        return (h * 2).sum(axis=1)

    rng = np.random.default_rng(2)
    args = (rng.normal(size=(6, 6)).astype(np.float32), rng.normal(size=(6, 4)).astype(np.float32))
    lowered = _run(f, args, [partir.BatchParallel("batch")], {"batch": 4, "model": 2})
    assert restored and isinstance(lowered.tactics[0], partir.Annotations)


def _against_the_engine(step, args, tactics, mesh):
    """The collectives of the default path's program and of the rewrite
    engine's, and whether the default path's move no more bytes."""
    engine = partir.import_jax(step, *args)
    partition(engine, partir.Mesh(mesh), list(tactics), engine="rewrite")
    decided = partir.import_jax(step, *args)
    partition(decided, partir.Mesh(mesh), list(tactics))
    ours, theirs = collectives(decided), collectives(engine)
    return ours, theirs, _bytes(decided) <= _bytes(engine)


def _vocabulary_step():
    """The gradient of a small language model's loss whose vocabulary (1,001
    rows, tied input and output embedding) no mesh axis divides."""

    def loss(p, tokens):
        h = p["embed"][tokens]
        logits = jax.numpy.tanh(h @ p["w"]) @ p["embed"].T
        return jax.numpy.mean(jax.nn.logsumexp(logits, axis=-1))

    rng = np.random.default_rng(3)
    params = {
        "embed": rng.normal(size=(1001, 16)).astype(np.float32) * 0.1,
        "w": rng.normal(size=(16, 16)).astype(np.float32) * 0.1,
    }
    return jax.grad(loss), (params, rng.integers(0, 1001, size=(8, 5)))


def _uneven_rows():
    scanned = scanned_stack.train_step
    small = {"layers_": 2, "seq": 4, "width": 16}
    vocabulary, vocabulary_args = _vocabulary_step()
    return {
        "batch 6 over 4, Megatron after": (
            scanned, scanned_stack.make_args(batch=6, mlp_width=32, **small),
            [partir.BatchParallel("batch"), partir.Megatron("model")], {"batch": 4, "model": 2},
        ),
        "batch 6 over the 4 of a 2x4 mesh": (
            scanned, scanned_stack.make_args(batch=6, mlp_width=32, **small),
            [partir.BatchParallel("model"), partir.Megatron("batch")], {"batch": 2, "model": 4},
        ),
        "hidden 35 under Megatron first": (
            scanned, scanned_stack.make_args(batch=8, mlp_width=35, **small),
            [partir.Megatron("model"), partir.BatchParallel("batch")], {"batch": 4, "model": 2},
        ),
        "vocabulary 1001, rows split first": (
            vocabulary, vocabulary_args,
            [partir.ManualPartition({"p/embed": {0: "model"}}), partir.BatchParallel("batch")],
            {"batch": 4, "model": 2},
        ),
        "vocabulary 1001 under ZeRO-3": (
            vocabulary, vocabulary_args, [partir.ZeRO("batch", stage=3)], {"batch": 4, "model": 2},
        ),
    }


UNEVEN = _uneven_rows()


@pytest.mark.parametrize("row", list(UNEVEN))
def test_a_dim_padded_by_the_first_tactic_is_padded_then_decided_and_built(
    row: str, no_rewrite_engine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uneven batch, hidden size or vocabulary padded for divisibility by
    the schedule's first tactic is padded before deciding (as the engine
    pads it before any loop) and built once: jax.jit's numbers, and the
    rewrite engine's collectives."""
    step, args, tactics, mesh = UNEVEN[row]
    lowered = _run(step, args, tactics, mesh)
    assert "partir.padded" in lowered.stage(-1)
    monkeypatch.undo()  # the reference: the rewrite engine
    ours, theirs, _ = _against_the_engine(step, args, tactics, mesh)
    assert ours == theirs


def test_a_later_tactic_s_padding_is_the_rewrite_engine_s(rewrite_engine_runs: list) -> None:
    """Padding a vocabulary after another tactic's splits meets their loops
    (the engine pads a smaller component then, and moves fewer bytes than
    padding first would): the default path hands it to the engine before
    padding anything, and the numbers are jax.jit's."""
    step, args = _vocabulary_step()
    tactics = [partir.BatchParallel("batch"), partir.ManualPartition({"p/embed": {0: "model"}})]
    _run(step, args, tactics, {"batch": 4, "model": 2})
    assert rewrite_engine_runs


def _conv_step():
    """A 1-D convolution stack (window 5, stride 1, 'SAME'; then window 3,
    stride 2) and its gradient: every window reads its neighbours' edges
    where the length is split."""

    def loss(p, x):
        dims = ("NWC", "WIO", "NWC")
        h = jax.lax.conv_general_dilated(x, p["k1"], (1,), "SAME", dimension_numbers=dims)
        h = jax.lax.conv_general_dilated(
            jax.numpy.tanh(h), p["k2"], (2,), "SAME", dimension_numbers=dims
        )
        return jax.numpy.mean(h**2)

    rng = np.random.default_rng(4)
    params = {
        "k1": rng.normal(size=(5, 3, 6)).astype(np.float32) * 0.3,
        "k2": rng.normal(size=(3, 6, 4)).astype(np.float32) * 0.3,
    }
    return jax.grad(loss), (params, rng.normal(size=(4, 32, 3)).astype(np.float32))


@pytest.mark.parametrize("rows", ["batch", "model"])
def test_a_window_split_along_its_length_reads_halos_on_the_decided_path(
    rows: str, no_rewrite_engine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A convolution whose length is split (over the 4- or the 2-device
    axis, beside data parallelism on the other) reads each part with its
    neighbours' edges (`partir.halo_slice`): built once, jax.jit's numbers,
    the rewrite engine's collectives."""
    step, args = _conv_step()
    data = "model" if rows == "batch" else "batch"
    tactics = [
        partir.BatchParallel(data, inputs=["x"]),
        partir.ManualPartition({"x": {1: rows}}),
    ]
    mesh = {"batch": 4, "model": 2}
    lowered = _run(step, args, tactics, mesh)
    assert "partir.halo_slice" in partir.jit(
        step, mesh=partir.Mesh(mesh), tactics=tactics
    ).lower(*args).stage(tactics[-1].name)
    monkeypatch.undo()
    ours, theirs, _ = _against_the_engine(step, args, tactics, mesh)
    assert ours == theirs
    assert any(c.kind == "collective_permute" for c in lowered.collectives)


def _classifier():
    """A classifier's loss and accuracy (an argmax over the classes) and a
    router's top 2 of 64 experts: picks over a dim Megatron may split."""

    def step(p, x, y):
        logits = jax.numpy.tanh(x @ p["w1"]) @ p["w2"]
        accuracy = jax.numpy.mean(jax.numpy.argmax(logits, axis=-1) == y)
        gates, experts = jax.lax.top_k(jax.nn.softmax(logits), 2)
        return accuracy, jax.numpy.mean(logits**2), gates.sum(), experts

    rng = np.random.default_rng(5)
    params = {
        "w1": rng.normal(size=(16, 32)).astype(np.float32),
        "w2": rng.normal(size=(32, 64)).astype(np.float32),
    }
    x = rng.normal(size=(8, 16)).astype(np.float32)
    return step, (params, x, rng.integers(0, 64, size=(8,)))


@pytest.mark.parametrize(
    "tactics",
    [
        [partir.BatchParallel("batch", inputs=["x", "y"])],
        [partir.BatchParallel("batch", inputs=["x", "y"]), partir.Megatron("model")],
        [partir.ManualPartition({"p/w2": {1: "model"}}), partir.BatchParallel("batch", inputs=["x", "y"])],
    ],
    ids=["rows", "rows and classes", "classes first"],
)
def test_picks_are_built_per_row_and_regrouped_along_a_split_dim(
    tactics, no_rewrite_engine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An argmax (a reduce of two results, one used) and a top_k (both
    used: a copy per result) split over the rows, and regrouped where the
    classes are split: built once, jax.jit's numbers, the engine's
    collectives or no more bytes (local slices placed otherwise)."""
    step, args = _classifier()
    mesh = {"batch": 4, "model": 2}
    _run(step, args, tactics, mesh)
    monkeypatch.undo()
    ours, theirs, fewer = _against_the_engine(step, args, tactics, mesh)
    assert ours == theirs or fewer, (ours, theirs)
