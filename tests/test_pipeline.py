"""Pipeline parallelism (`partir.Pipeline`): schedules as tables, the pipelined
step's numbers against `jax.jit`, its collectives read from XLA's compiled
program, its memory under GPipe and 1F1B, and clear errors on bad input.

The default profile runs the 8-layer MLP stack on {"stage": 4, "batch": 2} at
M = 8 under both schedules (numbers, collectives and memory from one
compile each); the full matrix (the MLP and transformer stacks, both meshes,
M = 4 and 8, both schedules) is `-m slow`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import socket
import subprocess
import sys
from typing import Any

import jax
import numpy as np
import pytest

import partir
from benchmarks.hlo_stats import collective_ops
from examples import scanned_stack
from partir.pipeline.engine import handed_to_update
from partir.pipeline.schedule import Action, make_schedule
from tests.numerics import assert_leaves_close

MESHES = {"stage4xbatch2": {"stage": 4, "batch": 2}, "stage8": {"stage": 8}}


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


@functools.cache
def pipelined(name: str, mesh_name: str, schedule: str, microbatches: int) -> tuple[Any, Any, Any]:
    """(lowered, executable, results) of one pipelined step: one compile each."""
    step, args, _ = program(name)
    mesh = MESHES[mesh_name]
    lowered = partir.jit(
        step, mesh=partir.Mesh(mesh), tactics=tactics(mesh, schedule, microbatches)
    ).lower(*args)
    exe, placed = lowered.executable(*args)
    return lowered, exe, lowered.unflatten(exe(*placed))


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


# --- numbers, collectives, memory -------------------------------------------------------------


def varying_axes(mesh: dict[str, int], group: tuple[int, ...]) -> set[str]:
    """The mesh axes along which a replica group's devices differ."""
    names = list(mesh)
    coords = np.array(np.unravel_index(np.arange(math.prod(mesh.values())), tuple(mesh.values()))).T
    return {names[d] for d in range(len(names)) if len({coords[i][d] for i in group}) > 1}


def check_collectives(lowered: Any, exe: Any, mesh: dict[str, int]) -> None:
    """On the stage axis: exactly the schedule's transfers of one microbatch's
    activation or gradient as collective permutes, and one all-reduce of the
    values the head hands to the update (the loss, the gradients of the
    parameters after the loop); gradient all-reduces stay on "batch"."""
    axes_of = functools.partial(varying_axes, mesh)
    data = math.prod(size for axis, size in mesh.items() if axis != "stage")
    s, sched = lowered.structure, lowered.schedule
    fwd = s.micro_forward
    act = sum(
        int(np.prod(v.aval.shape)) * v.aval.dtype.itemsize
        for v in fwd.outvars[: fwd.params["num_carry"]]
    )
    permutes = [c for c in collective_ops(exe.as_text()) if c.kind == "collective-permute"]
    pairs = [pair for c in permutes for pair in c.groups for _ in range(c.times)]
    assert (
        len(pairs) == sched.transfers * data == 2 * (sched.stages - 1) * sched.microbatches * data
    )
    assert all(axes_of(pair) == {"stage"} for pair in pairs)
    assert {c.bytes for c in permutes} == {act}
    others = [c for c in collective_ops(exe.as_text()) if c.kind != "collective-permute"]
    on_stage = [c for c in others if any("stage" in axes_of(g) for g in c.groups)]
    handed = sum(int(np.prod(v.aval.shape)) * v.aval.dtype.itemsize for v in handed_to_update(s))
    assert all(
        c.kind == "all-reduce" and all(axes_of(g) == {"stage"} for g in c.groups) for c in on_stage
    )
    assert sum(c.bytes * c.times for c in on_stage) == handed
    if data > 1:
        assert any(
            c.kind == "all-reduce" and all(axes_of(g) == {"batch"} for g in c.groups)
            for c in others
        )


def check_numbers(name: str, results: Any) -> None:
    _, _, want = program(name)
    loss, params, opt_state = results
    assert_leaves_close(loss, want[0], what=f"{name}: loss")
    assert_leaves_close(params, want[1], what=f"{name}: updated params")
    assert_leaves_close(opt_state, want[2], what=f"{name}: optimizer state")


SHARED = pytest.mark.xdist_group("pipeline")
"""The tests sharing `pipelined`'s compiles run on one worker."""


