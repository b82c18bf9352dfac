"""Pipeline parallelism (`partir.Pipeline`): schedules as tables, the pipelined
step's numbers against `jax.jit`, its collectives read from the SPMD program
(`Lowered.collectives`: on the stage axis, the schedule's 2 (S - 1) M
collective permutes and one all-reduce per value one stage makes), every
tactic beside it (BatchParallel, ZeRO 1/2/3, ManualPartition), and clear
errors on what it cannot pipeline.

The default profile runs the 8-layer MLP stack on {"stage": 4, "batch": 2}
under both schedules; the full matrix (the MLP and transformer stacks, both
meshes, M = 4 and 8, both schedules) is `-m slow`.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import os
import socket
import subprocess
import sys
from typing import Any

import jax
import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

import partir
from dialects.functions import entry_function
from dialects.spmd import CollectivePermuteOp, DTensorType
from examples import scanned_stack
from partir.pipeline.schedule import Action, make_schedule, recorded_schedule
from tests.numerics import assert_leaves_close

MESHES = {"stage4xbatch2": {"stage": 4, "batch": 2}, "stage8": {"stage": 8}}


ONE_STAGE = {"mlp": 1, "transformer": 3}
"""Per stack, the values one stage makes that every device returns, each
all-reduced over the stage axis once: the loss (the last stage's), and the
transformer's gradients of the parameters its head reads after the layer
loop (`ln_f`'s scale and bias)."""


def tactics(mesh: dict[str, int], schedule: str, microbatches: int) -> list[partir.Tactic]:
    chosen: list[partir.Tactic] = [partir.Pipeline("stage", microbatches, schedule)]
    return [*chosen, partir.BatchParallel("batch")] if "batch" in mesh else chosen


@functools.cache
def program(name: str) -> tuple[Any, tuple[Any, ...], Any]:
    """(step, args, jax.jit's results) of the 8-layer MLP or transformer stack."""
    if name == "mlp":
        step, args = scanned_stack.mlp_train_step, scanned_stack.mlp_train_args(layers_=8, batch=16)
    else:
        step, args = scanned_stack.train_step, scanned_stack.make_args(layers_=8, batch=16)
    return step, args, jax.jit(step)(*args)


def run(step: Any, args: Any, mesh: dict[str, int], *tactics_: partir.Tactic) -> tuple[Any, Any]:
    """(lowered, results) of one pipelined step: one lowering, one compile."""
    jitted = partir.jit(step, mesh=partir.Mesh(mesh), tactics=list(tactics_))
    lowered = jitted.lower(*args)
    return lowered, jitted(*args)


def lower(step: Any, args: Any, mesh: dict[str, int], *tactics_: partir.Tactic) -> Any:
    return partir.jit(step, mesh=partir.Mesh(mesh), tactics=list(tactics_)).lower(*args)


def transfers(lowered: partir.Lowered) -> int:
    """Source-target pairs of the stage axis's collective permutes."""
    return sum(
        len(op.source_target_pairs)
        for op in lowered.module.walk()
        if isinstance(op, CollectivePermuteOp)
    )


def argument_dists(lowered: partir.Lowered) -> list[Any]:
    return [t.distribution for t in entry_function(lowered.module).function_type.inputs.data]


def result_dists(lowered: partir.Lowered) -> list[Any]:
    types = entry_function(lowered.module).function_type.outputs.data
    return [t.distribution for t in types if isinstance(t, DTensorType)]


def stage_combines(lowered: partir.Lowered) -> list[str]:
    """How each all-reduce over the stage axis combines: the reductions over
    every layer each stage completes, and the values one stage makes."""
    return sorted(c.op.combines for c in lowered.collectives  # type: ignore[attr-defined]
                  if c.kind == "all_reduce" and "stage" in c.axes)


def check_numbers(name: str, results: Any) -> None:
    _, _, want = program(name)
    loss, params, opt_state = results
    assert_leaves_close(loss, want[0], what=f"{name}: loss")
    assert_leaves_close(params, want[1], what=f"{name}: updated params")
    assert_leaves_close(opt_state, want[2], what=f"{name}: optimizer state")


def check_collectives(
    lowered: partir.Lowered, mesh: dict[str, int], schedule: str, microbatches: int,
    one_stage: int = 1,
) -> None:
    """On the stage axis: exactly the schedule's transfers as collective
    permutes (2 (S - 1) M), and `one_stage` all-reduces (the values one stage
    makes and every device returns: the loss); the gradients' all-reduces
    stay on the other axes."""
    sched = make_schedule(schedule, mesh["stage"], microbatches)
    assert transfers(lowered) == sched.transfers == 2 * (sched.stages - 1) * sched.microbatches
    on_stage = [c for c in lowered.collectives if "stage" in c.axes]
    kinds = collections.Counter(c.kind for c in on_stage)
    assert set(kinds) == {"collective_permute", "all_reduce"}, kinds
    assert all(c.axes == ("stage",) for c in on_stage if c.kind == "collective_permute")
    assert kinds["all_reduce"] == one_stage
    if "batch" in mesh:
        assert any(c.kind == "all_reduce" and c.axes == ("batch",) for c in lowered.collectives)


# --- schedules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (8, 8), (4, 4), (2, 1), (3, 5)])
def test_schedule_table(name: str, stages: int, microbatches: int) -> None:
    """Every stage runs each microbatch's forward once and its backward once,
    after its inputs exist; the step count, bubble and transfers are the formulas."""
    sched = make_schedule(name, stages, microbatches)
    for s in range(stages):
        ran = [row[s] for row in sched.table if row[s] is not None]
        assert sorted(map(str, ran)) == sorted(
            str(Action(m, p)) for m in range(microbatches) for p in "FB"
        )
        for m in range(microbatches):
            f, b = sched.time_of(s, Action(m, "F")), sched.time_of(s, Action(m, "B"))
            assert f < b
            if s > 0:
                assert sched.time_of(s - 1, Action(m, "F")) < f
            if s < stages - 1:
                assert sched.time_of(s + 1, Action(m, "B")) < b
    assert sched.steps == 2 * (microbatches + stages - 1)
    assert math.isclose(sched.bubble, (stages - 1) / (microbatches + stages - 1))
    assert sched.transfers == 2 * (stages - 1) * microbatches
    if name == "gpipe":
        assert sched.slots == microbatches
    else:
        assert sched.slots == min(stages, microbatches)


def test_one_f_one_b_alternates_in_the_steady_state() -> None:
    sched = make_schedule("1f1b", 4, 8)
    last = [str(row[3]) for row in sched.table if row[3] is not None]
    assert last == [f"{p}{m}" for m in range(8) for p in "FB"]
    assert "F0 F1 F2 F3  .  .  . B0 F4 B1" in sched.timeline()


@pytest.mark.parametrize(
    ("stages", "microbatches", "chunks"), [(4, 8, 2), (2, 4, 2), (4, 8, 4), (3, 6, 2)]
)
def test_interleaved_schedule_table(stages: int, microbatches: int, chunks: int) -> None:
    """Interleaved 1F1B: every stage runs each microbatch forward and backward
    through each of its chunks once, after the neighbouring chunk's (chunk c
    on stage c % S: the last stage's feeds the first stage's next); each
    microbatch crosses S k - 1 chunk boundaries each way; the steps and the
    bubble are (S - 1) / (k M + S - 1), below 1F1B's; the table is recorded
    and read back as it was."""
    sched = make_schedule("interleaved", stages, microbatches, chunks)
    for s in range(stages):
        ran = sorted(sched.label(row[s]) for row in sched.table if row[s] is not None)
        assert ran == sorted(
            f"{p}{m}v{v}" for m in range(microbatches) for p in "FB" for v in range(chunks)
        )
        for m in range(microbatches):
            for v in range(chunks):
                c = v * stages + s
                f = sched.time_of(s, Action(m, "F", v))
                b = sched.time_of(s, Action(m, "B", v))
                assert f < b
                if c > 0:
                    assert sched.time_of((c - 1) % stages, Action(m, "F", (c - 1) // stages)) < f
                if c < stages * chunks - 1:
                    assert sched.time_of((c + 1) % stages, Action(m, "B", (c + 1) // stages)) < b
    assert sched.transfers == 2 * (stages * chunks - 1) * microbatches
    assert sched.steps == 2 * (chunks * microbatches + stages - 1)
    assert math.isclose(sched.bubble, (stages - 1) / (chunks * microbatches + stages - 1))
    assert sched.bubble < make_schedule("1f1b", stages, microbatches).bubble
    module = ModuleOp([])
    sched.record(module, "stage")
    assert recorded_schedule(module) == ("stage", sched)


# --- numbers and collectives ---------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_mlp_stack_matches_jit_with_data_parallelism(schedule: str) -> None:
    step, args, _ = program("mlp")
    mesh = MESHES["stage4xbatch2"]
    lowered, results = run(step, args, mesh, *tactics(mesh, schedule, 4))
    check_numbers("mlp", results)
    check_collectives(lowered, mesh, schedule, 4)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("microbatches", [4, 8])
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_matrix_matches_jit(name: str, mesh_name: str, microbatches: int, schedule: str) -> None:
    """The acceptance matrix (CI runs its MLP, stage 4 x batch 2, M = 4 corner:
    `test_mlp_stack_matches_jit_with_data_parallelism`)."""
    step, args, _ = program(name)
    mesh = MESHES[mesh_name]
    lowered, results = run(step, args, mesh, *tactics(mesh, schedule, microbatches))
    check_numbers(name, results)
    check_collectives(lowered, mesh, schedule, microbatches, ONE_STAGE[name])


def moved_chunks(stages: int, chunks: int) -> int:
    """The chunks that change stage between the stages' consecutive rows
    (chunk c on stage c // k) and the interleaved layout (on c % S)."""
    return sum(c // chunks != c % stages for c in range(stages * chunks))


INTERLEAVED = partir.Pipeline("stage", 8, "interleaved", virtual_stages=2)
"""The acceptance corner: 4 stages x 2 virtual stages, 8 microbatches."""


def test_interleaved_mlp_stack_s_transfers_report_and_bubble() -> None:
    """The acceptance corner on the 8-layer MLP stack, lowered: on the stage
    axis only collective permutes besides the loss's all-reduce: 2 (S k - 1) M
    pairs for the microbatches, plus the chunks that change stage, dealt to
    the cyclic layout and the gradients' back (all leaves in one buffer per
    chunk); the report draws the table by chunk; the estimate's bubble is
    below 1F1B's on the same step. (Its numbers: the `-m slow` test below;
    CI runs interleaved numbers beside ZeRO-3 on a narrower stack.)"""
    step, args, _ = program("mlp")
    mesh = {"stage": 4}
    lowered = lower(step, args, mesh, INTERLEAVED)
    sched = make_schedule("interleaved", 4, 8, 2)
    assert sched.transfers == 2 * (4 * 2 - 1) * 8 == 112
    assert transfers(lowered) == 112 + 2 * moved_chunks(4, 2) == 124
    on_stage = collections.Counter(c.kind for c in lowered.collectives if "stage" in c.axes)
    assert set(on_stage) == {"collective_permute", "all_reduce"} and on_stage["all_reduce"] == 1
    text = str(lowered.report("h100-8"))
    assert (
        "interleaved schedule: 4 stages x 2 virtual stages, 8 microbatches, 38 time steps, "
        "bubble 15.8%" in text
    )
    assert "F0v0  F1v0  F2v0  F3v0  F0v1" in text
    one_f_one_b = lower(step, args, mesh, partir.Pipeline("stage", 8, "1f1b"))
    assert lowered.estimate("h100-8").bubble < one_f_one_b.estimate("h100-8").bubble


@pytest.mark.slow
def test_interleaved_mlp_stack_matches_jit() -> None:
    """The acceptance corner's numbers: jax.jit's loss, parameters and state."""
    step, args, _ = program("mlp")
    check_numbers("mlp", run(step, args, {"stage": 4}, INTERLEAVED)[1])


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layers"), [("mlp", 16), ("transformer", 8), ("transformer", 16)])
def test_interleaved_stacks_match_jit(name: str, layers: int) -> None:
    """Interleaved 1F1B (2 virtual stages, M = 8) beside data parallelism on
    stage 4 x batch 2, on other stacks and layer counts: jax.jit's numbers."""
    if name == "mlp":
        step = scanned_stack.mlp_train_step
        args = scanned_stack.mlp_train_args(layers_=layers, batch=16)
    else:
        step, args = scanned_stack.train_step, scanned_stack.make_args(layers_=layers, batch=16)
    mesh = MESHES["stage4xbatch2"]
    pipe = partir.Pipeline("stage", 8, "interleaved", virtual_stages=2)
    lowered, got = run(step, args, mesh, pipe, partir.BatchParallel("batch"))
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(step)(*args)),
                        what=f"{layers}-layer {name}")
    assert transfers(lowered) == 2 * 7 * 8 + 2 * moved_chunks(4, 2)


@pytest.mark.parametrize("beside", ["zero3", pytest.param("megatron", marks=pytest.mark.slow)])
def test_interleaved_beside_zero_and_megatron(beside: str) -> None:
    """ZeRO-3 on the data axis (a stage's parameters split further, gathered
    before its chunks are dealt) and Megatron inside each chunk, beside
    interleaved 1F1B: jax.jit's numbers."""
    args = scanned_stack.mlp_train_args(layers_=8, batch=16, width=8, hidden=8)
    more: list[partir.Tactic] = {
        "zero3": [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)],
        "megatron": [partir.Megatron("batch", column=["params/w_in", "params/b_in"],
                                     row=["params/w_out"])],
    }[beside]
    pipe = partir.Pipeline("stage", 4, "interleaved", virtual_stages=2)
    _, got = run(scanned_stack.mlp_train_step, args, {"stage": 4, "batch": 2}, pipe, *more)
    want = jax.jit(scanned_stack.mlp_train_step)(*args)
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(want), what=f"beside {beside}")


def test_call_through_partir_jit() -> None:
    """`partir.jit` runs the pipelined step like any other (2 stages, 2
    microbatches); its `lower()` is a `Lowered` like any other."""
    step, _, _ = program("mlp")
    args = scanned_stack.mlp_train_args(layers_=2, batch=4, width=8, hidden=8)
    mesh = partir.Mesh({"stage": 2})
    jitted = partir.jit(step, mesh=mesh, tactics=[partir.Pipeline("stage", 2, "gpipe")])
    assert_leaves_close(jitted(*args), jax.jit(step)(*args), what="2-stage step")
    assert isinstance(jitted.lower(*args), partir.Lowered)


@pytest.mark.parametrize("schedule", ["1f1b", pytest.param("interleaved", marks=pytest.mark.slow)])
def test_a_step_that_returns_the_stacked_gradients_as_they_are(schedule: str) -> None:
    """`value_and_grad` with no update: the stacked gradients are returned as
    the backward loop wrote them, each stage's rows split over "stage" (they
    were typed whole, and JAX refused the rows of one stage as the whole)."""
    step = jax.value_and_grad(scanned_stack.mlp_loss)
    params, _, x, y = scanned_stack.mlp_train_args(layers_=4, batch=16, width=8, hidden=8)
    virtual = 2 if schedule == "interleaved" else 1
    tactic = partir.Pipeline("stage", 4, schedule, virtual_stages=virtual)
    jitted = partir.jit(step, mesh=partir.Mesh({"stage": 2}), tactics=[tactic])
    assert_leaves_close(jitted(params, x, y), jax.jit(step)(params, x, y), what=schedule)


# --- report and estimate -------------------------------------------------------------------------


def test_report_draws_the_schedule_and_the_estimate_has_the_bubble() -> None:
    """The report's table is the schedule the program records; the
    estimate's bubble is the stages' idle share (below the table's 3/11 on
    a real step: each time step's bookkeeping runs on every stage, and the
    head makes the last stage's steps longer; exactly 3/11 on equal stages,
    `tests/test_pipeline_lowered.py`)."""
    args = scanned_stack.mlp_train_args(layers_=8, batch=16, width=8, hidden=8)
    mesh = {"stage": 4, "batch": 2}
    lowered = lower(scanned_stack.mlp_train_step, args, mesh, *tactics(mesh, "1f1b", 8))
    text = str(lowered.report("h100-8"))
    assert "1f1b schedule: 4 stages, 8 microbatches, 22 time steps, bubble 27.3%" in text
    assert 'in the program 48 permute pairs on "stage"' in text
    est = lowered.estimate("h100-8")
    assert est.positions is not None and est.positions.axes == ("stage",)
    assert 0.15 < est.bubble < 3 / 11


# --- bad input ----------------------------------------------------------------------------------


def test_layers_the_axis_does_not_divide() -> None:
    args = scanned_stack.mlp_train_args(layers_=6, batch=8, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError, match=r"6 layers do not split over 4 stages:"):
        lower(scanned_stack.mlp_train_step, args, {"stage": 4}, partir.Pipeline("stage", 2))


def test_microbatches_that_do_not_divide_the_batch() -> None:
    args = scanned_stack.mlp_train_args(layers_=4, batch=6, width=8, hidden=8)
    with pytest.raises(
        partir.PartirValueError, match=r"batch of 6 \(\"x\"\) does not split into 4 microbatches"
    ):
        lower(scanned_stack.mlp_train_step, args, {"stage": 4}, partir.Pipeline("stage", 4))


def test_no_stacked_loop() -> None:
    def step(params, opt_state, x, y):
        def loss(p, x, y):
            return ((x @ p["w"] - y) ** 2).mean()

        g = jax.grad(loss)(params, x, y)
        return loss(params, x, y), {"w": params["w"] - g["w"]}, opt_state

    args = (
        {"w": np.ones((4, 4), np.float32)},
        {"m": np.zeros(4, np.float32)},
        np.ones((8, 4), np.float32),
        np.ones((8, 4), np.float32),
    )
    with pytest.raises(partir.PartirValueError, match=r"the step has no loop over stacked layers"):
        lower(step, args, {"stage": 4}, partir.Pipeline("stage", 2))


def test_unknown_axis_and_schedule() -> None:
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    with pytest.raises(
        partir.PartirValueError, match=r'unknown mesh axis "pipe"; the mesh has "stage"'
    ):
        lower(scanned_stack.mlp_train_step, args, {"stage": 4}, partir.Pipeline("pipe", 2))
    with pytest.raises(
        partir.PartirValueError, match=r"unknown schedule 'zb'; the schedules are 'gpipe', '1f1b'"
    ):
        lower(scanned_stack.mlp_train_step, args, {"stage": 4}, partir.Pipeline("stage", 2, "zb"))


def test_interleaved_refuses_what_it_cannot_split() -> None:
    """virtual_stages without the interleaved schedule (or too few for it),
    microbatches not a multiple of the stages, layers not a multiple of the
    chunks: errors naming the numbers."""
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    step, mesh = scanned_stack.mlp_train_step, {"stage": 4}
    cases = [
        (partir.Pipeline("stage", 4, "1f1b", virtual_stages=2),
         r"virtual_stages=2 needs schedule='interleaved'"),
        (partir.Pipeline("stage", 4, "interleaved"),
         r"schedule='interleaved' needs virtual_stages of at least 2"),
        (partir.Pipeline("stage", 2, "interleaved", virtual_stages=2),
         r"groups of the 4 stages; 2 microbatches are not a multiple of 4"),
        (partir.Pipeline("stage", 4, "interleaved", virtual_stages=2),
         r"4 layers do not split into 4 stages x 2 virtual stages; give the stack a multiple "
         r"of 8 layers"),
    ]
    for pipe, message in cases:
        with pytest.raises(partir.PartirValueError, match=message):
            lower(step, args, mesh, pipe)


def test_forward_pass_alone_and_a_tactic_on_the_stage_axis_are_refused() -> None:
    params, x = scanned_stack.mlp_args(layers_=4, batch=8, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError, match=r"no backward layer loop"):
        lower(
            lambda params, x: scanned_stack.mlp_program(params, x),
            (params, x),
            {"stage": 4},
            partir.Pipeline("stage", 2),
        )
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    for other in (partir.Megatron("stage"), partir.BatchParallel("stage"), partir.ZeRO("stage", 1)):
        with pytest.raises(partir.PartirValueError, match=r'Pipeline owns the axis "stage"'):
            lower(scanned_stack.mlp_train_step, args, {"stage": 4, "batch": 2},
                  partir.Pipeline("stage", 2), other)


def test_manual_partition_beside_the_pipeline() -> None:
    """A `ManualPartition` of the data on another axis works inside each stage
    as it does anywhere: jax.jit's numbers, the schedule's transfers."""
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    mesh = {"stage": 4, "model": 2}
    lowered, got = run(scanned_stack.mlp_train_step, args, mesh, partir.Pipeline("stage", 2),
                       partir.ManualPartition({"x": {0: "model"}}))
    assert_leaves_close(jax.tree.leaves(got),
                        jax.tree.leaves(jax.jit(scanned_stack.mlp_train_step)(*args)),
                        what="ManualPartition")
    assert transfers(lowered) == 2 * 3 * 2


@pytest.mark.parametrize(
    "stage", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_zero_beside_the_pipeline_splits_each_stage_s_state_over_the_data_axis(
    stage: int,
) -> None:
    """Pipeline + BatchParallel + ZeRO(batch, stage) on the IR: each data shard
    holds its share of its stage's layers' Adam state (1), returns only its
    share of the updated layers and state (2), and holds only its share of
    the parameters (3): those arguments split over ("stage", "batch") on the
    layer dim; the stage axis carries what it did without ZeRO; the numbers
    are jax.jit's."""
    mesh = MESHES["stage4xbatch2"]
    step, args, _ = program("mlp")
    lowered, results = run(step, args, mesh, *tactics(mesh, "1f1b", 4), partir.ZeRO("batch", stage))
    check_numbers("mlp", results)
    check_collectives(lowered, mesh, "1f1b", 4)
    names = [path for path, _ in jax.tree_util.tree_leaves_with_path(args)]
    leaves = jax.tree.leaves(args)
    for path, x, dist in zip(names, leaves, argument_dists(lowered), strict=True):
        where = jax.tree_util.keystr(path)
        stacked = np.ndim(x) > 0 and np.shape(x)[0] == 8
        split = stacked and ((where.startswith("[1]") and "count" not in where) or stage == 3)
        want = ("stage", "batch") if split else ("stage",) if stacked else None
        if want is not None:
            assert dist.dims[0] == want, where
    _, _, want = program("mlp")
    returned = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(want)]
    for where, x, dist in zip(returned, jax.tree.leaves(want), result_dists(lowered), strict=True):
        if np.ndim(x) and np.shape(x)[0] == 8:  # the updated layers (stage >= 2: split) and state
            split = where.startswith("[2]") or stage >= 2
            assert dist.dims[0] == (("stage", "batch") if split else ("stage",)), where


def test_zero_with_selectors_beside_a_pipeline_and_a_layer_per_stage() -> None:
    """ZeRO's own selectors work beside a Pipeline as anywhere (only Adam's
    first moments split over "batch"); a stage of one layer cannot split its
    layers over "batch" again: refused, naming both splits."""
    args = scanned_stack.mlp_train_args(layers_=8, batch=16, width=8, hidden=8)
    mesh = {"stage": 4, "batch": 2}
    step = scanned_stack.mlp_train_step
    zero = partir.ZeRO("batch", 1, opt_state="opt_state/m/**")
    lowered, got = run(step, args, mesh, partir.Pipeline("stage", 2), partir.BatchParallel("batch"),
                       zero)
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(step)(*args)),
                        what="ZeRO selectors")
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(args)]
    for where, dist in zip(names, argument_dists(lowered), strict=True):
        if where.startswith("[1]['m']"):
            assert dist.dims[0] == ("stage", "batch"), where
        elif where.startswith("[1]['v']"):
            assert dist.dims[0] == ("stage",), where
    uneven = scanned_stack.mlp_train_args(layers_=4, batch=16, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError,
                       match=r'4 layers do not split over 4 stages x 2 parts over "batch"'):
        lower(step, uneven, mesh, partir.Pipeline("stage", 2), partir.BatchParallel("batch"),
              partir.ZeRO("batch", 1))


