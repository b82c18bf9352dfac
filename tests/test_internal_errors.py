"""Regressions for the internal errors differential fuzzing found (issue 9).

Each program runs under `partir.jit` and must equal `jax.jit`; the partitioned
core IR must verify after each tactic, the SPMD interpreter must agree, and
every annotated SPMD value must carry a valid distribution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.utils.exceptions import InterpretationError, VerifyException

import partir
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from dialects.parser import PartirParser
from dialects.partir import LoopOp
from dialects.spmd import DIST, DTensorType
from dialects.stablehlo_ext import SliceOp
from tests.numerics import assert_leaves_close

AB = partir.Mesh({"a": 2, "b": 4})
ABC = partir.Mesh({"a": 2, "b": 2, "c": 2})


def check(program, args, tactics, mesh):
    """Equal to jax.jit under partir.jit and on the SPMD interpreter; the core
    IR verifies after every tactic; every `dist` annotation is a valid type."""
    module = partir.import_jax(program, *args)
    partir.partition(module, mesh, tactics, verify=True)
    ref = jax.jit(program)(*args)
    lowered = partir.jit(program, mesh=mesh, tactics=tactics).lower(*args)
    for op in lowered.module.walk():
        if DIST in op.attributes:
            assert isinstance(op.attributes[DIST], DTensorType)
            op.attributes[DIST].verify()
    assert_leaves_close(run_function(module, list(args)), ref, what="core")
    assert_leaves_close(run_spmd(lowered.module, list(args)), ref, what="spmd")
    assert_leaves_close(lowered.compile()(*args), ref, what="partir.jit")
    return module


# --- slice bounds are localised -----------------------------------------------------


def test_strided_slice_with_a_tiled_kept_dim_has_local_bounds():
    x = jnp.arange(8.0).reshape(2, 4)
    module = check(lambda x: x[::2, :], (x,), [partir.ManualPartition({"x": {1: "b"}})], AB)
    (inside,) = [op for op in module.walk() if isinstance(op, SliceOp)]
    assert isinstance(inside.parent_op(), LoopOp)
    assert list(inside.limit_indices.get_values()) == [2, 1]


def test_slice_on_a_dim_tiled_twice_has_the_innermost_part_as_its_bound():
    x = jnp.arange(64.0).reshape(8, 8) / 9
    tactics = [partir.ManualPartition({"x": {1: "b"}}), partir.BatchParallel("a", dim=1)]
    check(lambda x: jnp.tanh(x[1:, :]), (x,), tactics, AB)


SLICE_PAST_OPERAND = """\
builtin.module {
  func.func @main(%x: tensor<2x1xf32>) -> tensor<1x1xf32> {
    %y = "stablehlo.slice"(%x) {start_indices = array<i64: 0, 0>, limit_indices = array<i64: 2, 4>, strides = array<i64: 2, 1>} : (tensor<2x1xf32>) -> tensor<1x1xf32>
    func.return %y : tensor<1x1xf32>
  }
}
"""


def test_verifier_rejects_a_slice_reading_past_its_operand():
    module = PartirParser(make_context(), SLICE_PAST_OPERAND, "t.mlir").parse_module()
    with pytest.raises(VerifyException, match=r"dim 1 of tensor<2x1xf32> has size 1"):
        module.verify()


def test_interpreter_refuses_out_of_range_slice_bounds():
    module = PartirParser(make_context(), SLICE_PAST_OPERAND, "t.mlir").parse_module()
    with pytest.raises(InterpretationError, match=r"reads \[0:4:1\] of dim 1, which has size 1"):
        run_function(module, [np.ones((2, 1), np.float32)])


# --- "a mesh axis is used twice" --------------------------------------------------


def test_log_softmax_over_dim_0_with_input_and_result_tiled_on_different_axes():
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    tactics = [partir.ManualPartition({"x": {1: "a"}, "result": {0: "b"}})]
    check(lambda x: jax.nn.log_softmax(x, axis=0), (x,), tactics, AB)


def test_softmax_over_a_tiled_axis_with_three_mesh_axes():
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    tactics = [partir.ManualPartition({"x": {1: "a", 0: "b"}}), partir.BatchParallel("c")]
    check(lambda x: jax.nn.softmax(x, axis=1), (x,), tactics, ABC)


def test_maximum_chain_reduced_to_a_row_max_on_three_axes():
    def program(x, y):
        e = jnp.maximum(jnp.exp(jnp.exp(x)), y)
        return jnp.max(e, axis=1, keepdims=True) - e

    k = jax.random.PRNGKey(2)
    x = jax.random.normal(k, (8, 4)) / 4
    y = jax.random.normal(jax.random.fold_in(k, 1), (8, 4))
    check(program, (x, y), [partir.ManualPartition({"x": {0: "c"}, "result": {1: "a"}})], ABC)


def test_row_sum_added_back_with_the_result_tiled_on_both_dims():
    def program(x, y):
        c = x * y
        return jnp.tanh(jnp.sum(c, axis=1, keepdims=True) + c)

    k = jax.random.PRNGKey(3)
    x, y = jax.random.normal(k, (4, 8)), jax.random.normal(jax.random.fold_in(k, 1), (4, 8))
    tactics = [partir.ManualPartition({"y": {0: "b"}, "result": {0: "b", 1: "a"}})]
    check(program, (x, y), tactics, ABC)


def test_gather_grad_reshaped_through_size_1_dims_on_two_axes():
    # Fuzz seed 200, case 4900: inside a's and b's loops the scatter-add's
    # updates come from a reshape whose size-1 dims "b" had split; read
    # locally the reshape put both axes on one dim.
    def loss(a0, i1):
        v1 = jnp.reshape(jnp.take(a0, i1, axis=2), (1, 1, 2048, 1))
        return jnp.sum(v1 * v1)

    k = jax.random.PRNGKey(4)
    a0 = jax.random.normal(k, (4, 4, 2))
    i1 = jax.random.randint(jax.random.fold_in(k, 1), (8, 16), 0, 2)
    tactics = [partir.ManualPartition({"result/1": {1: "b", 2: "a"}, "a0": {0: "b", 1: "a"}})]
    check(jax.value_and_grad(loss), (a0, i1), tactics, AB)


def test_a_reshape_merging_three_split_dims_orders_their_axes_by_loop_nesting():
    # Fuzz seed 300, case 3108: (2,2,4) split [a][c][b] reshaped to (1,8,2)
    # puts a, c and b on one dim; the relation settled "b" first (from the
    # result's tiling) and named it major, so the all-to-all after it was
    # annotated with "b" twice. An outer loop's axis is major to an inner's.
    def program(a0):
        v1 = (a0 + a0) * 2
        return jnp.reshape(jnp.abs(v1), (1, 8, 2)), v1

    a0 = jax.random.normal(jax.random.PRNGKey(5), (2, 2, 4))
    tactics = [
        partir.BatchParallel("a", inputs="a0"),
        partir.ManualPartition({"a0": {1: "c", 2: "b"}, "result/0": {2: "b"}}),
    ]
    check(program, (a0,), tactics, ABC)
