"""Tactics + propagation on the example programs, checked on numbers and structure."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType

import partir
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.parser import PartirParser
from dialects.partir import LoopOp, OriginAttr, SumAttr
from examples import (
    block_forward,
    block_train_step,
    cross_entropy,
    mlp_forward,
    mlp_train_step,
    stack_train_step,
)
from lowering.to_spmd import input_slices
from partir.importer import entry_function
from rewrites.propagation import propagate
from tests.numerics import assert_leaves_close
from tests.partitioning import MESH, enclosing_loop_axes, loop_counts, partition_and_check

BATCH = 12  # a size no other dimension of the test programs has


def _defining_loops(value) -> set[LoopOp]:
    """Loops reached from `value` through its producers, not entering loops."""
    seen, found, stack = set(), set(), [value]
    while stack:
        v = stack.pop()
        owner = v.owner
        if isinstance(owner, LoopOp):
            found.add(owner)
        elif hasattr(owner, "operands") and owner not in seen:
            seen.add(owner)
            stack.extend(owner.operands)
    return found


def test_mlp_train_step_batch_parallel():
    args = mlp_train_step.make_args(batch=BATCH)
    mesh = partir.Mesh({"batch": 4})
    result = partition_and_check(mlp_train_step.program, args, [partir.BatchParallel("batch")],
                                 mesh)
    module = result.module
    # Every op that still has the batch dimension runs inside a loop over "batch".
    for op in module.walk():
        if op.name.startswith("stablehlo.") and "batch" not in enclosing_loop_axes(op):
            for v in (*op.operands, *op.results):
                if isinstance(v.type, TensorType):
                    assert BATCH not in v.type.get_shape(), f"{op.name} sees the whole batch"
    # Each updated parameter is computed from a sum loop over "batch" (its gradient).
    ret = entry_function(module).body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    for value in ret.arguments[1:]:
        loops = _defining_loops(value)
        assert any(isinstance(lp.action, SumAttr) and lp.axis_name == "batch" for lp in loops)
    assert result.conflicts == []


def test_mlp_forward_megatron_has_one_sum():
    result = partition_and_check(mlp_forward.program, mlp_forward.make_args(),
                                 [partir.Megatron("model")])
    assert loop_counts(result.module)[("model", "sum")] == 1
    dots = [op for op in result.module.walk() if op.name == "stablehlo.dot_general"]
    assert len(dots) == 2 and all(enclosing_loop_axes(d) == ["model"] for d in dots)


def test_mlp_train_step_megatron():
    result = partition_and_check(mlp_train_step.program, mlp_train_step.make_args(),
                                 [partir.Megatron("model")])
    assert loop_counts(result.module)[("model", "sum")] >= 1


def test_mlp_train_step_batch_then_megatron():
    args = mlp_train_step.make_args(batch=BATCH)
    result = partition_and_check(mlp_train_step.program, args,
                                 [partir.BatchParallel("batch"), partir.Megatron("model")])
    counts = loop_counts(result.module)
    assert counts[("batch", "sum")] >= 4 and counts[("model", "sum")] >= 1


def test_block_forward_megatron_has_exactly_two_sums():
    """Attention output projection and the MLP's second matmul; nothing else."""
    result = partition_and_check(block_forward.program, block_forward.make_args(),
                                 [partir.Megatron("model")])
    # Each half of the block fuses into one loop: exactly two loops, both sums.
    assert loop_counts(result.module) == {("model", "sum"): 2}


def test_block_forward_batch_then_megatron():
    result = partition_and_check(block_forward.program, block_forward.make_args(),
                                 [partir.BatchParallel("batch"), partir.Megatron("model")])
    counts = loop_counts(result.module)
    assert counts[("model", "sum")] == 2
    assert counts[("batch", "sum")] == 0 and counts[("batch", "tile")] >= 1
    # The model sums run per batch shard: nested inside the batch loops.
    for op in result.module.walk():
        if isinstance(op, LoopOp) and op.axis_name == "model" and isinstance(op.action, SumAttr):
            assert enclosing_loop_axes(op) == ["batch"]