@pytest.mark.parametrize(("name", "mesh", "schedule"), [
    ("mlp", {"stage": 4, "model": 2}, "1f1b"),
    pytest.param("transformer", {"stage": 2, "batch": 2, "model": 2}, "gpipe",
                 marks=pytest.mark.slow),
])
def test_megatron_inside_a_stage(name: str, mesh: dict[str, int], schedule: str) -> None:
    """Pipeline + Megatron(model) (+ BatchParallel): each stage's layers split
    over "model" as Megatron splits them (their Adam state with them); the
    numbers are jax.jit's, the stage axis carries only the schedule's permutes
    and the loss's all-reduce, and the model axis carries the loops'
    all-reduces."""
    step, args, _ = program(name)
    lowered, results = run(step, args, mesh, *tactics(mesh, schedule, 4), partir.Megatron("model"))
    check_numbers(name, results)
    check_collectives(lowered, mesh, schedule, 4, ONE_STAGE[name])
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(args)]
    split = {n for n, d in zip(names, argument_dists(lowered), strict=True) if "model" in d.axes}
    assert any(n.startswith("[0]") for n in split) and any(n.startswith("[1]") for n in split)
    assert any(c.kind == "all_reduce" and c.axes == ("model",) for c in lowered.collectives)


@pytest.mark.slow
def test_megatron_and_zero_beside_the_pipeline() -> None:
    """Pipeline + BatchParallel + Megatron(model) + ZeRO(batch, 2) on 2x2x2:
    ZeRO's leaves split over ("stage", "batch") on the layer dim and over
    "model" as Megatron splits them; jax.jit's numbers."""
    mesh = {"stage": 2, "batch": 2, "model": 2}
    step, args, _ = program("mlp")
    chosen = [*tactics(mesh, "1f1b", 4), partir.Megatron("model"), partir.ZeRO("batch", 2)]
    lowered, results = run(step, args, mesh, *chosen)
    check_numbers("mlp", results)
    check_collectives(lowered, mesh, "1f1b", 4)


