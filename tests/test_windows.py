"""`stablehlo.reduce_window` (`jnp.cumsum`, `lax.cummax`, max and average
pooling) and `stablehlo.select_and_scatter` (the gradient of max / min
pooling): reference semantics, emission, and their rules: a dim whose window
is one element passes through (the batch of a pooled image), a window dim is
blocked until halo exchange exists (issue 16)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from xdsl.utils.exceptions import VerifyException

import partir
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from dialects.parser import PartirParser
from dialects.stablehlo_ext import SelectAndScatterOp
from partir.report import report_text
from tests.numerics import assert_leaves_close
from tests.test_names_and_determinism import assert_stages_round_trip

MESH = partir.Mesh({"batch": 4, "model": 2})
WINDOWS = {
    "cumsum": lambda x: jnp.cumsum(x, axis=1),
    "cumprod": lambda x: jnp.cumprod(x, axis=2),
    "cummax": lambda x: lax.cummax(x, axis=1),
    "max pool": lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                            "VALID"),
    "average pool, SAME": lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1),
                                                      (1, 2, 2, 1), "SAME") / 9,
    "dilated, cropped": lambda x: lax.reduce_window(
        x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), ((0, 0), (1, 2), (-1, 1), (0, 0)),
        base_dilation=(1, 2, 1, 1), window_dilation=(1, 1, 2, 1)),
}


def images(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((8, 9, 8, 4)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_a_window_over_a_batch_split_input_runs_on_shards(name):
    fn, x = WINDOWS[name], images()
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    want = jax.jit(fn)(x)
    assert_leaves_close(compiled(x), want, what=name)
    lowered = compiled.lower(x)
    assert lowered.collectives == []  # the batch dim passes through every window
    assert_leaves_close(run_function(partir.import_jax(fn, x), [x]), want, what="core interpreter")
    assert_leaves_close(run_spmd(lowered.module, [x]), want, what="SPMD interpreter")


def test_a_split_window_dim_is_gathered_and_the_report_says_why():
    """Splitting the pooled height over "model": the overlapping, padded
    windows would need the neighbouring part's rows and the init value as
    padding at the ends, so the pool runs on the whole height."""
    fn, x = WINDOWS["average pool, SAME"], images()[:, :8]
    tactics = [partir.ManualPartition({"x": {1: "model"}})]
    compiled = partir.jit(fn, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(x), jax.jit(fn)(x), what="average pool over split rows")
    lowered = compiled.lower(x)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_gather", ("model",))]
    report = report_text(lowered.stage("ManualPartition"))
    (pool,) = [r for r in report.replicated_ops if r.op == "stablehlo.reduce_window"]
    assert pool.reason == "blocked" and "neighbours' elements" in pool.detail, pool
    assert_stages_round_trip(lowered)


@pytest.mark.parametrize("name", ["max 2x2", "max 2x2 by 3"])
def test_pooling_whose_windows_tile_the_rows_splits_them_with_its_gradient(name):
    """2x2 pooling with stride 2: each window lies in its own two rows, so a
    part of the rows pools (and scatters its gradient) alone: no collective."""
    pool = POOLS[name]
    x = with_ties()[:, :8] if name == "max 2x2" else with_ties()[:, :6]
    g = np.random.default_rng(2).standard_normal(jax.eval_shape(pool, x).shape)
    g = g.astype(np.float32)
    x_rows = {"x": {0: "batch", 1: "model"}}
    for fn, args, split in ((pool, (x,), x_rows),
                            (pool_gradient(pool), (x, g), {**x_rows, "g": {1: "model"}})):
        compiled = partir.jit(fn, mesh=MESH, tactics=[partir.ManualPartition(split)])
        want = jax.jit(fn)(*args)
        assert_leaves_close(compiled(*args), want, what=name)
        lowered = compiled.lower(*args)
        assert lowered.collectives == []
        spec = lowered.compile().program.OUT_SPECS[0]
        assert spec == jax.sharding.PartitionSpec("batch", "model", None, None)
        assert_leaves_close(run_spmd(lowered.module, list(args)), [want], what="SPMD")


def test_position_ids_from_a_cumsum_of_the_mask():
    """The position ids of a padded batch (`cumsum(mask) - 1`), split over
    the batch with the tokens they index."""

    def positions(mask, table):
        ids = jnp.cumsum(mask, axis=1) - 1
        return jnp.take(table, jnp.maximum(ids, 0), axis=0) * mask[..., None]

    rng = np.random.default_rng(1)
    mask = (rng.random((8, 16)) > 0.3).astype(np.int32)
    table = rng.standard_normal((16, 4)).astype(np.float32)
    compiled = partir.jit(positions, mesh=MESH,
                          tactics=[partir.BatchParallel("batch", inputs="mask")])
    assert_leaves_close(compiled(mask, table), jax.jit(positions)(mask, table), what="positions")


# --------------------------------------------------------------------------
# select_and_scatter: the gradient of max / min pooling

POOLS = {
    "max 2x2": lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                           "VALID"),
    "max 3x3 stride 2, SAME (overlapping)": lambda x: lax.reduce_window(
        x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
    "min 3x2, SAME": lambda x: lax.reduce_window(x, jnp.inf, lax.min, (1, 3, 2, 1),
                                                 (1, 1, 2, 1), "SAME"),
    "max, padded": lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1),
                                               (1, 2, 2, 1), ((0, 0), (2, 1), (1, 2), (0, 0))),
    "max 2x2 by 3": lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1),
                                                (1, 3, 2, 1), "VALID"),
}


def pool_gradient(pool):
    """The pool's vector-Jacobian product: a select_and_scatter of `g`."""
    return lambda x, g: jax.vjp(pool, x)[1](g)[0]