@SHARED
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_mlp_stack_matches_jit_with_data_parallelism(schedule: str) -> None:
    lowered, exe, results = pipelined("mlp", "stage4xbatch2", schedule, 8)
    check_numbers("mlp", results)
    check_collectives(lowered, exe, MESHES["stage4xbatch2"])


@SHARED
def test_one_f_one_b_holds_less_than_gpipe() -> None:
    """XLA's temp buffers per device at M = 8 on 4 stages: 1F1B keeps 4
    microbatches in flight, GPipe all 8."""
    gpipe = pipelined("mlp", "stage4xbatch2", "gpipe", 8)[1].memory_analysis()
    one_f = pipelined("mlp", "stage4xbatch2", "1f1b", 8)[1].memory_analysis()
    assert one_f.temp_size_in_bytes < gpipe.temp_size_in_bytes


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("microbatches", [4, 8])
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_matrix_matches_jit(name: str, mesh_name: str, microbatches: int, schedule: str) -> None:
    """The acceptance matrix (CI runs its MLP, stage 4 x batch 2, M = 8 corner:
    `test_mlp_stack_matches_jit_with_data_parallelism`)."""
    lowered, exe, results = pipelined(name, mesh_name, schedule, microbatches)
    check_numbers(name, results)
    check_collectives(lowered, exe, MESHES[mesh_name])


def test_call_through_partir_jit() -> None:
    """`partir.jit` runs the pipelined step like any other (2 stages, 2 microbatches)."""
    step, _, _ = program("mlp")
    args = scanned_stack.mlp_train_args(layers_=2, batch=4, width=8, hidden=16)
    mesh = partir.Mesh({"stage": 2})
    got = partir.jit(step, mesh=mesh, tactics=[partir.Pipeline("stage", 2, "gpipe")])(*args)
    assert_leaves_close(got, jax.jit(step)(*args), what="2-stage step")


# --- report and estimate -------------------------------------------------------------------------


def test_report_draws_the_schedule_and_the_estimate_has_the_bubble() -> None:
    step, args, _ = program("mlp")
    mesh = partir.Mesh({"stage": 4, "batch": 2})
    lowered = partir.jit(step, mesh=mesh, tactics=tactics(dict(mesh.axes), "1f1b", 8)).lower(*args)
    text = str(lowered.report("h100-8"))
    assert "1f1b schedule: 4 stages, 8 microbatches, 22 time steps, bubble 27.3%" in text
    assert 'transfers on "stage": 48 (2 x (stages - 1) x microbatches)' in text
    assert re.search(r'"opt_state/m/w_in" +dim 0 over "stage"\n', text)  # what splits it
    est = lowered.estimate("h100-8")
    assert math.isclose(est.bubble, 3 / 11)
    assert math.isclose(est.idle_seconds, 3 / 11 * est.loop_seconds)
    assert est.forward_seconds > 0 and est.backward_seconds > 0 and est.permute_seconds > 0
    gpipe = partir.jit(step, mesh=mesh, tactics=tactics(dict(mesh.axes), "gpipe", 8)).lower(*args)
    assert gpipe.estimate("h100-8").activation_bytes == 2 * est.activation_bytes


# --- bad input ----------------------------------------------------------------------------------


def lower(step: Any, args: Any, mesh: dict[str, int], *tactics_: partir.Tactic) -> Any:
    return partir.jit(step, mesh=partir.Mesh(mesh), tactics=list(tactics_)).lower(*args)


def test_layers_the_axis_does_not_divide() -> None:
    args = scanned_stack.mlp_train_args(layers_=6, batch=8, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError, match=r"6 layers do not split over 4 stages"):
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
    with pytest.raises(partir.PartirValueError, match=r"found no loop over stacked arguments"):
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


def test_forward_pass_alone_and_megatron_on_the_stage_axis_are_refused() -> None:
    params, x = scanned_stack.mlp_args(layers_=4, batch=8, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError, match=r"no backward loop over the layers"):
        lower(
            lambda params, x: scanned_stack.mlp_program(params, x),
            (params, x),
            {"stage": 4},
            partir.Pipeline("stage", 2),
        )
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    for other, message in [
        (partir.Megatron("stage"), r"one Megatron\(axis\) on an axis of its own"),
        (partir.ManualPartition({"x": {0: "model"}}), r"Pipeline composes with BatchParallel"),
    ]:
        with pytest.raises(partir.PartirValueError, match=message):
            lower(scanned_stack.mlp_train_step, args, {"stage": 4, "model": 2},
                  partir.Pipeline("stage", 2), other)