LAYERS = 8


@jax.jit  # the loop inside a call, its length fixed
def _fixed_length_stack(blocks: Any, x: Any) -> Any:
    """`mlp_program` with the scan's length fixed, as flax's `nn.scan(length=...)` does."""
    step = lambda h, p: (scanned_stack.mlp_layer(p, h), None)  # noqa: E731
    return jax.lax.scan(step, x, blocks, length=LAYERS)[0]


def test_step_that_fixes_its_scan_length_pipelines() -> None:
    """Called with a stage's layers the step would fail (`lax.scan` gets length
    8 and 4 layers); the IR splits the loop's trip count with its rows, so it
    pipelines with jax.jit's numbers, ZeRO-3 included."""

    def loss(params, x, y):
        return jax.numpy.mean((_fixed_length_stack(params, x) - y) ** 2)

    def step(params, opt_state, x, y):
        return scanned_stack.adam_step(loss, params, opt_state, x, y)

    args = scanned_stack.mlp_train_args(layers_=LAYERS, batch=16, width=8, hidden=8)
    half = jax.tree.map(lambda a: a[: LAYERS // 2], args[0])
    with pytest.raises(ValueError, match="length"):
        jax.make_jaxpr(_fixed_length_stack)(half, args[2])
    want = jax.jit(step)(*args)
    mesh = {"stage": 2, "batch": 2}
    for more in ([], [partir.ZeRO("batch", 3)]):
        lowered, got = run(step, args, mesh, partir.Pipeline("stage", 2),
                           partir.BatchParallel("batch"), *more)
        dists = argument_dists(lowered)[: len(jax.tree.leaves(args[:2]))]
        stacked = [np.ndim(a) > 0 for a in jax.tree.leaves(args[:2])]  # all but Adam's count
        assert ["stage" in d.dims[0] if d.dims else False for d in dists] == stacked
        assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(want),
                            what=f"fixed-length scan, {more}")


def test_step_that_fixes_its_layer_count_in_a_shape_pipelines() -> None:
    """A reshape to the whole stack's size, and a sum per layer broadcast back:
    on the IR the reshape's rule keeps the layers a factor of their own, so a
    stage runs it on its rows (its sizes localized): jax.jit's numbers."""

    def step(params, opt_state, x, y):
        flat = params["w_in"].reshape(LAYERS, -1)  # fixes the layer count in a shape
        scale = 1 + 0 * flat.sum(1).reshape(LAYERS, 1, 1)
        params = {**params, "w_in": params["w_in"] * scale}
        return scanned_stack.adam_step(scanned_stack.mlp_loss, params, opt_state, x, y)

    args = scanned_stack.mlp_train_args(layers_=LAYERS, batch=16, width=8, hidden=8)
    _, got = run(step, args, {"stage": 2}, partir.Pipeline("stage", 2))
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(step)(*args)),
                        what="layer count in a shape")


