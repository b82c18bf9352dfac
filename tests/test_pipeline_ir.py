"""Pipelines on the IR (`partir.Pipeline`, `partir.pipeline.program`):
the step partitioned per microbatch by the engine, then scheduled over the
stage axis on its SPMD program. Against `jax.jit` on steps written four ways
(a plain `lax.scan`, flax's `nn.scan`, haiku's `layer_stack`, equinox's
vmapped stack), under GPipe and 1F1B; its collectives on the stage axis are
exactly the schedule's transfers; it is a `Lowered` like any other (stages
that print, parse and verify, `check=True` on the SPMD interpreter, the
report); and what it cannot pipeline gets a `PipelineError`.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import collections
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from dialects.functions import entry_function
from dialects.interpreter.spmd import run_spmd
from dialects.spmd import CollectivePermuteOp
from examples import scanned_stack
from lowering.loader import load_source
from lowering.to_jax import emit_jax
from partir.opt import main as partir_opt
from partir.pipeline.layer_loops import PipelineError
from partir.pipeline.schedule import make_schedule
from partir.report import parse_module
from partir.report.memory import XlaMemory
from tests import client_models
from tests.numerics import assert_leaves_close
from tests.test_layer_loops import sgd_args, sgd_step


def _pipeline(microbatches: int, schedule: str = "1f1b") -> partir.Pipeline:
    return partir.Pipeline("stage", microbatches, schedule)


@functools.cache
def _mlp() -> tuple[Any, tuple[Any, ...], Any]:
    step = scanned_stack.mlp_train_step
    args = scanned_stack.mlp_train_args(layers_=4, batch=16)
    return step, args, jax.jit(step)(*args)


def _transfers(lowered: partir.Lowered) -> int:
    return sum(
        len(op.source_target_pairs)
        for op in lowered.module.walk()
        if isinstance(op, CollectivePermuteOp)
    )


@pytest.mark.parametrize("schedule", [pytest.param("gpipe", marks=pytest.mark.slow), "1f1b"])
def test_the_scanned_mlp_pipelines_as_jax_jit_with_the_schedule_s_transfers(schedule: str) -> None:
    """4 stages x 2 data shards, 4 microbatches: jax.jit's loss, parameters and
    Adam state; on the stage axis only the 2 (S - 1) M permutes of the
    schedule and one all-reduce per value the last stage makes (the loss)."""
    step, args, want = _mlp()
    mesh = partir.Mesh({"stage": 4, "batch": 2})
    jitted = partir.jit(
        step, mesh=mesh, tactics=[_pipeline(4, schedule), partir.BatchParallel("batch")]
    )
    lowered = jitted.lower(*args)
    assert_leaves_close(jax.tree.leaves(jitted(*args)), jax.tree.leaves(want), what=schedule)
    assert _transfers(lowered) == 2 * (4 - 1) * 4 == make_schedule(schedule, 4, 4).transfers
    on_stage = collections.Counter(c.kind for c in lowered.collectives if "stage" in c.axes)
    assert set(on_stage) == {"collective_permute", "all_reduce"}
    assert on_stage["all_reduce"] == 1  # the loss; the stages' layers stay their own
    for arg, x in zip(_argument_types(lowered), jax.tree.leaves(args), strict=True):
        stacked = np.ndim(x) > 0 and np.shape(x)[0] == 4  # the layers (the batch is 16)
        assert ("stage" in arg.distribution.dims[0]) == stacked if np.ndim(x) else True


def _argument_types(lowered: partir.Lowered) -> list[Any]:
    return list(entry_function(lowered.module).function_type.inputs.data)


@pytest.mark.slow
def test_1f1b_holds_fewer_microbatches_than_gpipe() -> None:
    """A stage keeps microbatch m in slot m % slots (`Schedule.slots`): every
    microbatch under GPipe, about the stage count under 1F1B, so XLA's temp
    buffers per device are smaller (M = 8 on 4 stages)."""
    mesh = partir.Mesh({"stage": 4, "batch": 2})
    temps = {}
    step, args = scanned_stack.mlp_train_step, scanned_stack.mlp_train_args(layers_=8, batch=16)
    for schedule in ("gpipe", "1f1b"):
        tactics = [_pipeline(8, schedule), partir.BatchParallel("batch")]
        lowered = partir.jit(step, mesh=mesh, tactics=tactics).lower(*args)
        temps[schedule] = XlaMemory.of(lowered.compile(), args).temporaries
    assert make_schedule("1f1b", 4, 8).slots < make_schedule("gpipe", 4, 8).slots == 8
    assert temps["1f1b"] < temps["gpipe"]


def test_a_pipelined_step_is_a_lowered_like_any_other() -> None:
    """Its stages print, parse back and verify; `check=True` runs every stage on
    the interpreters (the SPMD one running each stage's own branch); the
    report names the stage axis."""
    step, args = sgd_step, sgd_args(layers=4, batch=8)
    jitted = partir.jit(
        step, mesh=partir.Mesh({"stage": 2}), tactics=[_pipeline(2, "gpipe")], check=True
    )
    got = jitted(*args)
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(step)(*args)), what="sgd")
    lowered = jitted.lower(*args)
    text = lowered.stage("spmd")
    assert "spmd.collective_permute" in text and "stablehlo.case" in text
    again = parse_module(text)
    again.verify()
    assert str(again) == text
    assert "stage=S(0)" in str(lowered.report())
    assert [s.name for s in lowered.stages] == ["import", "Pipeline", "spmd"]
    assert "BatchParallel" not in lowered.stage("Pipeline")  # the microbatch split's selections


def test_an_interleaved_step_checks_on_the_interpreters() -> None:
    """Interleaved 1F1B (2 stages x 2 virtual stages of one layer each):
    `check=True` runs it on the interpreters, each stage its own branches, as
    `jax.jit`; its report draws the table by chunk."""
    step, args = sgd_step, sgd_args(layers=4, batch=8)
    pipe = partir.Pipeline("stage", 2, "interleaved", virtual_stages=2)
    jitted = partir.jit(step, mesh=partir.Mesh({"stage": 2}), tactics=[pipe], check=True)
    got = jitted(*args)
    assert_leaves_close(jax.tree.leaves(got), jax.tree.leaves(jax.jit(step)(*args)), what="sgd")
    assert "F0v0  F1v0  F0v1" in str(jitted.lower(*args).report())


def test_batch_parallel_with_inputs_beside_a_pipeline() -> None:
    """`BatchParallel(axis, inputs=[...])` selects the data as everywhere else;
    the microbatches split what it selects."""
    step, args = sgd_step, sgd_args(layers=4, batch=16)
    tactics = [_pipeline(4), partir.BatchParallel("data", inputs=["x", "y"])]
    jitted = partir.jit(step, mesh=partir.Mesh({"stage": 2, "data": 4}), tactics=tactics)
    assert_leaves_close(
        jax.tree.leaves(jitted(*args)), jax.tree.leaves(jax.jit(step)(*args)), what="inputs="
    )
    assert _argument_types(jitted.lower(*args))[2].distribution.dims[0] == ("data",)


@pytest.mark.slow
def test_megatron_inside_each_stage() -> None:
    """The transformer stack, each stage's layers split over "model" by
    Megatron: its all-reduces run inside the stages' loops."""
    step, args = scanned_stack.train_step, scanned_stack.make_args(layers_=2, batch=4)
    tactics = [_pipeline(2), partir.Megatron("model")]
    jitted = partir.jit(step, mesh=partir.Mesh({"stage": 2, "model": 2}), tactics=tactics)
    lowered = jitted.lower(*args)
    assert_leaves_close(
        jax.tree.leaves(jitted(*args)), jax.tree.leaves(jax.jit(step)(*args)), what="megatron"
    )
    kinds = collections.Counter((c.kind, c.axes) for c in lowered.collectives)
    assert kinds[("all_reduce", ("model",))] > 0 and _transfers(lowered) == 2 * 1 * 2


LIBRARIES = {
    "flax nn.scan": ("flax", "flax_scanned_stack"),
    "haiku layer_stack": ("haiku", "haiku_layer_stack"),
    "equinox lax.scan": ("equinox", "equinox_scanned_stack"),
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("flax nn.scan", marks=pytest.mark.slow),
        pytest.param("haiku layer_stack", marks=pytest.mark.slow),
        pytest.param("equinox lax.scan", marks=pytest.mark.slow),
    ],
)
def test_each_library_s_stack_pipelines_as_jax_jit(name: str) -> None:
    """The stacks the libraries make (flax's `nn.scan` fixes its layer count
    in its code: the IR splits the loop the same way), with optax, under
    data parallelism beside the pipeline."""
    library, build = LIBRARIES[name]
    pytest.importorskip(library)
    pytest.importorskip("optax")
    client = getattr(client_models, build)()
    args = client.make_args()
    tactics = [_pipeline(2), partir.BatchParallel("batch")]
    jitted = partir.jit(client.step, mesh=partir.Mesh({"stage": 2, "batch": 2}), tactics=tactics)
    got = jitted(*args)
    assert_leaves_close(
        jax.tree.leaves(got), jax.tree.leaves(jax.jit(client.step)(*args)), what=name
    )