def with_ties(seed: int = 0) -> np.ndarray:
    """Small integers: most windows hold their maximum more than once."""
    return np.random.default_rng(seed).integers(0, 3, (8, 9, 8, 4)).astype(np.float32)


@pytest.mark.parametrize("data", ["normal", "ties"])
@pytest.mark.parametrize("name", sorted(POOLS))
def test_a_pool_gradient_equals_jax_in_the_interpreter_and_on_shards(name, data):
    """The first of equal maxima takes the gradient, as XLA picks it; split
    over the batch, each device scatters into its own images."""
    x = images() if data == "normal" else with_ties()
    fn = pool_gradient(POOLS[name])
    g = np.random.default_rng(2).standard_normal(jax.eval_shape(POOLS[name], x).shape)
    g = g.astype(np.float32)
    want = jax.jit(fn)(x, g)
    module = partir.import_jax(fn, x, g)
    assert any(isinstance(op, SelectAndScatterOp) for op in module.walk())
    assert_leaves_close(run_function(module, [x, g]), [want], what="core interpreter")
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    assert_leaves_close(compiled(x, g), want, what=name)
    lowered = compiled.lower(x, g)
    assert lowered.collectives == []  # the batch dim passes through
    assert_leaves_close(run_spmd(lowered.module, [x, g]), [want], what="SPMD interpreter")


def _select_and_scatter(select, scatter, padding):
    from jax._src.lax.windowed_reductions import _select_and_scatter as primitive

    def fn(x, g):
        return primitive(x, select, (1, 3, 3, 1), (1, 2, 2, 1), padding, g, np.float32(1), scatter)

    return fn


REGIONS = {
    "ge, add": (lax.ge, lax.add),
    "le, max": (lax.le, lax.max),
    "gt, mul": (lax.gt, lax.mul),
    "lt, add": (lax.lt, lax.add),
}


@pytest.mark.parametrize("regions", sorted(REGIONS))
def test_padding_in_the_op_and_other_regions_equal_jax(regions):
    """Padding the op itself (JAX pads with a stablehlo.pad before it; any
    other producer may not): a padded position is never picked. Each select
    and scatter region is emitted as the lax function it computes."""
    select, scatter = REGIONS[regions]
    fn = _select_and_scatter(select, scatter, ((0, 0), (2, 1), (1, 2), (0, 0)))
    x, g = with_ties(), np.random.default_rng(3).standard_normal((8, 5, 5, 4)).astype(np.float32)
    want = jax.jit(fn)(x, g)
    assert_leaves_close(run_function(partir.import_jax(fn, x, g), [x, g]), [want],
                        what="interpreter")
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    assert_leaves_close(compiled(x, g), want, what=regions)
    assert f"{select.__name__}, (1, 3, 3, 1)" in compiled.lower(x, g).source