def _clipped_step(params, opt_state, x, y):
    """The MLP stack's step with its gradients clipped to a global norm of 1e-3 (a
    sum over every layer of every stacked gradient) and skipped unless all are
    finite (an `and` over every layer)."""
    loss, g = jax.value_and_grad(scanned_stack.mlp_loss)(params, x, y)
    leaves = jax.tree.leaves(g)
    norm = jax.numpy.sqrt(sum(jax.numpy.sum(v * v) for v in leaves))
    finite = jax.numpy.all(jax.numpy.stack([jax.numpy.isfinite(v).all() for v in leaves]))
    scale = jax.numpy.where(finite, jax.numpy.minimum(1.0, 1e-3 / norm), 0.0)
    new = jax.tree.map(lambda p, v: p - 0.1 * scale * v, params, g)
    return loss, new, opt_state


@pytest.mark.parametrize("beside", [
    "data", "zero", pytest.param("megatron", marks=pytest.mark.slow),
])
def test_update_reducing_over_all_layers_sums_the_stages(beside: str) -> None:
    """A global gradient norm and an all-finite check read every layer: each
    stage reduces its own layers and the stages' partials are combined by
    one all-reduce over the stage axis each (with ZeRO, or Megatron's split
    leaves, summed over their axis too); jax.jit's numbers."""
    args = scanned_stack.mlp_train_args(layers_=LAYERS, batch=16, width=8, hidden=8)
    mesh = {"stage": 4, "model" if beside == "megatron" else "batch": 2}
    more: list[partir.Tactic] = {
        "data": [partir.BatchParallel("batch")],
        "zero": [partir.BatchParallel("batch"), partir.ZeRO("batch", 1)],
        "megatron": [partir.Megatron("model", column=["params/w_in", "params/b_in"],
                                     row=["params/w_out"])],
    }[beside]
    lowered, got = run(_clipped_step, args, mesh, partir.Pipeline("stage", 2), *more)
    # per stacked gradient: all finite, squares; and the loss
    assert stage_combines(lowered) == ["min"] * 3 + ["sum"] * 4
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(_clipped_step)(*args)),
                        what=f"clipped step beside {beside}")