@SHARED
@pytest.mark.parametrize(
    "stage", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow)]
)
def test_zero_beside_the_pipeline_splits_each_stage_s_state_over_the_data_axis(
    stage: int,
) -> None:
    """Pipeline + BatchParallel + ZeRO(batch, stage): each data shard holds and
    updates its share of its stage's layers' Adam state (1), returns only its
    share of the updated layers and state (2), and holds only its share of
    the parameters, gathered for the loops (3). The stacked gradients are
    reduce-scattered over "batch" (not all-reduced); the stage axis carries
    what it did without ZeRO; the numbers are jax.jit's."""
    mesh = MESHES["stage4xbatch2"]
    step, args, _ = program("mlp")
    zero = [*tactics(mesh, "1f1b", 4), partir.ZeRO("batch", stage)]
    lowered = partir.jit(step, mesh=partir.Mesh(mesh), tactics=zero).lower(*args)
    s = lowered.structure
    assert s.optimizer_state and set(s.optimizer_state) < set(s.stacked)
    split = set(s.stacked) if stage == 3 else set(s.optimizer_state)
    for i, spec in enumerate(lowered.in_specs):
        want = (("stage", "batch"),) if i in split else (("stage",) if i in s.stacked else ())
        assert tuple(spec) == want, s.arg_names[i]
    for i, spec in enumerate(lowered.out_specs):
        if i in s.stacked_results:
            assert tuple(spec) == ((("stage", "batch"),) if stage >= 2 else ("stage",))
    exe, placed = lowered.executable(*args)
    check_numbers("mlp", lowered.unflatten(exe(*placed)))
    plain, _, _ = pipelined("mlp", "stage4xbatch2", "1f1b", 4)
    ops = collective_ops(exe.as_text())
    scattered = [c for c in ops if c.kind == "reduce-scatter"]
    assert len(scattered) == len(s.stacked) - len(s.optimizer_state)  # one per stacked gradient
    plain_exe, _ = plain.executable(*args)
    permutes = [c for c in ops if c.kind == "collective-permute"]
    assert permutes == [
        c for c in collective_ops(plain_exe.as_text()) if c.kind == "collective-permute"
    ]
    saved = plain_exe.memory_analysis().argument_size_in_bytes - (
        exe.memory_analysis().argument_size_in_bytes
    )
    share = sum(
        math.prod(x.shape) * x.dtype.itemsize // 4  # a stage's share, halved over "batch"
        for i, x in enumerate(jax.tree.leaves(args)) if i in split
    ) // 2
    assert saved == share
    # the estimate holds a stage's share too
    assert plain.estimate("cpu-host-8").parameter_bytes - (
        lowered.estimate("cpu-host-8").parameter_bytes
    ) == share


@pytest.mark.parametrize(("name", "mesh", "schedule"), [
    ("mlp", {"stage": 4, "model": 2}, "1f1b"),
    pytest.param("block", {"stage": 2, "batch": 2, "model": 2}, "gpipe", marks=pytest.mark.slow),
])
def test_megatron_inside_a_stage(name: str, mesh: dict[str, int], schedule: str) -> None:
    """Pipeline + Megatron(model) (+ BatchParallel): each stage's layers split
    over "model" as Megatron splits them (their Adam state with them); the
    loops' bodies and the update partitioned by partir; the numbers are
    jax.jit's, the stage axis carries only the schedule's permutes (and the
    head's all-reduce), and the model axis carries the loops' all-reduces."""
    step, args, _ = program(name)
    chosen = [*tactics(mesh, schedule, 4), partir.Megatron("model")]
    lowered = partir.jit(step, mesh=partir.Mesh(mesh), tactics=chosen).lower(*args)
    s = lowered.structure
    split = {s.arg_names[i] for i, spec in enumerate(lowered.in_specs) if "model" in spec}
    assert split and split <= {s.arg_names[i] for i in s.stacked}
    assert any(n.startswith("opt_state") for n in split)  # the state follows its parameters
    exe, placed = lowered.executable(*args)
    check_numbers(name, lowered.unflatten(exe(*placed)))
    axes_of = functools.partial(varying_axes, mesh)

    ops = collective_ops(exe.as_text())
    pairs = [p for c in ops if c.kind == "collective-permute" for p in c.groups for _ in range(c.times)]
    sched = lowered.schedule
    assert len(pairs) == 2 * (sched.stages - 1) * sched.microbatches * math.prod(mesh.values()) // (
        sched.stages
    )
    assert all(axes_of(pair) == {"stage"} for pair in pairs)
    on_stage = [c for c in ops if c.kind != "collective-permute"
                and any("stage" in axes_of(g) for g in c.groups)]
    assert all(c.kind == "all-reduce" for c in on_stage)
    assert any(c.kind == "all-reduce" and all(axes_of(g) == {"model"} for g in c.groups)
               for c in ops)
    # the estimate holds a stage's model shard of the split leaves, and times the
    # loops split (their all-reduces over "model" included)
    plain = partir.jit(step, mesh=partir.Mesh(mesh), tactics=chosen[:-1]).lower(*args)
    mine, whole = lowered.estimate("h100-8"), plain.estimate("h100-8")
    assert mine.parameter_bytes < whole.parameter_bytes
    assert mine.forward_seconds != whole.forward_seconds