_MESH = partir.Mesh({"stage": 2, "data": 2})
_WITH_X = [_pipeline(2), partir.BatchParallel("data", inputs="x")]
"""The refused steps' data named (their shapes do not tell it from the state)."""


def test_a_batch_statistic_across_microbatches_is_refused() -> None:
    """Normalising each layer's activations by the whole batch's mean needs
    every microbatch at once: the error names the op and says what to do."""

    def step(p: Any, x: Any) -> Any:
        def loss(p: Any) -> Any:
            def layer(h: Any, w: Any) -> Any:
                h = jnp.tanh(h @ w)
                return h - jnp.mean(h, axis=0), None

            h, _ = jax.lax.scan(layer, x, p)
            return jnp.sum(h**2)

        return jax.grad(loss)(p)

    args = (np.ones((4, 3, 3), np.float32), np.ones((8, 3), np.float32))
    with pytest.raises(PipelineError, match="combines microbatches inside the layers"):
        partir.jit(step, mesh=_MESH, tactics=_WITH_X).lower(*args)


def test_a_per_example_result_is_refused() -> None:
    def step(p: Any, x: Any) -> Any:
        def loss(p: Any) -> Any:
            h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, p)
            return jnp.sum(h**2), h

        (_, h), g = jax.value_and_grad(loss, has_aux=True)(p)
        return g, h

    args = (np.ones((4, 3, 3), np.float32), np.ones((8, 3), np.float32))
    with pytest.raises(PipelineError, match="per-example value"):
        partir.jit(step, mesh=_MESH, tactics=_WITH_X).lower(*args)


