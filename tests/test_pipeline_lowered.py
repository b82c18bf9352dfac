"""A pipelined step's `Lowered` is complete (`Pipeline(..., engine="ir")`):
its report draws the schedule the program records, its estimate has the
bubble, and its ONNX export places each node on its pipeline stage.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import functools
from typing import Any

import pytest

import partir
from partir.pipeline.schedule import make_schedule, recorded_schedule
from partir.report import report_text
from tests.test_layer_loops import sgd_args, sgd_step


def _pipeline(microbatches: int, schedule: str) -> partir.Pipeline:
    return partir.Pipeline("stage", microbatches, schedule, engine="ir")


@functools.cache
def _lowered(schedule: str, stages: int = 4, microbatches: int = 4, layers: int = 4) -> Any:
    """The SGD step on a stack of 5x5 layers, pipelined over "stage"."""
    step, args = sgd_step, sgd_args(layers=layers, batch=2 * microbatches)
    jitted = partir.jit(
        step, mesh=partir.Mesh({"stage": stages}), tactics=[_pipeline(microbatches, schedule)]
    )
    return jitted.lower(*args)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
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
        f'== pipeline over "stage": {schedule} schedule, 4 stages, 4 microbatches, '
        f"{want.steps} time steps, bubble {3 / 7:.1%}"
    )
    assert head in text
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