def _bytes_per_device(lowered: Any, args: Any, mesh: dict[str, int], leaves: set[int]) -> int:
    """What `leaves` take on one device under `lowered`'s input specs."""
    total = 0
    for i, x in enumerate(jax.tree.leaves(args)):
        if i in leaves:
            spec = lowered.in_specs[i]
            axes = [a for entry in spec if entry for a in (entry if isinstance(entry, tuple) else (entry,))]
            total += math.prod(x.shape) * x.dtype.itemsize // math.prod(mesh[a] for a in axes)
    return total


@pytest.mark.parametrize(("name", "stage", "schedule"), [
    ("mlp", 2, "1f1b"),
    pytest.param("block", 1, "gpipe", marks=pytest.mark.slow),
    pytest.param("block", 3, "1f1b", marks=pytest.mark.slow),
])
def test_megatron_and_zero_beside_the_pipeline(name: str, stage: int, schedule: str) -> None:
    """Pipeline + BatchParallel + Megatron(model) + ZeRO(batch, stage) on
    2x2x2: a stage's layers (and their Adam state) split over "model" as
    Megatron splits them, and ZeRO's leaves split again over "batch" on the
    layer dim; the numbers are jax.jit's; the stacked gradients are
    reduce-scattered over "batch" alone; the stage axis carries only the
    schedule's permutes and the head's all-reduces; a device holds exactly
    half of what Megatron alone left it of ZeRO's leaves, and so does the
    estimate."""
    mesh = {"stage": 2, "batch": 2, "model": 2}
    step, args, _ = program(name)
    megatron = [*tactics(mesh, schedule, 4), partir.Megatron("model")]
    chosen = [*megatron, partir.ZeRO("batch", stage)]
    lowered = partir.jit(step, mesh=partir.Mesh(mesh), tactics=chosen).lower(*args)
    alone = partir.jit(step, mesh=partir.Mesh(mesh), tactics=megatron).lower(*args)
    s = lowered.structure
    split = set(s.stacked) if stage == 3 else set(s.optimizer_state)
    for i, (mine, theirs) in enumerate(zip(lowered.in_specs, alone.in_specs, strict=True)):
        want = (("stage", "batch"), *tuple(theirs)[1:]) if i in split else tuple(theirs)
        assert tuple(mine) == want, s.arg_names[i]
    assert any("model" in spec for i, spec in enumerate(lowered.in_specs) if i in split)
    exe, placed = lowered.executable(*args)
    check_numbers(name, lowered.unflatten(exe(*placed)))
    axes_of = functools.partial(varying_axes, mesh)

    ops = collective_ops(exe.as_text())
    scattered = [c for c in ops if c.kind == "reduce-scatter"]
    assert scattered and all(axes_of(g) == {"batch"} for c in scattered for g in c.groups)
    assert all(axes_of(g) == {"stage"} for c in ops if c.kind == "collective-permute"
               for g in c.groups)
    assert all(c.kind in ("all-reduce", "collective-permute") for c in ops
               if any("stage" in axes_of(g) for g in c.groups))
    assert any(c.kind == "all-reduce" and all(axes_of(g) == {"model"} for g in c.groups)
               for c in ops)
    alone_exe, _ = alone.executable(*args)
    saved = alone_exe.memory_analysis().argument_size_in_bytes - (
        exe.memory_analysis().argument_size_in_bytes
    )
    assert saved == _bytes_per_device(alone, args, mesh, split) // 2
    assert alone.estimate("h100-8").parameter_bytes - (
        lowered.estimate("h100-8").parameter_bytes
    ) == saved
    assert re.search(r'"opt_state/\S+" +dim 0 over "stage" x "batch", dim \d over "model"\n',
                     str(lowered.report()))