def test_optax_clip_by_global_norm_pipelines() -> None:
    """optax's own global-norm clipping before AdamW, as LLM training steps
    write it, pipelined with ZeRO-1: jax.jit's loss, parameters and state."""
    optax = pytest.importorskip("optax")
    optimizer = optax.chain(optax.clip_by_global_norm(1e-3), optax.adamw(1e-2))

    def step(params, opt_state, x, y):
        loss, g = jax.value_and_grad(scanned_stack.mlp_loss)(params, x, y)
        updates, opt_state = optimizer.update(g, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    params, _, x, y = scanned_stack.mlp_train_args(layers_=LAYERS, batch=16, width=8, hidden=8)
    args = (params, optimizer.init(params), x, y)
    args = (*jax.jit(step)(*args)[1:], x, y)  # one step in: Adam's moments are not zero
    lowered = lower(step, args, {"stage": 4, "batch": 2}, partir.Pipeline("stage", 2),
                    partir.BatchParallel("batch"), partir.ZeRO("batch", 1))
    assert "sum" in stage_combines(lowered)
    assert_leaves_close(jax.tree.leaves(lowered.compile()(*args)),
                        jax.tree.leaves(jax.jit(step)(*args)), what="optax clipped AdamW")


@pytest.mark.slow
def test_rematerialized_layers_and_metrics_over_all_layers() -> None:
    """A rematerialized layer (`jax.checkpoint`: the backward loop calls it) and
    metrics read over every layer: a norm per layer (stacked), the largest
    gradient and the mean of a stacked parameter (combined across stages; the
    mean divides by the whole stack's count, not a stage's), and gradients
    scaled by the layer count; jax.jit's numbers."""
    jnp = jax.numpy
    layer = jax.checkpoint(scanned_stack.mlp_layer)

    def loss(params, x, y):
        out = jax.lax.scan(lambda h, p: (layer(p, h), None), x, params)[0]
        return jnp.mean((out - y) ** 2)

    def step(params, opt_state, x, y):
        value, g = jax.value_and_grad(loss)(params, x, y)
        metrics = {
            "per_layer": jnp.sqrt(jnp.sum(g["w_in"] ** 2, axis=(1, 2))),
            "largest": jnp.max(jnp.stack([jnp.max(jnp.abs(v)) for v in jax.tree.leaves(g)])),
            "mean_w_in": jnp.mean(params["w_in"]),
        }
        count = params["w_in"].shape[0]
        new = jax.tree.map(lambda p, v: p - 0.1 * v * 4 / count, params, g)
        return value, new, opt_state, metrics

    args = scanned_stack.mlp_train_args(layers_=LAYERS, batch=16, width=8, hidden=8)
    lowered = lower(step, args, {"stage": 4, "batch": 2}, partir.Pipeline("stage", 4),
                    partir.BatchParallel("batch"))
    assert stage_combines(lowered) == ["max"] * 3 + ["sum"] * 2  # and the loss
    assert_leaves_close(jax.tree.leaves(lowered.compile()(*args)),
                        jax.tree.leaves(jax.jit(step)(*args)), what="metrics step")


MIXES = r"combines the layers of a stacked value"


def test_update_contracting_the_layers_completes_the_stages_sums() -> None:
    """A contraction over the layers in the update (a sum factor of its rule)
    is each stage's partial sum, all-reduced over the stage axis: jax.jit's
    numbers."""

    def step(params, opt_state, x, y):
        loss, g = jax.value_and_grad(scanned_stack.mlp_loss)(params, x, y)
        mixed = jax.tree.map(lambda v: jax.numpy.tensordot(jax.numpy.ones(v.shape[0]), v, 1) + v, g)
        return loss, jax.tree.map(lambda p, v: p - 0.1 * v, params, mixed), opt_state

    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    lowered, got = run(step, args, {"stage": 4}, partir.Pipeline("stage", 2))
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(step)(*args)),
                        what="contracted layers")
    assert stage_combines(lowered) == ["sum"] * 4  # per stacked gradient; the loss


