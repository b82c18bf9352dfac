"""`stablehlo.convolution` (`lax.conv_general_dilated`): reference semantics
against XLA on every window field, emission, and its rule: the batch and the
output features pass through, the input features are a sum (channel
parallelism), feature groups pass through, and a 1x1 window passes the
spatial dims through."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from xdsl.utils.exceptions import ParseError

import partir
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from dialects.parser import PartirParser
from tests.numerics import assert_leaves_close
from tests.test_names_and_determinism import assert_stages_round_trip

MESH = partir.Mesh({"batch": 4, "model": 2})

NHWC = ("NHWC", "HWIO", "NHWC")
# name -> (input shape, kernel shape, conv_general_dilated keywords)
CONVS = {
    "3x3 SAME": ((8, 8, 8, 4), (3, 3, 4, 6), dict(window_strides=(1, 1), padding="SAME")),
    "strided, dilated, NCHW": (
        (8, 4, 9, 7), (6, 4, 3, 2),
        dict(window_strides=(2, 1), padding=((1, 0), (2, -1)), lhs_dilation=(1, 2),
             rhs_dilation=(2, 1), dimension_numbers=("NCHW", "OIHW", "NCHW")),
    ),
    "depthwise": ((8, 8, 8, 4), (3, 3, 1, 8),
                  dict(window_strides=(1, 1), padding="SAME", feature_group_count=4)),
    "grouped": ((8, 8, 8, 6), (3, 3, 3, 4),
                dict(window_strides=(1, 1), padding="SAME", feature_group_count=2)),
    "patch embedding": ((8, 16, 16, 3), (4, 4, 3, 8),
                        dict(window_strides=(4, 4), padding="VALID")),
    "1-d": ((8, 10, 4), (3, 4, 6), dict(window_strides=(1,), padding="SAME",
                                        dimension_numbers=("NWC", "WIO", "NWC"))),
    "1x1": ((8, 6, 6, 4), (1, 1, 4, 8), dict(window_strides=(1, 1), padding="VALID")),
}


def conv_of(name):
    _, _, keywords = CONVS[name]
    keywords = {"dimension_numbers": NHWC, **keywords}
    return lambda x, w: lax.conv_general_dilated(x, w, **keywords)


def arrays(name, seed=0):
    x_shape, w_shape, _ = CONVS[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    return x, (rng.standard_normal(w_shape) * 0.3).astype(np.float32)


def loss_and_grads(conv):
    """A scalar of the conv and both of its gradients (the gradients are
    convolutions too: the input's a transposed, the kernel's a batch-contracted one)."""
    return jax.value_and_grad(lambda x, w: jnp.sum(jnp.sin(conv(x, w))), argnums=(0, 1))


@pytest.mark.parametrize("name", sorted(CONVS))
def test_the_reference_interpreter_convolves_as_xla_does(name):
    x, w = arrays(name)
    for fn in (conv_of(name), loss_and_grads(conv_of(name))):
        got = run_function(partir.import_jax(fn, x, w), [x, w])
        assert_leaves_close(got, jax.jit(fn)(x, w), what=name)


@pytest.mark.parametrize("name", sorted(CONVS))
def test_a_batch_split_convolution_and_its_gradients_run_on_shards(name):
    """The batch passes through the conv and the input's gradient; the
    kernel's gradient contracts the batch, so it is a sum: one all-reduce."""
    x, w = arrays(name)
    fn = loss_and_grads(conv_of(name))
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    want = jax.jit(fn)(x, w)
    assert_leaves_close(compiled(x, w), want, what=name)
    lowered = compiled.lower(x, w)
    kinds = sorted({(c.kind, c.axes) for c in lowered.collectives})
    assert kinds == [("all_reduce", ("batch",))], kinds
    assert_leaves_close(run_spmd(lowered.module, [x, w]), want, what="SPMD interpreter")
    assert lowered.conflicts == []


def test_output_channels_split_over_model_need_no_collective_in_the_forward_pass():
    """Channel ("Megatron") parallelism: the kernel's output features split,
    so every device computes its own output channels from the whole input."""
    name = "3x3 SAME"
    x, w = arrays(name)
    fn = conv_of(name)
    tactics = [partir.BatchParallel("batch", inputs="x"),
               partir.ManualPartition({"w": {3: "model"}})]
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(x, w), jax.jit(fn)(x, w), what="channel-split conv")
    lowered = compiled.lower(x, w)
    assert lowered.collectives == []
    assert lowered.compile().program.OUT_SPECS[0] == jax.sharding.PartitionSpec("batch", None, None, "model")
    assert_stages_round_trip(lowered)


def test_input_channels_split_over_model_are_summed():
    """The kernel's input features split: each device convolves its channels
    of the input, and the partial outputs are all-reduced."""
    name = "3x3 SAME"
    x, w = arrays(name)
    fn = conv_of(name)
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.ManualPartition({"w": {2: "model"}})])
    assert_leaves_close(compiled(x, w), jax.jit(fn)(x, w), what="input-channel-split conv")
    lowered = compiled.lower(x, w)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_reduce", ("model",))]


@pytest.mark.parametrize("name", ["depthwise", "grouped"])
def test_feature_groups_split_over_model_run_a_share_of_the_groups(name):
    """Each device runs its groups: the input's channels and the kernel's
    output features split together, the group count divided by the parts."""
    x, w = arrays(name)
    fn = conv_of(name)
    tactics = [partir.ManualPartition({"x": {3: "model"}, "w": {3: "model"}})]
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(x, w), jax.jit(fn)(x, w), what=name)
    lowered = compiled.lower(x, w)
    assert lowered.collectives == []
    assert "feature_group_count" in lowered.source
    assert_leaves_close(run_spmd(lowered.module, [x, w]), jax.jit(fn)(x, w), what="SPMD")


def test_a_1x1_convolution_passes_its_spatial_dims_through():
    name = "1x1"
    x, w = arrays(name)
    fn = conv_of(name)
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.ManualPartition({"x": {1: "model"}})])
    assert_leaves_close(compiled(x, w), jax.jit(fn)(x, w), what="1x1 conv")
    lowered = compiled.lower(x, w)
    assert lowered.collectives == []


def test_a_split_window_dim_is_gathered_and_the_report_says_why():
    name = "3x3 SAME"
    x, w = arrays(name)
    fn = conv_of(name)
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.ManualPartition({"x": {1: "model"}})])
    assert_leaves_close(compiled(x, w), jax.jit(fn)(x, w), what="conv over split rows")
    lowered = compiled.lower(x, w)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_gather", ("model",))]


def test_malformed_dimension_numbers_name_the_attribute():
    text = "#stablehlo.conv<[b, 0, 1, b]x[0, 1, i, o]->[b, 0, 1, f]>"
    with pytest.raises(ParseError, match=r"#stablehlo.conv: a layout names 'b', 'f' once each"):
        PartirParser(make_context(), text).parse_attribute()