def test_zero_beside_a_pipeline_is_on_the_data_axis_with_its_default_selectors() -> None:
    args = scanned_stack.mlp_train_args(layers_=8, batch=16, width=8, hidden=8)
    mesh = {"stage": 4, "batch": 2}
    for other, message in [
        (partir.ZeRO("batch", 3, opt_state="opt_state/m/**"), r"with the default selectors"),
        (partir.ZeRO("stage", 1), r"one ZeRO\(axis, stage\) on its BatchParallel's axis"),
    ]:
        with pytest.raises(partir.PartirValueError, match=message):
            lower(scanned_stack.mlp_train_step, args, mesh, partir.Pipeline("stage", 2),
                  partir.BatchParallel("batch"), other)
    uneven = scanned_stack.mlp_train_args(layers_=4, batch=16, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError, match=r"each stage's 1 layers do not split over 2"):
        lower(scanned_stack.mlp_train_step, uneven, mesh, partir.Pipeline("stage", 2),
              partir.BatchParallel("batch"), partir.ZeRO("batch", 1))


LAYERS = 8


@jax.jit  # the loop inside a call: the jaxpr replayed at a stage's layers inlines it
def _fixed_length_stack(blocks: Any, x: Any) -> Any:
    """`mlp_program` with the scan's length fixed, as flax's `nn.scan(length=...)` does."""
    step = lambda h, p: (scanned_stack.mlp_layer(p, h), None)  # noqa: E731
    return jax.lax.scan(step, x, blocks, length=LAYERS)[0]


def test_step_that_fixes_its_layer_count_runs_as_its_jaxpr_at_each_stage() -> None:
    """Called with a stage's layers the step fails (`lax.scan` gets length 8 and
    4 layers); Pipeline runs its jaxpr there instead (`partir.pipeline.replay`:
    each scan takes its length from its stacked operands), so it pipelines with
    jax.jit's numbers, ZeRO-3 included."""

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
        lowered = lower(step, args, mesh, partir.Pipeline("stage", 2), partir.BatchParallel("batch"),
                        *more)
        stacked = {i for i, a in enumerate(jax.tree.leaves(args[:2])) if np.ndim(a) > 0}
        assert set(lowered.structure.stacked) == stacked  # all but Adam's count
        exe, placed = lowered.executable(*args)
        assert_leaves_close(jax.tree.leaves(lowered.unflatten(exe(*placed))), jax.tree.leaves(want),
                            what=f"fixed-length scan, {more}")


def test_step_that_fixes_its_layer_count_in_a_shape_is_refused() -> None:
    """A reshape to the whole stack's size cannot run at a stage's layers, as
    called or as its jaxpr: the error says the step fixes a size it cuts."""

    def step(params, opt_state, x, y):
        flat = params["w_in"].reshape(LAYERS, -1)  # fixes the layer count in a shape
        scale = 1 + 0 * flat.sum(1).reshape(LAYERS, 1, 1)
        params = {**params, "w_in": params["w_in"] * scale}
        return scanned_stack.adam_step(scanned_stack.mlp_loss, params, opt_state, x, y)

    args = scanned_stack.mlp_train_args(layers_=LAYERS, batch=16, width=8, hidden=8)
    with pytest.raises(partir.PartirValueError,
                       match=r"with one stage's 4 layers: tracing the step .* failed .*take "
                             r"those sizes from the arguments' shapes"):
        lower(step, args, {"stage": 2}, partir.Pipeline("stage", 2))


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