def _layer_index(v: Any) -> Any:
    return v * jax.numpy.arange(v.shape[0]).reshape(-1, *[1] * (v.ndim - 1))


@pytest.mark.parametrize(("mix", "message"), [
    pytest.param(lambda v: v[::-1], MIXES, id="reversed"),
    pytest.param(lambda v: jax.numpy.cumsum(v, axis=0), MIXES, id="cumsum"),
    pytest.param(lambda v: jax.numpy.roll(v, 1, axis=0), MIXES, id="roll"),
    pytest.param(_layer_index, r"stablehlo.iota outside the layer loops " + MIXES,
                 id="layer-index"),
])
def test_update_mixing_layers_is_refused(mix: Any, message: str) -> None:
    """An update that moves or scans along the layers, or numbers them, would
    be wrong on a stage that holds only its own (the registry's rule of the op
    says its layer dim does not split): refused, never run."""

    def step(params, opt_state, x, y):
        loss, g = jax.value_and_grad(scanned_stack.mlp_loss)(params, x, y)
        return loss, jax.tree.map(lambda p, v: p - 0.1 * mix(v), params, g), opt_state

    params, opt_state, x, y = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError, match=message):
        lower(step, (params, opt_state, x, y), {"stage": 4}, partir.Pipeline("stage", 2))


