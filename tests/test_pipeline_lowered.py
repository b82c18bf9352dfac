"""A pipelined step's `Lowered` is complete:
its report draws the schedule the program records, its estimate has the
bubble, and its layer loops unroll on the IR for the ONNX export (whose
`pipeline_stage` per node is tested in `tests/test_onnx.py`).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import functools
import math
from typing import Any

import jax
import numpy as np
import pytest
from xdsl.dialects.builtin import DictionaryAttr

import partir
from dialects.interpreter import run_function
from examples import scanned_stack
from partir.cost import Device, Link, Profile, estimate
from partir.pipeline.layer_loops import find_layer_loops
from partir.pipeline.schedule import make_schedule, recorded_schedule
from partir.report import build_report, parse_module, report_text
from rewrites.unroll import unroll
from tests.test_layer_loops import sgd_args, sgd_step


def _pipeline(microbatches: int, schedule: str) -> partir.Pipeline:
    return partir.Pipeline("stage", microbatches, schedule)


@functools.cache
def _lowered(schedule: str, stages: int = 4, microbatches: int = 4, layers: int = 4) -> Any:
    """The SGD step on a stack of 5x5 layers, pipelined over "stage"."""
    step, args = sgd_step, sgd_args(layers=layers, batch=2 * microbatches)
    jitted = partir.jit(
        step, mesh=partir.Mesh({"stage": stages}), tactics=[_pipeline(microbatches, schedule)]
    )
    return jitted.lower(*args)


@pytest.mark.parametrize("schedule", ["1f1b", pytest.param("gpipe", marks=pytest.mark.slow)])
def test_report_draws_the_schedule_the_program_records(schedule: str) -> None:
    """The report's schedule is the one the pipelining recorded on the module
    (`partir.pipeline`), so `partir-inspect` draws it from the printed SPMD
    stage too; its transfers are the program's permute pairs: 2 (S - 1) M."""
    lowered = _lowered(schedule)
    want = make_schedule(schedule, 4, 4)
    section = lowered.report().pipeline
    assert section is not None and section.axis == "stage"
    assert section.schedule == want
    assert section.transfers == want.transfers == 2 * 3 * 4
    text = str(lowered.report())
    head = (
        f'== pipeline over "stage": {schedule} schedule: 4 stages, 4 microbatches, '
        f"{want.steps} time steps, bubble {3 / 7:.1%}"
    )
    assert head in text and 'in the program 24 permute pairs on "stage"' in text
    rows = text[text.index(head) :].splitlines()
    assert rows[1].split() == ["stage", *map(str, range(want.steps))]
    for s in range(4):  # one row per stage: F<m>, B<m> or "." per time step
        cells = [str(row[s]) if row[s] else "." for row in want.table]
        assert rows[3 + s].split() == [str(s), *cells]
    again = report_text(lowered.stage("spmd"))
    assert again.pipeline == section
    assert recorded_schedule(lowered.module) == ("stage", want)
    assert lowered.report().to_json()["pipeline"]["table"][0][0] == "F0"


def test_an_unpipelined_report_has_no_schedule() -> None:
    step, args = sgd_step, sgd_args(layers=4, batch=8)
    lowered = partir.jit(
        step, mesh=partir.Mesh({"batch": 2}), tactics=[partir.BatchParallel("batch")]
    ).lower(*args)
    assert lowered.report().pipeline is None and "== pipeline" not in str(lowered.report())


# --- the estimate's bubble ------------------------------------------------------------------------

FLOPS_ONLY = Profile(
    "flops-only",
    Device({"f32": 1e12}, memory_bandwidth=1e30, memory_bytes=1e12),
    (Link("free", 64, 0.0, 1e30),),
)
"""A machine where only arithmetic takes time: a matmul's FLOPs at 1 TFLOP/s."""