def test_one_microbatch_and_a_taken_axis_name_are_refused() -> None:
    step, args = sgd_step, sgd_args(layers=4, batch=8)
    with pytest.raises(partir.TacticError, match="at least 2"):
        partir.jit(step, mesh=partir.Mesh({"stage": 2}), tactics=[_pipeline(1)]).lower(*args)
    mesh = partir.Mesh({"stage": 2, "microbatch": 2})
    with pytest.raises(partir.TacticError, match="rename that axis"):
        partir.jit(step, mesh=mesh, tactics=[_pipeline(2)]).lower(*args)


@pytest.mark.parametrize(
    "schedule",
    ["gpipe", pytest.param("1f1b", marks=pytest.mark.slow), "interleaved virtual_stages=2"],
)
def test_partir_opt_pipelines_the_exported_stablehlo_of_a_scanned_step(schedule, tmp_path):
    """JAX's text of the step through `partir-opt`: `partir-pipeline` splits the
    batch over microbatches, `partir-schedule-pipeline` schedules the SPMD
    stage; it parses back, runs on the SPMD interpreter equal to `jax.jit`,
    and its emitted program does too (interleaved: 2 chunks of 1 layer per
    stage, dealt by permutes)."""
    step, args = sgd_step, sgd_args(layers=4, batch=8)
    source, spmd = tmp_path / "step.mlir", tmp_path / "step.spmd.mlir"
    source.write_text(jax.jit(step).lower(*args).as_text())
    passes = (
        'inline-calls,partir-declare-mesh{axes="stage=2"},'
        f"partir-pipeline{{axis=stage microbatches=2 schedule={schedule}}},"
        "partir-lower-spmd,partir-schedule-pipeline"
    )
    assert partir_opt([str(source), "-p", passes, "-o", str(spmd)]) == 0
    module = parse_module(spmd.read_text(), str(spmd))
    want = jax.tree.leaves(jax.jit(step)(*args))
    assert_leaves_close(run_spmd(module, jax.tree.leaves(args)), want, what=f"partir-opt {schedule}")
    program = load_source(emit_jax(module, name="step"), "step")
    mesh = jax.make_mesh((2,), ("stage",), devices=jax.devices()[:2])
    placed = [
        jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
        for x, spec in zip(jax.tree.leaves(args), program.IN_SPECS, strict=True)
    ]
    assert_leaves_close(list(program.build(mesh)(*placed)), want, what="emitted")


def test_reductions_over_every_layer_in_the_update_are_completed_across_stages() -> None:
    """optax's `clip_by_global_norm` and an all-finite check reduce the stacked
    gradients over their layers: each stage reduces its own, and one
    all-reduce over the stage axis (a sum; the check's and as a min) completes it."""
    optax = pytest.importorskip("optax")
    p, x, y = sgd_args(layers=4, batch=8)
    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-2))

    def step(p: Any, state: Any, x: Any, y: Any) -> Any:
        def loss(p: Any) -> Any:
            h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x @ p["in"], p["layers"])
            return jnp.mean((h - y) ** 2)

        value, grads = jax.value_and_grad(loss)(p)
        updates, state = optimizer.update(grads, state, p)
        finite = jnp.all(jnp.isfinite(grads["layers"]))
        return value, optax.apply_updates(p, updates), state, finite

    args = (p, optimizer.init(p), x, y)
    jitted = partir.jit(step, mesh=partir.Mesh({"stage": 2}), tactics=[_pipeline(2)])
    assert_leaves_close(
        jax.tree.leaves(jitted(*args)), jax.tree.leaves(jax.jit(step)(*args)), what="clipped"
    )
    reductions = [c for c in jitted.lower(*args).collectives if c.kind == "all_reduce"]
    assert {c.axes for c in reductions} == {("stage",)}