def test_a_scatter_region_that_is_no_lax_function_is_refused_naming_the_op():
    fn = _select_and_scatter(lax.ge, lambda a, b: a - b, ((0, 0),) * 4)
    x, g = images()[:, :7, :7], np.ones((8, 3, 3, 4), np.float32)
    compiled = partir.jit(fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    with pytest.raises(partir.UnsupportedError,
                       match=r"cannot emit stablehlo\.select_and_scatter .*scatter region"):
        compiled.lower(x, g)


def select_and_scatter_text(source: str = "tensor<1x3xf32>", select_op: str = "compare") -> str:
    """A 1x6 operand, windows of 3 every 2 after padding one each side; the
    select region passes its candidate through a reshape (so the interpreter
    cannot run it on whole arrays) before a `GE`."""
    t, t0 = "tensor<1x6xf32>", "tensor<f32>"
    select = {
        "compare": f'''%c = "stablehlo.compare"(%a, %b1) <{{comparison_direction =
        #stablehlo<comparison_direction GE>}}> : ({t0}, {t0}) -> tensor<i1>
    "stablehlo.return"(%c) : (tensor<i1>) -> ()''',
        "add": f'''%c = "stablehlo.add"(%a, %b1) : ({t0}, {t0}) -> {t0}
    "stablehlo.return"(%c) : ({t0}) -> ()''',
    }[select_op]
    return f"""func.func @main(%x: {t}, %g: {source}) -> {t} {{
  %init = "stablehlo.constant"() <{{value = dense<0.0> : {t0}}}> : () -> {t0}
  %r = "stablehlo.select_and_scatter"(%x, %g, %init) <{{window_dimensions = array<i64: 1, 3>,
      window_strides = array<i64: 1, 2>, padding = dense<[[0, 0], [1, 1]]> : tensor<2x2xi64>}}> ({{
  ^bb0(%a: {t0}, %b: {t0}):
    %b1 = "stablehlo.reshape"(%b) : ({t0}) -> {t0}
    {select}
  }}, {{
  ^bb0(%a: {t0}, %b: {t0}):
    %s = "stablehlo.add"(%a, %b) : ({t0}, {t0}) -> {t0}
    "stablehlo.return"(%s) : ({t0}) -> ()
  }}) : ({t}, {source}, {t0}) -> {t}
  func.return %r : {t}
}}"""


def test_a_select_region_run_element_by_element_picks_alike():
    """A select region the interpreter cannot run on whole arrays is run
    window by window, with the same picks: the first of equal maxima."""
    module = PartirParser(make_context(), select_and_scatter_text()).parse_module()
    module.verify()
    x = np.array([[2.0, 5.0, 5.0, 1.0, 7.0, 7.0]], np.float32)
    g = np.array([[1.0, 10.0, 100.0]], np.float32)
    # windows (padded by one each side): [pad, 2, 5], [5, 5, 1], [1, 7, 7]
    want = np.array([[0.0, 11.0, 0.0, 0.0, 100.0, 0.0]], np.float32)
    (got,) = run_function(module, [x, g])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("text", "message"), [
    (select_and_scatter_text(source="tensor<1x2xf32>"),
     r"the source must have one element per window, \[1, 3\]"),
    (select_and_scatter_text(select_op="add"),
     r"select must map \(tensor<f32>, tensor<f32>\) to tensor<i1>"),
])
def test_the_verifier_names_what_is_wrong(text, message):
    module = PartirParser(make_context(), text).parse_module()
    with pytest.raises(VerifyException, match=message):
        module.verify()


def small_cnn_loss(params, x, y):
    """A small CNN: a 3x3 convolution, max pooling (overlapping windows),
    average pooling, a dense head."""
    h = lax.conv_general_dilated(x, params["conv"], (1, 1), "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jnp.tanh(h)
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4
    logits = h.reshape(h.shape[0], -1) @ params["head"]
    return jnp.mean((logits - y) ** 2)


def test_a_small_cnns_gradient_splits_over_the_batch():
    """Data parallelism through a convolution, max and average pooling and
    their gradients: only the parameter gradients are summed over "batch";
    every pool and its select_and_scatter runs on the device's own images."""
    rng = np.random.default_rng(4)
    params = {"conv": rng.standard_normal((3, 3, 4, 6)).astype(np.float32) * 0.3,
              "head": rng.standard_normal((2 * 2 * 6, 3)).astype(np.float32) * 0.2}
    x, y = images()[:, :8], rng.standard_normal((8, 3)).astype(np.float32)
    step = jax.grad(small_cnn_loss)
    compiled = partir.jit(step, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    assert_leaves_close(compiled(params, x, y), jax.jit(step)(params, x, y), what="gradients")
    lowered = compiled.lower(params, x, y)
    assert {(c.kind, c.axes) for c in lowered.collectives} == {("all_reduce", ("batch",))}
    (scatter,) = [op for op in lowered.module.walk() if isinstance(op, SelectAndScatterOp)]
    assert scatter.operand.type.get_shape()[0] == 2  # 8 images over 4 devices
    assert "_select_and_scatter(" in lowered.source
    assert_stages_round_trip(lowered)