def test_block_train_step_batch_then_megatron():
    args = block_train_step.make_args()
    result = partition_and_check(block_train_step.program, args,
                                 [partir.BatchParallel("batch"), partir.Megatron("model")])
    counts = loop_counts(result.module)
    assert counts[("batch", "sum")] >= 16  # one gradient (at least) per parameter
    assert counts[("model", "sum")] >= 4  # 2 forward + the backward of q/k/v and w_in
    origins = {op.origin.tactic.data for op in result.module.walk()
               if isinstance(op, LoopOp) and op.origin is not None}
    assert origins == {"BatchParallel", "Megatron"}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_block_train_step_zero(stage: int):
    args = block_train_step.make_args(batch=4)
    mesh = partir.Mesh({"batch": 4})
    result = partition_and_check(block_train_step.program, args,
                                 [partir.BatchParallel("batch"), partir.ZeRO("batch", stage)],
                                 mesh)
    zero_loops = [op for op in result.module.walk()
                  if isinstance(op, LoopOp) and op.origin is not None
                  and op.origin.tactic.data == "ZeRO"]
    assert zero_loops
    if stage == 3:
        # Parameters are tiled over "batch" before their (whole) use.
        entry = entry_function(result.module)
        params = [a for a, d in zip(entry.body.block.args, entry.arg_attrs.data, strict=True)
                  if d.data["partir.name"].data.startswith("params")]
        assert all(any(isinstance(u.operation, LoopOp | type(None)) or
                       u.operation.name == "partir.slice" for u in p.uses) for p in params)


def test_mlp_train_step_zero3_with_sgd():
    args = mlp_train_step.make_args(batch=BATCH)
    result = partition_and_check(mlp_train_step.program, args,
                                 [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)],
                                 partir.Mesh({"batch": 4}))
    assert loop_counts(result.module)[("batch", "sum")] >= 4


def test_cross_entropy_batch_parallel_goes_through_gather():
    args = cross_entropy.make_args(batch=BATCH)
    result = partition_and_check(cross_entropy.program, args, [partir.BatchParallel("batch")],
                                 partir.Mesh({"batch": 4}))
    gathers = [op for op in result.module.walk() if op.name == "stablehlo.gather"]
    assert gathers and all("batch" in enclosing_loop_axes(g) for g in gathers)


def test_conflict_is_recorded_and_the_earlier_action_wins():
    def add(x, y):
        return jnp.tanh(x) + y

    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    y = np.ones((8, 8), np.float32)
    spec = partir.ManualPartition({"x": {0: "batch"}, "y": {1: "batch"}})
    result = partition_and_check(add, (x, y), [spec], partir.Mesh({"batch": 4}))
    assert len(result.conflicts) == 1
    conflict = result.conflicts[0]
    assert conflict.op == "stablehlo.add" and conflict.axis == "batch"
    assert conflict.values == ("x", "y")
    assert conflict.winner == "action 1 (ManualPartition of x)"
    assert conflict.loser == "action 2 (ManualPartition of y)"
    # The add was tiled on dim 0, x's dim: the earlier action won.
    adds = [op for op in result.module.walk() if op.name == "stablehlo.add"]
    assert adds and all(enclosing_loop_axes(op) == ["batch"] for op in adds)
    parent = adds[0].parent_op()
    assert isinstance(parent, LoopOp) and parent.action.dim.data == 0  # type: ignore[union-attr]


def test_a_value_wanting_one_axis_on_two_dims_is_a_conflict():
    def f(x):
        return jnp.exp(x)

    x = np.ones((8, 8), np.float32)
    # (in one ManualPartition entry this is refused outright: see test_bad_inputs)
    first, later = partir.ManualPartition({"x": {0: "batch"}}), partir.ManualPartition({"x": {1: "batch"}})
    result = partition_and_check(f, (x,), [first, later], partir.Mesh({"batch": 4}))
    assert len(result.conflicts) == 1
    assert "already tiled on dim 0, asked for dim 1" in result.conflicts[0].detail


def test_propagation_is_idempotent_and_deterministic():
    args = stack_train_step.make_args(layers_=2)
    texts = []
    for _ in range(2):
        module = partir.import_jax(stack_train_step.program, *args)
        partir.partition(module, MESH, [partir.BatchParallel("batch"), partir.Megatron("model")])
        texts.append(str(module))
        propagate(module)
        assert str(module) == texts[-1]  # a second run changes nothing
    assert texts[0] == texts[1]  # same input, byte-identical output


def test_origins_number_actions_in_schedule_order():
    args = mlp_train_step.make_args()
    module = partir.import_jax(mlp_train_step.program, *args)
    result = partir.partition(module, MESH, [partir.BatchParallel("batch"),
                                             partir.Megatron("model")])
    numbers = [a.origin.action.data for a in result.actions]
    assert numbers == list(range(1, len(numbers) + 1))
    assert [a.origin.tactic.data for a in result.actions] == (
        ["BatchParallel"] * 2 + ["Megatron"] * 3)
    assert all(isinstance(a.origin, OriginAttr) for a in result.actions)