def _scheduled_program(schedule: str, stages: int, microbatches: int, n: int = 64) -> str:
    """An SPMD program shaped as `partir.pipeline.program` writes one: per time
    step of the schedule a `stablehlo.case` on the stage's action (idle, a
    forward of one n x n matmul, a backward of two), then the permutes of the
    step's sends. Its stages cost the same: what the estimate must find is the
    schedule's bubble."""
    sched = make_schedule(schedule, stages, microbatches)
    ty = f"tensor<{n}x{n}xf32>"
    dot = f"contracting_dims = [1] x [0] : ({ty}, {ty}) -> {ty}"
    lines = [
        "builtin.module {",
        f'  partir.mesh @mesh ["stage" = {stages}]',
        f"  func.func public @main(%x: {ty}, %w: {ty}) -> {ty} {{",
        '    %s = spmd.axis_index over ["stage"] : tensor<i32>',
    ]
    value = "%x"
    for t, row in enumerate(sched.table):
        kinds = ", ".join("0" if a is None else "1" if a.phase == "F" else "2" for a in row)
        lines += [
            f"    %tab{t} = stablehlo.constant dense<[{kinds}]> : tensor<{stages}xi32>",
            f"    %sl{t} = stablehlo.dynamic_slice %tab{t}, %s, sizes = [1] : "
            f"(tensor<{stages}xi32>, tensor<i32>) -> tensor<1xi32>",
            f"    %k{t} = stablehlo.reshape %sl{t} : (tensor<1xi32>) -> tensor<i32>",
            f'    %c{t} = "stablehlo.case"(%k{t}) ({{',
            f"      stablehlo.return {value} : {ty}",
            "    }, {",
            f"      %f{t} = stablehlo.dot_general {value}, %w, {dot}",
            f"      stablehlo.return %f{t} : {ty}",
            "    }, {",
            f"      %g{t} = stablehlo.dot_general {value}, %w, {dot}",
            f"      %b{t} = stablehlo.dot_general %g{t}, %w, {dot}",
            f"      stablehlo.return %b{t} : {ty}",
            f"    }}) : (tensor<i32>) -> {ty}",
        ]
        value = f"%c{t}"  # what the stage holds next: what it made, or what it received
        for k, sends in enumerate((sched.sends(t, "F"), sched.sends(t, "B"))):
            if sends:
                pairs = ", ".join(f"[{s}, {r}]" for s, r, _ in sends)
                lines.append(
                    f'    %p{t}_{k} = spmd.collective_permute {value} over ["stage"] pairs '
                    f"dense<[{pairs}]> : tensor<{len(sends)}x2xi64> : {ty} -> {ty}"
                )
                value = f"%p{t}_{k}"
    lines += [f"    func.return {value} : {ty}", "  }", "}"]
    return "\n".join(lines)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (2, 2), (3, 5), (4, 2)])
def test_the_estimate_s_bubble_is_the_schedule_s_on_equal_stages(
    schedule: str, stages: int, microbatches: int
) -> None:
    """Each stage walked on its own branches, the permutes making receivers
    wait for senders: the span is (M + S - 1)(t_f + t_b), each stage busy
    M (t_f + t_b), so the bubble is (S - 1)/(M + S - 1), 1F1B's as GPipe's."""
    module = parse_module(_scheduled_program(schedule, stages, microbatches))
    est = estimate(module, FLOPS_ONLY)
    t_f = 2 * 64**3 / 1e12
    times = est.positions
    assert times is not None and times.axes == ("stage",)
    assert len(times.positions) == stages
    for busy in times.busy_seconds:
        assert math.isclose(busy, microbatches * 3 * t_f, rel_tol=1e-6)
    assert math.isclose(times.span_seconds, (microbatches + stages - 1) * 3 * t_f, rel_tol=1e-6)
    assert math.isclose(est.bubble, (stages - 1) / (microbatches + stages - 1), rel_tol=1e-6)
    assert math.isclose(est.seconds, times.span_seconds, rel_tol=1e-6)  # the last clock
    assert est.wait_seconds > 0 and "idle" in str(est.summary())


