"""`stablehlo.convolution` (`lax.conv_general_dilated`): reference semantics
against XLA on every window field, emission, and its rule: the batch and the
output features pass through, the input features are a sum (channel
parallelism), feature groups pass through, and a spatial dim splits with a
halo of the neighbours' rows (`partir.halo_slice`, `spmd.collective_permute`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from xdsl.utils.exceptions import ParseError

import partir
from benchmarks.hlo_stats import collective_stats
from benchmarks.vs_jit import baseline
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from dialects.parser import PartirParser
from partir.report import report_text
from tests.numerics import assert_leaves_close
from tests.partitioning import partition_and_check
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
    "strided SAME": ((8, 8, 8, 4), (3, 3, 4, 6), dict(window_strides=(2, 2), padding="SAME")),
    "dilated SAME": ((8, 16, 8, 4), (3, 3, 4, 6),
                     dict(window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 1))),
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


# name -> halo (lo, hi) of its rows: what a part reads from its neighbours
SPATIAL = {
    "3x3 SAME": (1, 1),
    "strided SAME": (0, 1),
    "dilated SAME": (2, 2),
    "1-d": (1, 1),
    "patch embedding": (0, 0),
    "1x1": (0, 0),
}


def assert_same_collectives_as_jit(fn, args, lowered) -> None:
    """XLA's collectives in partir's program equal those of `jax.jit` given
    the same shardings (GSPMD's spatial partitioning), kind, count and bytes."""
    compiled = lowered.compile()
    reference, in_shardings = baseline(fn, args, compiled)
    inputs = [jax.device_put(a, s) for a, s in zip(args, in_shardings, strict=True)]
    ours = collective_stats(compiled.run.lower(*inputs).compile().as_text())
    theirs = collective_stats(reference.lower(*inputs).compile().as_text())
    assert ours == theirs


@pytest.mark.parametrize("name, axis", [
    (name, axis) for name in sorted(SPATIAL) for axis in ("model", "batch")
    if CONVS[name][0][1] % MESH[axis] == 0  # the rows split over the axis
])
def test_a_spatially_split_convolution_exchanges_only_its_halos(name, axis):
    """Split rows: each device convolves its rows and a halo of its
    neighbours' (a collective permute each way), padded only at the ends:
    GSPMD, given the same shardings, moves the same bytes."""
    x, w = arrays(name)
    fn = conv_of(name)
    tactics = [partir.ManualPartition({"x": {1: axis}})]
    partition_and_check(fn, (x, w), tactics)  # the core interpreter on the loops
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    want = jax.jit(fn)(x, w)
    assert_leaves_close(compiled(x, w), want, what=name)
    lowered = compiled.lower(x, w)
    lo, hi = SPATIAL[name]
    row = x.nbytes // x.shape[1]  # one row of dim 1, on every device
    halos = [n * row for n in (lo, hi) if n]  # the halos only, one permute each way
    got = [(c.kind, c.axes, c.bytes_per_device) for c in lowered.collectives]
    assert got == [("collective_permute", (axis,), n) for n in halos]
    assert lowered.source.count("lax.ppermute(") == len(halos)
    assert_same_collectives_as_jit(fn, (x, w), lowered)
    spec = lowered.compile().program.OUT_SPECS[0]
    assert spec == jax.sharding.PartitionSpec(None, axis, *([None] * (x.ndim - 2)))
    assert_leaves_close(run_spmd(lowered.module, [x, w]), want, what="SPMD interpreter")
    assert_stages_round_trip(lowered)


def test_the_gradients_of_a_row_split_convolution_exchange_halos_and_sum_the_kernel():
    """The input's gradient is a convolution split like the forward one; the
    kernel's sums over the rows (its window spans the input): each device
    contributes its rows, and the kernel's gradient is all-reduced."""
    name = "3x3 SAME"
    x, w = arrays(name)
    fn = loss_and_grads(conv_of(name))
    tactics = [partir.BatchParallel("batch", inputs="x"),
               partir.ManualPartition({"x": {1: "model"}})]
    partition_and_check(fn, (x, w), tactics)
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    want = jax.jit(fn)(x, w)
    assert_leaves_close(compiled(x, w), want, what="gradients")
    lowered = compiled.lower(x, w)
    kinds = sorted({(c.kind, c.axes) for c in lowered.collectives})
    assert kinds == [("all_reduce", ("batch", "model")), ("collective_permute", ("model",))], kinds
    assert_leaves_close(run_spmd(lowered.module, [x, w]), want, what="SPMD interpreter")


def test_a_stack_of_convolutions_stays_split_by_rows():
    """conv -> relu -> conv: the rows stay split between the two; the second
    conv exchanges the halos of the first one's output parts."""
    x, w = arrays("3x3 SAME")
    w2 = np.random.default_rng(1).standard_normal((3, 3, 6, 4)).astype(np.float32) * 0.3
    conv = conv_of("3x3 SAME")

    def fn(x, w, w2):
        return conv(jax.nn.relu(conv(x, w)), w2)

    tactics = [partir.ManualPartition({"x": {1: "model", 0: "batch"}})]
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(x, w, w2), jax.jit(fn)(x, w, w2), what="conv stack")
    lowered = compiled.lower(x, w, w2)
    assert [c.kind for c in lowered.collectives] == ["collective_permute"] * 4
    assert lowered.compile().program.OUT_SPECS[0] == jax.sharding.PartitionSpec(
        "batch", "model", None, None
    )


def test_a_window_that_cannot_split_evenly_is_gathered_and_the_report_says_why():
    """A VALID window shrinks the output: its parts would not line up with the input's."""
    x, w = arrays("3x3 SAME")

    def fn(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=NHWC)

    tactics = [partir.ManualPartition({"x": {1: "model"}})]
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(x, w), jax.jit(fn)(x, w), what="VALID conv over split rows")
    lowered = compiled.lower(x, w)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_gather", ("model",))]
    report = report_text(lowered.stage("ManualPartition"))
    (conv,) = [r for r in report.replicated_ops if r.op == "stablehlo.convolution"]
    assert conv.reason == "blocked" and "parts would not align" in conv.detail, conv


def test_malformed_dimension_numbers_name_the_attribute():
    text = "#stablehlo.conv<[b, 0, 1, b]x[0, 1, i, o]->[b, 0, 1, f]>"
    with pytest.raises(ParseError, match=r"#stablehlo.conv: a layout names 'b', 'f' once each"):
        PartirParser(make_context(), text).parse_attribute()