def test_a_program_with_other_names_and_layouts():
    """A 3-layer MLP with a list of layers and its own names, split by hand."""

    def net(weights, batch):
        h = batch["inputs"]
        for layer in weights:
            h = jax.nn.gelu(h @ layer["kernel"] + layer["bias"])
        return jnp.sum((h - batch["targets"]) ** 2)

    rng = np.random.default_rng(3)
    sizes = [24, 40, 40, 8]
    weights = [{"kernel": rng.standard_normal((a, b)).astype(np.float32) / 5,
                "bias": rng.standard_normal(b).astype(np.float32)}
               for a, b in itertools.pairwise(sizes)]
    batch = {"inputs": rng.standard_normal((20, 24)).astype(np.float32),
             "targets": rng.standard_normal((20, 8)).astype(np.float32)}
    step = jax.value_and_grad(net)
    tactics = [
        partir.BatchParallel("b", inputs="batch/**"),
        partir.ManualPartition({"weights/1/kernel": {1: "m"}, "weights/2/kernel": {0: "m"},
                                "weights/1/bias": {0: "m"}}),
    ]
    result = partition_and_check(step, (weights, batch), tactics, partir.Mesh({"b": 5, "m": 2}))
    counts = loop_counts(result.module)
    assert counts[("m", "sum")] >= 1 and counts[("b", "sum")] >= 1


SHARED_IDENTITY_TILING = """
partir.mesh @mesh ["batch" = 4, "model" = 2]
func.func @main(%x: tensor<8x6xf32>) -> (tensor<8x6xf32>, tensor<8x6xf32>) {
  %m = partir.loop "model" [#partir.tile<1>] (%q: !partir.range<2>) {
    %xm = partir.slice 1 %x[%q] : tensor<8x6xf32> -> tensor<8x3xf32>
    partir.yield %xm : tensor<8x3xf32>
  } : tensor<8x6xf32>
  %a = partir.loop "batch" [#partir.tile<0>] (%r: !partir.range<4>) {
    %s = partir.slice 0 %m[%r] : tensor<8x6xf32> -> tensor<2x6xf32>
    %e = stablehlo.exponential %s : tensor<2x6xf32>
    partir.yield %e : tensor<2x6xf32>
  } : tensor<8x6xf32>
  %b = partir.loop "batch" [#partir.tile<0>] (%r: !partir.range<4>) {
    %s = partir.slice 0 %m[%r] : tensor<8x6xf32> -> tensor<2x6xf32>
    %n = stablehlo.negate %s : tensor<2x6xf32>
    partir.yield %n : tensor<2x6xf32>
  } : tensor<8x6xf32>
  func.return %a, %b : tensor<8x6xf32>, tensor<8x6xf32>
}
"""


def test_an_identity_tiling_with_several_users_moves_into_each():
    """A value tiled over "model" after its users were sliced over "batch"
    (a loop-carried value tiled late): each user gets its own copy of the
    identity loop, so every use slices the value itself (the chain the SPMD
    lowering reads a distribution from), and the numbers stay the same."""
    module = PartirParser(make_context(), SHARED_IDENTITY_TILING).parse_module()
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    want = run_function(module, [x])
    assert propagate(module) == []
    module.verify()
    assert_leaves_close(run_function(module, [x]), want, what="after propagation")
    (arg,) = entry_function(module).body.block.args
    assert input_slices(arg) == [(1, "model"), (0, "batch")]


DEAD_LOOP_READING_A_CONSTANT = """
partir.mesh @mesh ["batch" = 4]
func.func @main(%x: tensor<8x6xf32>) -> tensor<8x6xf32> {
  %c = stablehlo.constant dense<2.0> : tensor<2x6xf32>
  %d = partir.loop "batch" [#partir.tile<0>] (%r: !partir.range<4>) {
    %s = partir.slice 0 %x[%r] : tensor<8x6xf32> -> tensor<2x6xf32>
    %m = stablehlo.multiply %s, %c : tensor<2x6xf32>
    %n = stablehlo.add %m, %c : tensor<2x6xf32>
    partir.yield %n : tensor<2x6xf32>
  } : tensor<8x6xf32>
  %e = stablehlo.exponential %x : tensor<8x6xf32>
  func.return %e : tensor<8x6xf32>
}
"""


def test_erasing_a_dead_loop_erases_what_only_its_body_read_in_the_same_round(monkeypatch):
    """The walker wakes the producers of outer values an erased op's body was
    the last user of (read twice here): the constant goes with the loop, and
    one quiet round confirms the fixpoint (before, a second round erased the
    constant and a third confirmed)."""
    from rewrites import propagation

    module = PartirParser(make_context(), DEAD_LOOP_READING_A_CONSTANT).parse_module()
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    want = run_function(module, [x])
    rounds = []
    process = propagation._Walker._process_worklist

    def counted(self, listener):
        rounds.append(process(self, listener))
        return rounds[-1]

    monkeypatch.setattr(propagation._Walker, "_process_worklist", counted)
    assert propagate(module) == []
    module.verify()
    names = [op.name for op in entry_function(module).body.block.ops]
    assert names == ["stablehlo.exponential", "func.return"]
    assert rounds == [True, False]
    assert_leaves_close(run_function(module, [x]), want, what="after propagation")