@pytest.mark.parametrize("schedule", [pytest.param("gpipe", marks=pytest.mark.slow), "1f1b"])
def test_a_pipelined_step_s_estimate_has_the_bubble(schedule: str) -> None:
    """The MLP stack's training step (4 stages, 8 microbatches, 512-wide
    layers): the estimate walks each stage on the branches it runs; its
    layers dominate, so the idle share of the span is the schedule's
    (S - 1)/(M + S - 1) less at most 5%: each step's bookkeeping (a stage
    keeping its slot, adding up its gradients) runs on every stage, idle or
    not. One device's sum with every conditional at its dearest
    branch would be no bubble at all."""
    args = scanned_stack.mlp_train_args(layers_=4, batch=64, width=512, hidden=2048)
    lowered = partir.jit(
        scanned_stack.mlp_train_step, mesh=partir.Mesh({"stage": 4}), tactics=[_pipeline(8, schedule)]
    ).lower(*args)
    est = lowered.estimate("cpu-host-8")
    assert est.positions is not None and est.positions.axes == ("stage",)
    assert 0.95 * 3 / 11 < est.bubble < 3 / 11
    span, busy = est.positions.span_seconds, est.positions.busy_seconds
    assert all(b < span for b in busy)
    assert est.seconds > span and math.isclose(
        est.seconds, est.compute_seconds + est.comm_seconds + est.wait_seconds
    )
    report = str(lowered.report("cpu-host-8"))
    assert "idle" in report and "positions over stage" in report
    # what partir-inspect estimates from the printed SPMD stage: the same
    printed = build_report(parse_module(lowered.stage("spmd")), profile=Profile.load("cpu-host-8"))
    assert printed.estimate is not None and printed.estimate.positions == est.positions


def test_1f1b_s_estimated_memory_is_below_gpipe_s() -> None:
    """The estimate's peak is the pipelined program's liveness: a stage keeps
    `Schedule.slots` microbatches' buffers, 2 under 1F1B on 2 stages against
    GPipe's 8, so 1F1B's peak is lower by 6 slots at least (each holds a
    microbatch's activation, its gradient and the head's seed: 2 rows x 5
    f32 each; the residuals come on top)."""
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        lowered = _lowered(schedule, stages=2, microbatches=8)
        peaks[schedule] = lowered.estimate("h100-8").peak_bytes
    assert make_schedule("1f1b", 2, 8).slots == 2 < make_schedule("gpipe", 2, 8).slots == 8
    slot = 3 * 2 * 5 * 4
    assert peaks["1f1b"] + 6 * slot <= peaks["gpipe"]


# --- ONNX: each node on its pipeline stage --------------------------------------------------------


def test_unrolled_layer_loops_compute_what_the_loops_did() -> None:
    """`rewrites.unroll` inlines the forward and the backward layer loop of a
    training step, their rows read and written by static slices: the
    reference interpreter gives the looped program's numbers exactly."""
    step, args = scanned_stack.mlp_train_step, scanned_stack.mlp_train_args(layers_=3, batch=4)
    looped = partir.import_jax(step, *args)
    unrolled = looped.clone()
    loops = find_layer_loops(unrolled)
    assert loops.backward is not None
    sizes = [len(ops) for loop in (loops.forward, loops.backward) for ops in unroll(unrolled, loop)]
    unrolled.verify()
    assert len(sizes) == 6 and all(sizes)
    names = {op.name for op in unrolled.walk()}
    assert not names & {"stablehlo.while", "stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice"}
    leaves = jax.tree.leaves(args)
    for got, want in zip(run_function(unrolled, leaves), run_function(looped, leaves), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_module_records_its_schedule_with_the_table() -> None:
    """`Schedule.record` writes the table; what reads it gets the same schedule
    back, and a record without its table (the request `partir-pipeline` leaves
    is `partir.pipeline_request`) is refused as malformed."""
    module = parse_module('builtin.module {\n  partir.mesh @mesh ["stage" = 3]\n}')
    assert recorded_schedule(module) is None
    want = make_schedule("1f1b", 3, 5)
    want.record(module, "stage")
    assert recorded_schedule(parse_module(str(module))) == ("stage", want)
    table = module.attributes["partir.pipeline"].data["table"]  # type: ignore[attr-defined]
    assert [row.data for row in table.data[:3]] == ["F0 . .", "F1 F0 .", "F2 F1 F0"]
    asked = {k: v for k, v in module.attributes["partir.pipeline"].data.items() if k != "table"}  # type: ignore[attr-defined]
    module.attributes["partir.pipeline"] = DictionaryAttr(asked)
    with pytest.raises(partir.PartirValueError, match=r"malformed partir\.pipeline attribute"):
        recorded_schedule(module)
