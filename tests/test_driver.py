"""The schedule driver and its module state: one planning, keyed lazy stages,
the CLI passes generated from the tactics, conflicts recorded by propagation."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline

import partir
import partir.passes
from dialects.context import make_context
from dialects.functions import entry_function
from dialects.interpreter import run_function
from examples import mlp_train_step, stack_train_step
from lowering.to_jax import emit_jax
from partir.partition import Stage
from partir.passes import PASSES, TACTIC_PASSES, TilePass
from partir.report import parse_module
from partir.tactics import TACTICS, Plan, ProgramView
from rewrites.conflicts import Conflict, recorded_conflicts
from rewrites.propagation import PropagatePass
from tests.numerics import assert_close

MESH = partir.Mesh({"batch": 4, "model": 2})
CTX = make_context()


def _mlp():
    return partir.import_jax(mlp_train_step.program, *mlp_train_step.make_args())


def test_every_tactic_field_is_an_option_of_its_pass():
    for tactic in TACTICS:
        cls = PASSES[tactic.CLI_NAME]()
        assert cls is TACTIC_PASSES[tactic]
        options = [f.name for f in dataclasses.fields(cls) if f.init]
        fields = [f for f in dataclasses.fields(tactic) if f.metadata.get("pass_option", True)]
        assert options == [f.name for f in fields], tactic.__name__


@pytest.mark.parametrize(("spec", "tactic"), [
    ("partir-batch-parallel{axis=batch dim=1 inputs=x,y}",
     partir.BatchParallel("batch", inputs=("x", "y"), dim=1)),
    ('partir-zero{axis=batch stage=2 params="params/w1" opt_state="opt_state/m/**","opt_state/v/**"'
     ' updates="result/1/**"}',
     partir.ZeRO("batch", 2, params=("params/w1",), opt_state=("opt_state/m/**", "opt_state/v/**"),
                 updates=("result/1/**",))),
    ('partir-megatron{axis=model column="params/w1" column_bias="params/b1" row="params/w2"}',
     partir.Megatron("model", column=("params/w1",), column_bias=("params/b1",),
                     row=("params/w2",))),
    ("partir-megatron{axis=model}", partir.Megatron("model")),
    ('partir-auto{axes=model time-budget-s=5.0 memory-limit-bytes=1000000 profile="h100-8" seed=2}',
     partir.Automatic(axes=("model",), time_budget_s=5.0, memory_limit_bytes=1000000,
                      profile="h100-8", seed=2)),
    ('partir-manual-partition{spec="x:0=batch","params/w1:1=model","params/w1:0=batch"}',
     partir.ManualPartition({"x": {0: "batch"}, "params/w1": {1: "model", 0: "batch"}})),
])
def test_cli_options_mean_the_python_options(spec, tactic):
    (cli,) = PassPipeline.parse_spec(PASSES, spec).passes
    assert cli.tactic() == tactic


def test_a_cli_tactic_pass_rewrites_as_the_python_tactic_does():
    tactic = partir.ZeRO("batch", 2, params=("params/w1",), updates=("result/1/**",))
    by_python = _mlp()
    partir.partition(by_python, partir.Mesh({"batch": 4}), [tactic])
    by_cli = _mlp()
    spec = ('partir-declare-mesh{axes="batch=4"},'
            'partir-zero{axis=batch stage=2 params="params/w1" updates="result/1/**"}')
    PassPipeline.parse_spec(PASSES, spec).apply(CTX, by_cli)
    assert str(by_cli) == str(by_python)


def test_plan_is_pure_and_partition_plans_once(monkeypatch):
    module = _mlp()
    view = ProgramView.of(entry_function(module))
    zero = partir.ZeRO("batch", 3)
    plan = zero.plan(view, MESH)
    assert isinstance(plan, Plan) and plan == zero.plan(view, MESH)
    assert zero == partir.ZeRO("batch", 3)  # the tactic is unchanged
    calls = []
    original = partir.ZeRO.plan
    monkeypatch.setattr(partir.ZeRO, "plan", lambda self, *a: calls.append(self) or original(self, *a))
    done = partir.partition(module, MESH, [partir.BatchParallel("batch"), zero])
    assert calls == [zero]
    assert done.plans[1] == plan


def _two_manual_partitions():
    return [partir.ManualPartition({"x": {0: "batch"}}),
            partir.Megatron("model"),
            partir.ManualPartition({"params/w2": {0: "model"}, "params/w1": {1: "model"}})]


def test_two_tactics_of_one_class_reach_distinct_stages():
    fn = partir.jit(mlp_train_step.program, mesh=MESH, tactics=_two_manual_partitions())
    lowered = fn.lower(*mlp_train_step.make_args())
    names = [s.name for s in lowered.stages]
    assert names == ["import", "ManualPartition", "Megatron", "ManualPartition#2", "spmd"]
    assert lowered.stage("ManualPartition") != lowered.stage("ManualPartition#2")
    assert 'partir.loop "model"' not in lowered.stage("ManualPartition")
    assert 'partir.loop "model"' in lowered.stage("ManualPartition#2")
    assert lowered.stage(3) == lowered.stage("ManualPartition#2") == lowered.stage(-2)
    with pytest.raises(KeyError, match=r"no stage 'ZeRO'; the stages are \['import', "):
        lowered.stage("ZeRO")
    with pytest.raises(IndexError, match="no stage 5; there are 5 stages"):
        lowered.stage(5)


def test_stages_are_snapshots_printed_when_read():
    fn = partir.jit(mlp_train_step.program, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    lowered = fn.lower(*mlp_train_step.make_args())
    assert not any("text" in vars(s) for s in lowered.stages)  # nothing printed yet
    imported = lowered.stage("import")
    assert "partir.loop" not in imported and "partir.loop" in lowered.stage("BatchParallel")
    assert imported == str(_with_mesh(_mlp(), MESH))  # the IR as it was after the import
    assert lowered.stages[-1].module is lowered.module


def _with_mesh(module: ModuleOp, mesh: partir.Mesh) -> ModuleOp:
    partir.passes.declare_mesh(module, mesh)
    return module


def test_a_stage_snapshot_does_not_follow_later_rewrites():
    module = _mlp()
    stage = Stage.snapshot("import", module)
    partir.partition(module, MESH, [partir.BatchParallel("batch")])
    assert "partir.loop" in str(module) and "partir.loop" not in stage.text


def test_lower_emits_once_and_takes_the_output_tree_from_the_import(monkeypatch):
    emitted = []
    monkeypatch.setattr(partir.passes, "emit_jax",
                        lambda module, name: emitted.append(name) or emit_jax(module, name=name))
    monkeypatch.setattr(jax, "eval_shape", lambda *a, **k: pytest.fail("traced twice"))
    args = mlp_train_step.make_args()
    fn = partir.jit(mlp_train_step.program, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    lowered = fn.lower(*args)
    assert emitted == ["program"] and 'from the SPMD module "program"' in lowered.source
    got = lowered.compile()(*args)
    want = jax.jit(mlp_train_step.program)(*args)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)


def test_partir_opt_writes_the_source_its_emit_pass_made(tmp_path):
    from partir.opt import main

    text = partir.jit(lambda x: x * 2, mesh=partir.Mesh({"batch": 4}),
                      tactics=[partir.BatchParallel("batch")]).lower(np.ones((8, 4))).stage(0)
    path = tmp_path / "in.mlir"
    path.write_text(text)
    out = tmp_path / "out.py"
    assert main([str(path), "-p", "partir-batch-parallel{axis=batch},partir-lower-spmd,"
                 "partir-emit-jax{program=doubled}", "-o", str(out)]) == 0
    assert 'from the SPMD module "doubled"' in out.read_text()


CONFLICTING = """func.func @main(%x: tensor<8x8xf32> {partir.name = "x"}, %y: tensor<8x8xf32> {partir.name = "y"}) -> tensor<8x8xf32> {
  %s = stablehlo.add %x, %y : tensor<8x8xf32>
  func.return %s : tensor<8x8xf32>
}
"""


def test_propagate_alone_records_the_conflicts_it_finds():
    module = parse_module(CONFLICTING)
    partir.passes.declare_mesh(module, partir.Mesh({"x": 4}))
    TilePass("x", 0, "x").apply(CTX, module)
    TilePass("y", 1, "x").apply(CTX, module)
    assert recorded_conflicts(module) == []  # tiling alone finds nothing
    PropagatePass().apply(CTX, module)
    (conflict,) = recorded_conflicts(module)
    assert conflict == Conflict(
        "stablehlo.add", ("x", "y"), "x", "action 1 (partir-tile of x)",
        "action 2 (partir-tile of y)",
        "operand 0 is tiled on dim 0, operand 1 on dim 1; the loser is redistributed")
    PropagatePass().apply(CTX, module)
    assert recorded_conflicts(module) == [conflict]  # recorded once
    reparsed = parse_module(str(module))  # a typed attribute: it prints and parses back
    assert recorded_conflicts(reparsed) == [conflict]


def test_the_report_does_not_import_the_pass_registry():
    import subprocess
    import sys

    code = "import sys, partir.report; print('partir.passes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


TWO_PUBLIC = """partir.mesh @mesh ["x" = 2]
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
func.func @other(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
"""


def test_every_stage_finds_the_entry_function_the_same_way():
    module = parse_module(TWO_PUBLIC)
    message = "expected one public func.func in the module, found @main, @other"
    for find in (entry_function, lambda m: run_function(m, [np.ones(4, np.float32)]),
                 emit_jax):
        with pytest.raises(Exception, match=message):
            find(module)


def test_stack_step_partitions_with_two_zero_stages():
    """A bigger schedule with a repeated tactic runs end to end on numbers."""
    args = stack_train_step.make_args(layers_=1)
    tactics = [partir.BatchParallel("batch"), partir.ZeRO("batch", 1), partir.Megatron("model"),
               partir.ZeRO("batch", 3)]
    fn = partir.jit(stack_train_step.program, mesh=MESH, tactics=tactics)
    lowered = fn.lower(*args)
    assert [s.name for s in lowered.stages][1:-1] == ["BatchParallel", "ZeRO", "Megatron", "ZeRO#2"]
    got = jax.tree_util.tree_leaves(lowered.compile()(*args))
    want = jax.tree_util.tree_leaves(jax.jit(stack_train_step.program)(*args))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(np.asarray(g), np.asarray(w), what=f"leaf {i}")