def _rows_step(layer_kind: str, loss_kind: str) -> Any:
    """The MLP stack's step, with a batch statistic or a dropout mask drawn
    for the batch in its layer, or a loss whose gradient for one example
    reads the others."""
    jnp = jax.numpy

    def layer(p, h):
        z = h @ p["w_in"] + p["b_in"]
        if layer_kind == "batch-norm":
            z = (z - z.mean(0)) / (z.std(0) + 1)
        if layer_kind == "dropout":  # a key per layer, drawn inside the loop
            key = jax.random.fold_in(jax.random.key(0), p["b_in"][0].astype(jnp.int32))
            z = jnp.where(jax.random.bernoulli(key, 0.9, z.shape), z / 0.9, 0)
        return h + jnp.tanh(z) @ p["w_out"]

    def loss(params, x, y):
        out = jax.lax.scan(lambda h, p: (layer(p, h), None), x, params)[0]
        if loss_kind == "contrastive":
            rows = jnp.arange(out.shape[0])
            return -jnp.mean(jax.nn.log_softmax(out @ out.T)[rows, rows])
        if loss_kind == "shifted":  # drops the batch's first example, not each microbatch's
            return jnp.mean((out[1:] - y[1:]) ** 2)
        if loss_kind == "batch-scaled":
            e = jnp.sum((out - y) ** 2, axis=1)
            return jnp.mean(e * e / jax.lax.stop_gradient(e.mean()))
        return jnp.mean((out - y) ** 2)

    def step(params, opt_state, x, y):
        value, g = jax.value_and_grad(loss)(params, x, y)
        return value, jax.tree.map(lambda p, v: p - 0.1 * v, params, g), opt_state

    return step