@pytest.mark.parametrize("zero", [0, 1])
def test_update_reducing_over_all_layers_sums_the_stages(zero: int) -> None:
    """A global gradient norm and an all-finite check read every layer: each
    stage reduces its own layers and the stages' partials are combined (over
    the data axis too when ZeRO splits the layers there); jax.jit's numbers."""
    args = scanned_stack.mlp_train_args(layers_=LAYERS, batch=16, width=8, hidden=8)
    more = [partir.ZeRO("batch", zero)] if zero else []
    lowered = lower(_clipped_step, args, {"stage": 4, "batch": 2}, partir.Pipeline("stage", 2),
                    partir.BatchParallel("batch"), *more)
    combines = sorted(lowered.structure.across_layers.values())
    assert combines == ["min"] * 3 + ["sum"] * 3  # per stacked gradient: all finite, squares
    exe, placed = lowered.executable(*args)
    assert_leaves_close(jax.tree.leaves(lowered.unflatten(exe(*placed))),
                        jax.tree.leaves(jax.jit(_clipped_step)(*args)), what="clipped step")
    megatron = partir.Megatron("model", column=["params/w_in", "params/b_in"], row=["params/w_out"])
    with pytest.raises(partir.PartirValueError, match=r"the update reduces over the layers"):
        lower(_clipped_step, args, {"stage": 4, "model": 2}, partir.Pipeline("stage", 2), megatron)


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
    assert "sum" in lowered.structure.across_layers.values()
    exe, placed = lowered.executable(*args)
    assert_leaves_close(jax.tree.leaves(lowered.unflatten(exe(*placed))),
                        jax.tree.leaves(jax.jit(step)(*args)), what="optax clipped AdamW")


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
    assert sorted(lowered.structure.across_layers.values()) == ["max"] * 3 + ["sum"]
    exe, placed = lowered.executable(*args)
    assert_leaves_close(jax.tree.leaves(lowered.unflatten(exe(*placed))),
                        jax.tree.leaves(jax.jit(step)(*args)), what="metrics step")


MIXES = r"combines the layers of a stacked value"


def _layer_index(v: Any) -> Any:
    return v * jax.numpy.arange(v.shape[0]).reshape(-1, *[1] * (v.ndim - 1))


@pytest.mark.parametrize(("mix", "message"), [
    pytest.param(lambda v: v[::-1], MIXES, id="reversed"),
    pytest.param(lambda v: jax.numpy.cumsum(v, axis=0), MIXES, id="cumsum"),
    pytest.param(lambda v: jax.numpy.roll(v, 1, axis=0), MIXES, id="roll"),
    pytest.param(lambda v: jax.numpy.tensordot(jax.numpy.ones(v.shape[0]), v, 1) + v, MIXES,
                 id="contract"),
    pytest.param(_layer_index, r"`iota` outside the layer loop makes a value along the layers",
                 id="layer-index"),
])
def test_update_mixing_layers_is_refused(mix: Any, message: str) -> None:
    """An update that moves, scans or contracts along the layers, or numbers
    them, would be wrong on a stage that holds only its own: refused, never run."""

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
    ("batch-norm", "mse", r"the layer loop reads across the examples of the batch"),
    ("dropout", "mse", r"reads across the examples of the batch \(`random_bits`"),
    ("plain", "contrastive", r"the gradient the loss hands the layer loop for one example reads"),
    pytest.param("plain", "batch-scaled",
                 r"the gradient the loss hands the layer loop for one example reads",
                 marks=pytest.mark.slow),
    pytest.param("plain", "shifted",
                 r"the gradient the loss hands the layer loop for one example reads",
                 marks=pytest.mark.slow),
])
def test_steps_whose_examples_depend_on_each_other_are_refused(
    layer_kind: str, loss_kind: str, message: str
) -> None:
    """Microbatching changes a batch statistic inside the loop, a dropout mask
    drawn there for the whole batch, and a loss that pairs or scales examples
    by the batch: refused (they used to run, wrong); the same step with none
    runs and matches jax.jit. The 1-row microbatch (M = 8) is checked against
    a 2-row trace, since one row traces apart."""
    args = scanned_stack.mlp_train_args(layers_=4, batch=8, width=8, hidden=8)
    for microbatches in (2, 8):
        with pytest.raises(partir.PartirValueError, match=message):
            lower(_rows_step(layer_kind, loss_kind), args, {"stage": 4},
                  partir.Pipeline("stage", microbatches))
    plain = _rows_step("plain", "mse")
    lowered = lower(plain, args, {"stage": 4}, partir.Pipeline("stage", 8))
    exe, placed = lowered.executable(*args)
    assert_leaves_close(jax.tree.leaves(lowered.unflatten(exe(*placed))),
                        jax.tree.leaves(jax.jit(plain)(*args)), what="per-example step")


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
    exe, placed = lowered.executable(*args)
    assert_leaves_close(jax.tree.leaves(lowered.unflatten(exe(*placed))),
                        jax.tree.leaves(jax.jit(step)(*args)), what="cross-entropy step")
    with pytest.raises(partir.PartirValueError, match=r"for one example reads other examples"):
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
