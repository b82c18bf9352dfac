"""Core -> SPMD lowering: the cheapest collective for each change, on numbers.

Each program is partitioned, lowered, and run by the device-simulating SPMD
interpreter on the 4x2 mesh; results must equal `jax.jit` of the original.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.utils.exceptions import VerifyException

import partir
from dialects.context import make_context
from dialects.interpreter.spmd import run_spmd
from dialects.parser import PartirParser
from dialects.spmd import CollectiveOp
from examples import block_forward, block_train_step, mlp_train_step, transformer_stack
from lowering.to_spmd import lower_to_spmd
from tests.numerics import assert_close

MESH = partir.Mesh({"batch": 4, "model": 2})


def lower_and_check(program, args, tactics, mesh=MESH):
    module = partir.import_jax(program, *args)
    partir.partition(module, mesh, tactics, verify=True)
    lower_to_spmd(module)
    module.verify()
    got = run_spmd(module, jax.tree_util.tree_leaves(args))
    ref = jax.tree_util.tree_leaves(jax.jit(program)(*args))
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        assert_close(g, r, what=f"result leaf {i}")
    return module


def collectives(module) -> collections.Counter[tuple[str, tuple[str, ...]]]:
    return collections.Counter(
        (op.kind, op.axis_names) for op in module.walk() if isinstance(op, CollectiveOp)
    )


RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 16)).astype(np.float32)
W = RNG.standard_normal((16, 4)).astype(np.float32)
Z = RNG.standard_normal((8, 4)).astype(np.float32)


def test_partial_to_replicated_is_an_all_reduce():
    module = lower_and_check(lambda x, w: x @ w, (X, W),
                             [partir.ManualPartition({"x": {1: "model"}, "w": {0: "model"}})])
    assert collectives(module) == {("all_reduce", ("model",)): 1}


def test_partial_to_split_is_a_reduce_scatter():
    def f(x, w, z):
        return x @ w + z

    tactics = [partir.ManualPartition({"x": {1: "batch"}, "w": {0: "batch"}, "z": {0: "batch"}})]
    module = lower_and_check(f, (X, W, Z), tactics)
    assert collectives(module) == {("reduce_scatter", ("batch",)): 1}


def test_split_to_replicated_is_an_all_gather():
    def f(x):
        return jnp.max(jnp.exp(x), axis=0)  # a max over the split dim needs it whole

    module = lower_and_check(f, (X,), [partir.ManualPartition({"x": {0: "batch"}})])
    assert collectives(module) == {("all_gather", ("batch",)): 1}


def test_split_on_one_dim_to_another_is_an_all_to_all():
    def f(x, y):
        return jnp.exp(x) + y

    y = RNG.standard_normal((8, 16)).astype(np.float32)
    module = lower_and_check(f, (X, y),
                             [partir.ManualPartition({"x": {0: "batch"}, "y": {1: "batch"}})])
    assert collectives(module) == {("all_to_all", ("batch",)): 1}


def test_replicated_to_split_is_a_local_slice():
    def f(x, y):
        return x + y, jnp.sum(y)  # y is used whole too, so it arrives replicated

    module = lower_and_check(f, (X, X), [partir.ManualPartition({"x": {0: "batch"}})])
    assert collectives(module) == {("local_slice", ("batch",)): 1}


def test_megatron_block_forward_needs_exactly_two_all_reduces():
    module = lower_and_check(block_forward.program, block_forward.make_args(),
                             [partir.Megatron("model")])
    assert collectives(module) == {("all_reduce", ("model",)): 2}


def test_batch_parallel_mlp_step_all_reduces_gradients_over_batch_only():
    module = lower_and_check(mlp_train_step.program, mlp_train_step.make_args(),
                             [partir.BatchParallel("batch")])
    # 4 gradients and the loss; nothing else.
    assert collectives(module) == {("all_reduce", ("batch",)): 5}


def test_zero3_gathers_parameters_and_reduce_scatters_gradients():
    module = lower_and_check(mlp_train_step.program, mlp_train_step.make_args(),
                             [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)])
    counts = collectives(module)
    assert counts[("all_gather", ("batch",))] == 4
    assert counts[("reduce_scatter", ("batch",))] == 4
    assert counts[("all_reduce", ("batch",))] == 1  # the loss, not a gradient


def test_mlp_step_megatron_and_both():
    lower_and_check(mlp_train_step.program, mlp_train_step.make_args(), [partir.Megatron("model")])
    module = lower_and_check(mlp_train_step.program, mlp_train_step.make_args(),
                             [partir.BatchParallel("batch"), partir.Megatron("model")])
    assert collectives(module)[("all_reduce", ("model",))] >= 1


@pytest.mark.parametrize("stage", [1, 2])
def test_block_step_zero_stages_never_all_reduce_gradients(stage: int):
    module = lower_and_check(block_train_step.program, block_train_step.make_args(),
                             [partir.BatchParallel("batch"), partir.ZeRO("batch", stage)])
    counts = collectives(module)
    assert counts[("all_reduce", ("batch",))] == 1  # only the loss
    assert counts[("reduce_scatter", ("batch",))] == 16


def test_block_train_step_batch_and_megatron():
    module = lower_and_check(block_train_step.program, block_train_step.make_args(),
                             [partir.BatchParallel("batch"), partir.Megatron("model")])
    counts = collectives(module)
    # Textbook Megatron and less (jax.jit: six over "model"): two forward,
    # one backward at the second norm's input. The gradients through q, k
    # and v stay partial over "model" through their sum, and what the sum
    # feeds (the first norm's scale and bias gradients) is summed as two
    # vectors, over both axes, with the gradient all-reduce; 14 more
    # gradients and the loss are summed over "batch".
    assert counts[("all_reduce", ("model",))] == 3
    assert counts[("all_reduce", ("batch", "model"))] == 2
    assert counts[("all_reduce", ("batch",))] == 15


def test_four_layer_stack():
    lower_and_check(transformer_stack.program, transformer_stack.make_args(layers_=4),
                    [partir.BatchParallel("batch"), partir.Megatron("model")])


def test_inputs_arrive_sharded_and_outputs_stay_sharded():
    module = lower_and_check(lambda x: jnp.tanh(x) * 2, (X,),
                             [partir.ManualPartition({"x": {0: "batch", 1: "model"}})])
    text = str(module)
    assert '%x: !spmd.dtensor<8x16xf32, [{"batch"}, {"model"}]>' in text
    assert '-> (!spmd.dtensor<8x16xf32, [{"batch"}, {"model"}]>' in text
    assert not collectives(module)


def test_spmd_ir_prints_and_parses_back():
    module = partir.import_jax(block_train_step.program, *block_train_step.make_args())
    partir.partition(module, MESH, [partir.BatchParallel("batch"), partir.Megatron("model")])
    lower_to_spmd(module)
    text = str(module)
    again = PartirParser(make_context(), text).parse_module()
    again.verify()
    assert str(again) == text


@pytest.mark.parametrize(("op", "message"), [
    ('spmd.all_gather %v dim 0 over ["batch"] : tensor<4x8xf32> -> tensor<8x8xf32>',
     'spmd.all_gather over [\'batch\']: tensor<4x8xf32> gives tensor<16x8xf32>, but the result is tensor<8x8xf32>'),
    ('spmd.reduce_scatter %v dim 1 over ["batch"] : tensor<4x8xf32> -> tensor<4x4xf32>',
     "tensor<4x8xf32> gives tensor<4x2xf32>, but the result is tensor<4x4xf32>"),
    ('spmd.all_reduce %v over ["nope"] : tensor<4x8xf32> -> tensor<4x8xf32>',
     'spmd.all_reduce: unknown mesh axis "nope" (the mesh has "batch", "model")'),
    ('spmd.all_to_all %v split 1 concat 1 over ["model"] : tensor<4x8xf32> -> tensor<4x8xf32>',
     "spmd.all_to_all: split and concat dims are both 1"),
])
def test_collective_shapes_are_verified(op: str, message: str):
    text = f"""
partir.mesh @mesh ["batch" = 4, "model" = 2]
func.func @main(%v: tensor<4x8xf32>) {{
  %r = {op}
  func.return
}}"""
    module = PartirParser(make_context(), text).parse_module()
    with pytest.raises(VerifyException) as info:
        module.verify()
    assert message in str(info.value)


def test_lowering_leaves_no_cyclic_garbage():
    """The lowering's bookkeeping (a `Placed` and a `Distribution` per value,
    the redistributor's memos) is freed when `lower_to_spmd` returns: no
    reference cycle keeps it for the cyclic collector, which would walk it
    (at 96 layers, about 0.6 s of `partir.simulate`)."""
    import gc

    from lowering.distributions import Placed

    args = block_train_step.make_args()
    module = partir.import_jax(block_train_step.program, *args)
    partir.partition(module, MESH, [partir.BatchParallel("batch"), partir.Megatron("model")])
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        lower_to_spmd(module)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, Placed)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert left == []