@pytest.mark.parametrize(("layer_kind", "loss_kind", "message"), [
    ("batch-norm", "mse", r"combines microbatches inside the layers \(a batch statistic\)"),
    ("dropout", "mse", r"saved per layer for the whole batch.*random bits drawn for the batch"),
    ("plain", "contrastive", r"over the microbatch axis joins microbatches"),
    ("plain", "batch-scaled", r"reads a value made from the whole batch's sum"),
    ("plain", "shifted", r"over the microbatch axis joins microbatches"),
])
def test_steps_whose_examples_depend_on_each_other_are_refused(
    layer_kind: str, loss_kind: str, message: str
) -> None:
    """Microbatching changes a batch statistic inside the loop, a dropout mask
    drawn there for the whole batch, and a loss that pairs or scales examples
    by the batch: refused, at 2 rows a microbatch and at 1."""
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    for microbatches in (2, 8):
        with pytest.raises(partir.PartirValueError, match=message):
            lower(_rows_step(layer_kind, loss_kind), args, {"stage": 4},
                  partir.Pipeline("stage", microbatches))


def test_the_same_step_per_example_pipelines_at_one_row_a_microbatch() -> None:
    """The step of the refused ones with each example computed apart: jax.jit's
    numbers at 8 microbatches of one row."""
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    plain = _rows_step("plain", "mse")
    _, got = run(plain, args, {"stage": 4}, partir.Pipeline("stage", 8))
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(plain)(*args)),
                        what="per-example step")


def _labels_step(shuffle: bool) -> Any:
    """The MLP stack's step under cross-entropy with integer labels (a gather
    per row, and its scatter-add), or with the examples' rows shuffled."""
    jnp = jax.numpy

    def loss(params, x, labels):
        out = scanned_stack.mlp_program(params, x)
        if shuffle:
            out = out[jnp.arange(out.shape[0])[::-1]]
        picked = jnp.take_along_axis(jax.nn.log_softmax(out), labels[:, None], axis=1)
        return -jnp.mean(picked)

    def step(params, opt_state, x, labels):
        value, g = jax.value_and_grad(loss)(params, x, labels)
        return value, jax.tree.map(lambda p, v: p - 0.1 * v, params, g), opt_state

    return step


def test_cross_entropy_gathers_per_example_and_a_shuffle_is_refused() -> None:
    """`take_along_axis` gathers each example's label apart (a batching dim), so
    the usual LM loss pipelines with jax.jit's numbers; a loss that reorders
    the examples reads across them and is refused."""
    params, opt_state, x, _ = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    args = (params, opt_state, x, np.arange(8, dtype=np.int32) % 8)
    mesh = {"stage": 4, "batch": 2}
    step = _labels_step(shuffle=False)
    lowered = lower(step, args, mesh, partir.Pipeline("stage", 2), partir.BatchParallel("batch"))
    assert_leaves_close(jax.tree.leaves(lowered.compile()(*args)),
                        jax.tree.leaves(jax.jit(step)(*args)), what="cross-entropy step")
    with pytest.raises(partir.PartirValueError, match=r"over the microbatch axis joins microbatches"):
        lower(_labels_step(shuffle=True), args, mesh, partir.Pipeline("stage", 2),
              partir.BatchParallel("batch"))


def test_escaped_axis_name_in_errors() -> None:
    args = scanned_stack.mlp_train_args(layers_=6, batch=8, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError, match=r'Pipeline\("st\\0Aage"\): 6 layers'):
        lower(scanned_stack.mlp_train_step, args, {"st\nage": 4}, partir.Pipeline("st\nage", 2))


# --- two processes -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_with_gloo_match_one() -> None:
    """2 processes x 4 CPU devices joined by `jax.distributed` (gloo on localhost)
    run the pipelined step (`tests/pipeline_worker.py`): the loss and each
    stage's updated layers equal `jax.jit`'s on one process. (CI runs the same
    program in one process: `test_mlp_stack_matches_jit_with_data_parallelism`.)"""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.pipeline_worker", str(i), "2", str(port)],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [w.communicate(timeout=600) for w in workers]
    for w, (_out, err) in zip(workers, outputs, strict=True):
        assert w.returncode == 0, err[-2000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    step, _args, _ = program("mlp")
    want_loss, want_params, _ = jax.jit(step)(*scanned_stack.mlp_train_args(layers_=8, batch=16))
    seen = set()
    for report in reports:
        assert (report["devices"], report["local"]) == (8, 4)
        assert math.isclose(report["loss"], float(want_loss), rel_tol=1e-5)
        for name, shards in report["params"].items():
            for start, total in shards.items():
                want = np.asarray(want_params[name], np.float64)[int(start) : int(start) + 2].sum()
                assert math.isclose(total, want, rel_tol=1e-4, abs_tol=1e-4), (name, start)
                seen.add((name, int(start)))
    assert len(seen) == 3 * 4  # every stage's layers of each leaf, across the processes
