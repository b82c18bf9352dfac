"""A nested `jax.shard_map` (a manual region, `sdy.manual_computation`) is
kept per device as written, with its own collectives; partir partitions the
program around it.

On the 4x2 CPU mesh: a hand-written kernel (a local matmul, then
`jax.lax.psum` over "model") between work partir partitions under
BatchParallel; the numbers are jax.jit's, `check=True` runs every stage
through it (the reference interpreter simulates the region's devices), and
what partir cannot keep is refused by name.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import partir
from benchmarks.hlo_stats import collective_stats
from dialects.context import make_context
from dialects.manual_regions import MANUAL_COLLECTIVE
from dialects.parser import PartirParser
from dialects.sdy import ManualComputationOp
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
AUTO = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)
RNG = np.random.default_rng(0)
ROOT = Path(__file__).resolve().parent.parent


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def row_parallel_matmul(x, w):
    """Each device: its rows and columns of `x` times its rows of `w`, summed over "model"."""
    return jax.lax.psum(x @ w, "model")


def step(x, w):
    h = jnp.tanh(x)
    y = jax.shard_map(
        row_parallel_matmul, mesh=AUTO,
        in_specs=(P("batch", "model"), P("model", None)), out_specs=P("batch", None),
    )(h, w)
    return jnp.sum(y * 2.0, axis=1)


def batch_parallel(fn, **kwargs):
    return partir.jit(
        fn, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs=["x"])], **kwargs
    )


def test_a_shard_map_kernel_inside_partitions_with_jax_jits_numbers():
    x, w = rand(16, 8), rand(8, 4)
    assert_leaves_close(batch_parallel(step)(x, w), jax.jit(step)(x, w))


def test_check_runs_every_stage_through_the_region():
    x, w = rand(16, 8), rand(8, 4)
    assert_leaves_close(batch_parallel(step, check=True)(x, w), jax.jit(step)(x, w))


def test_the_regions_psum_is_kept_as_written():
    lowered = batch_parallel(step).lower(rand(16, 8), rand(8, 4))
    assert "lax.psum(" in lowered.source
    reduced = [c for c in lowered.report().collectives if c.kind == "all_reduce"]
    assert [c.axes for c in reduced] == [("model",)]


def test_the_region_prints_and_parses_back():
    lowered = batch_parallel(step).lower(rand(16, 8), rand(8, 4))
    text = str(lowered.imported)
    assert "sdy.manual_computation" in text and "spmd.all_reduce" in text
    reparsed = PartirParser(make_context(), text).parse_module()
    (region,) = [op for op in reparsed.walk() if isinstance(op, ManualComputationOp)]
    assert region.manual_axes.names == ("batch", "model")
    assert str(reparsed) == text


def test_its_specs_are_actions_listed_with_the_shard_maps_line():
    """The operand enters split as in_specs say, the result leaves split as
    out_specs say, so the work around the kernel stays split: the kernel's
    psum is the only collective, and no device holds a whole 16x4 value."""
    lowered = batch_parallel(step).lower(rand(16, 8), rand(8, 4))
    report = lowered.report()
    line = inspect.getsourcelines(step)[1] + 2  # the jax.shard_map call
    specs = {
        (s.reason.split(" at ")[0], s.dim, s.axis)
        for s in report.selections if s.tactic == "Annotations"
    }
    assert specs == {
        ("shard_map in_specs[0]", 0, "batch"), ("shard_map in_specs[0]", 1, "model"),
        ("shard_map in_specs[1]", 0, "model"), ("shard_map out_specs[0]", 0, "batch"),
    }
    assert all(
        s.reason.endswith(f"test_manual_regions.py:{line}")
        for s in report.selections if s.tactic == "Annotations"
    )
    assert [c.kind for c in report.collectives] == ["all_reduce"]
    assert report.collectives[0].needed_by == MANUAL_COLLECTIVE
    assert (16, 4) not in {v.local_shape for v in report.values}


def layer(h, w1, w2):
    """A hand-written Megatron MLP: columns of w1, rows of w2, one psum."""
    return jax.lax.psum(jax.nn.relu(h @ w1) @ w2, "model")


def mlp_loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["embed"])
    out = jax.shard_map(
        layer, mesh=AUTO,
        in_specs=(P("batch"), P(None, "model"), P("model", None)), out_specs=P("batch"),
    )(h, params["w1"], params["w2"])
    return jnp.mean((out - batch["y"]) ** 2)


def sgd_step(params, batch):
    loss, grads = jax.value_and_grad(mlp_loss)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def test_a_training_step_differentiates_through_the_kernel():
    """jax.grad makes a second region (the kernel's transpose) with its own
    psum; both are kept, every stage checks against jax.jit, and partir
    moves no more bytes than jax.jit's compiled step (1220 B per device each)."""
    params = {"embed": rand(6, 8), "w1": rand(8, 16), "w2": rand(16, 8)}
    batch = {"x": rand(32, 6), "y": rand(32, 8)}
    fn = partir.jit(
        sgd_step, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs=["batch/*"])],
        check=True,
    )
    compiled = jax.jit(sgd_step).lower(params, batch).compile()
    assert_leaves_close(fn(params, batch), compiled(params, batch))
    moved = sum(c.bytes_per_device for c in fn.lower(params, batch).collectives)
    assert moved <= collective_stats(compiled.as_text() or "")["total"]["bytes"]


def test_a_kernel_inside_a_scanned_layer():
    """The region sits in a `lax.scan` body (a while loop): kept per layer."""

    def stack(ws, x):
        def body(h, w):
            out = jax.shard_map(
                layer, mesh=AUTO,
                in_specs=(P("batch"), P(None, "model"), P("model", None)), out_specs=P("batch"),
            )(h, *w)
            return jnp.tanh(out), None

        return jax.lax.scan(body, x, ws)[0].sum()

    ws, x = (rand(3, 8, 16), rand(3, 16, 8)), rand(32, 8)
    got = batch_parallel(stack, check=True)(ws, x)
    assert_leaves_close(got, jax.jit(stack)(ws, x))


def test_a_kernel_summing_over_every_axis_with_no_tactic():
    def contract(x, w):
        return jax.shard_map(
            lambda a, b: jax.lax.psum(a @ b, ("batch", "model")), mesh=AUTO,
            in_specs=(P(None, ("batch", "model")), P(("batch", "model"))), out_specs=P(),
        )(x, w)

    x, w = rand(4, 16), rand(16, 3)
    got = partir.jit(contract, mesh=MESH, tactics=[], check=True)(x, w)
    assert_leaves_close(got, jax.jit(contract)(x, w))


def ring_sum(a):
    """The sum over "batch", passing parts around the ring (as ring attention
    passes its keys and values): a ppermute in a fori_loop."""

    def hop(_, carry):
        acc, message = carry
        message = jax.lax.ppermute(message, "batch", [(i, (i + 1) % 4) for i in range(4)])
        return acc + message, message

    return jax.lax.fori_loop(0, 3, hop, (a, a))[0]


def gather_and_scatter(a):
    whole = jax.lax.all_gather(a, "model", axis=1, tiled=True)
    return whole[:, :4] * 3.0 + jax.lax.psum_scatter(whole, "model", scatter_dimension=1, tiled=True)


@pytest.mark.parametrize("kernel", [ring_sum, gather_and_scatter])
def test_kernels_with_ppermute_all_gather_and_psum_scatter(kernel):
    def fn(x):
        y = jax.shard_map(
            kernel, mesh=AUTO, in_specs=P("batch", "model"), out_specs=P("batch", "model"),
            check_vma=kernel is ring_sum,
        )(jnp.cos(x))
        return y.sum(axis=0)

    x = rand(16, 8)
    assert_leaves_close(partir.jit(fn, mesh=MESH, tactics=[], check=True)(x), jax.jit(fn)(x))


def _max_and_min(a):
    return jax.lax.pmax(a, "model") - jax.lax.pmin(jnp.sin(a), ("batch", "model"))


def _all_to_all(a):
    return jax.lax.all_to_all(a, "model", 0, 1, tiled=True) * 2.0


def _axis_index(a):
    """JAX writes axis_index as arithmetic on stablehlo.partition_id."""
    rows = jax.lax.axis_index("batch").astype(jnp.float32)
    both = jax.lax.axis_index(("batch", "model")).astype(jnp.float32)
    return a * rows + both


@pytest.mark.parametrize(
    "kernel, out_spec",
    [(_max_and_min, P("batch", "model")), (_all_to_all, P("batch", "model")),
     (_axis_index, P("batch", "model"))],
    ids=["pmax-pmin", "all-to-all", "axis-index"],
)
def test_kernels_with_pmax_pmin_all_to_all_and_axis_index(kernel, out_spec):
    def fn(x):
        y = jax.shard_map(
            kernel, mesh=AUTO, in_specs=P("batch", "model"), out_specs=out_spec, check_vma=False,
        )(jnp.cos(x))
        return y.sum(axis=1)

    x = rand(16, 8)
    lowered = batch_parallel(fn, check=True).lower(x)
    assert_leaves_close(lowered.compile()(x), jax.jit(fn)(x))
    kinds = {c.kind for c in lowered.report().collectives if c.needed_by == MANUAL_COLLECTIVE}
    expected = {_max_and_min: {"all_reduce"}, _all_to_all: {"all_to_all"}, _axis_index: set()}
    assert kinds == expected[kernel]
    if kernel is _max_and_min:
        assert "lax.pmax(" in lowered.source and "lax.pmin(" in lowered.source
    if kernel is _axis_index:  # JAX's partition_id / stride % size: one axis's index
        assert "lax.axis_index(('batch',))" in lowered.source
        assert "lax.axis_index(('model',))" in lowered.source


# --------------------------------------------------------------------------
# partir-opt on the text JAX exports


def test_partir_opt_partitions_jax_text_with_a_shard_map_kernel(tmp_path):
    """`jax.jit(step).lower(...).as_text()` holds the kernel's
    `stablehlo.all_reduce` (and its channel handle, replica groups): it
    parses, runs on the reference interpreter per device (--check-numerics
    checks every pass against the input), and the emitted shard_map program,
    with the kernel's psum over "model", gives jax.jit's numbers."""
    from lowering.loader import load_source
    from partir.opt import main as partir_opt

    x, w = rand(16, 8), rand(8, 4)
    source, out = tmp_path / "step.mlir", tmp_path / "step.py"
    source.write_text(jax.jit(step).lower(x, w).as_text())
    assert '"stablehlo.all_reduce"' in source.read_text()
    pipeline = (
        'partir-declare-mesh{axes="batch=4","model=2"},partir-annotations,'
        "partir-lower-spmd,partir-emit-jax"
    )
    assert partir_opt([str(source), "-p", pipeline, "--check-numerics", "-o", str(out)]) == 0
    text = out.read_text()
    assert "lax.psum(" in text and "('model',)" in text
    program = load_source(text, "step_from_text")
    (got,) = program.build(program.make_mesh())(x, w)
    assert_leaves_close(got, jax.jit(step)(x, w))


def test_the_jax_text_of_every_kept_collective_parses_and_prints_back():
    def fn(x):
        def kernel(a):
            b = gather_and_scatter(a) + _max_and_min(a) + _axis_index(a)
            return _all_to_all(ring_sum(b))

        return jax.shard_map(
            kernel, mesh=AUTO, in_specs=P("batch", "model"), out_specs=P("batch", "model"),
            check_vma=False,
        )(x)

    text = jax.jit(fn).lower(rand(16, 8)).as_text()
    module = PartirParser(make_context(), text).parse_module()
    module.verify()
    printed = str(module)
    for name in ("all_gather", "reduce_scatter", "collective_permute", "all_to_all",
                 "all_reduce", "partition_id"):
        assert f"stablehlo.{name}" in printed
    again = PartirParser(make_context(), printed).parse_module()
    assert str(again) == printed


# --------------------------------------------------------------------------
# A shard_map manual over some axes (axis_names=)


def model_manual(kernel, in_spec, out_spec):
    def fn(x):
        y = jax.shard_map(
            kernel, mesh=AUTO, in_specs=in_spec, out_specs=out_spec, axis_names={"model"},
            check_vma=False,
        )(jnp.tanh(x))
        return (y * 3.0).sum(axis=1)

    return fn


def _psum_columns(a):
    return jax.lax.psum(a * 2.0, "model")


def _max_by_model_index(a):
    """axis_index of a manual axis: JAX writes a region nested over the others."""
    index = jax.lax.axis_index("model").astype(jnp.float32)
    whole = jax.lax.all_gather(a, "model", axis=1, tiled=True)
    return jax.lax.pmax(a + index, "model") - whole.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(
    "kernel, in_spec, out_spec",
    [(_psum_columns, P(None, "model"), P()), (_max_by_model_index, P(None, "model"), P())],
    ids=["psum", "axis-index-pmax-all-gather"],
)
def test_a_shard_map_manual_over_some_axes(kernel, in_spec, out_spec):
    """The body runs whole over "batch" (not manual), on each device's
    columns along "model"; BatchParallel splits the work around it."""
    fn = model_manual(kernel, in_spec, out_spec)
    x = rand(16, 8)
    lowered = batch_parallel(fn, check=True).lower(x)
    assert_leaves_close(lowered.compile()(x), jax.jit(fn)(x))
    kept = [c for c in lowered.report().collectives if c.needed_by == MANUAL_COLLECTIVE]
    assert kept and {c.axes for c in kept} == {("model",)}


def test_a_training_step_through_a_kernel_manual_over_model_only():
    """Megatron's MLP written by hand over "model" alone (the batch left to
    the compiler): jax.grad's transposed region is kept too, BatchParallel
    splits the rest, every stage checks against jax.jit."""

    def loss(params, batch):
        h = jnp.tanh(batch["x"] @ params["embed"])
        out = jax.shard_map(
            layer, mesh=AUTO, in_specs=(P(), P(None, "model"), P("model", None)),
            out_specs=P(), axis_names={"model"},
        )(h, params["w1"], params["w2"])
        return jnp.mean((out - batch["y"]) ** 2)

    def step(params, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    params = {"embed": rand(6, 8), "w1": rand(8, 16), "w2": rand(16, 8)}
    batch = {"x": rand(32, 6), "y": rand(32, 8)}
    fn = partir.jit(
        step, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs=["batch/*"])], check=True,
    )
    assert_leaves_close(fn(params, batch), jax.jit(step)(params, batch))
    kept = [c for c in fn.lower(params, batch).report().collectives
            if c.needed_by == MANUAL_COLLECTIVE]
    assert len(kept) >= 2 and {c.axes for c in kept} == {("model",)}


def test_partir_opt_reads_a_shard_map_manual_over_some_axes(tmp_path):
    """JAX's text of it (open specs, the body's own constraints, the region
    axis_index nests) runs through partir-opt: the reference interpreter runs
    it as written (--check-numerics), the emitted program gives jax.jit's numbers."""
    from lowering.loader import load_source
    from partir.opt import main as partir_opt

    fn = model_manual(_max_by_model_index, P(None, "model"), P())
    x = rand(16, 8)
    source, out = tmp_path / "fn.mlir", tmp_path / "fn.py"
    source.write_text(jax.jit(fn).lower(x).as_text())
    pipeline = (
        'partir-declare-mesh{axes="batch=4","model=2"},partir-annotations,'
        "partir-lower-spmd,partir-emit-jax"
    )
    assert partir_opt([str(source), "-p", pipeline, "--check-numerics", "-o", str(out)]) == 0
    program = load_source(out.read_text(), "model_manual_from_text")
    (got,) = program.build(program.make_mesh())(x)
    assert_leaves_close(got, jax.jit(fn)(x))


def _constraint_inside(x):
    def kernel(a):
        return jax.lax.with_sharding_constraint(a * 2.0, P("batch", None))

    return jax.shard_map(
        kernel, mesh=AUTO, in_specs=P(None, "model"), out_specs=P(None, "model"),
        axis_names={"model"},
    )(x)


def test_what_partir_cannot_keep_is_refused_by_name():
    with pytest.raises(
        partir.PartirError,
        match=r"sdy.sharding_constraint at .*test_manual_regions.py:\d+.* splits over \"batch\"; "
        r"partir runs the body whole",
    ):
        with jax.set_mesh(AUTO):
            partir.jit(_constraint_inside, mesh=MESH, tactics=[])(rand(16, 8))


def test_a_collective_partir_does_not_know_is_refused_by_name(tmp_path, capsys):
    """A reducer body other than add, maximum or minimum (here a product, as
    no jax.lax call writes it) is a one-line error naming the op and the fix."""
    from partir.opt import main as partir_opt

    text = (ROOT / "tests/filecheck/passes/manual_region_collectives.mlir").read_text()
    source = tmp_path / "product.mlir"
    source.write_text(text.replace("%10 = stablehlo.maximum", "%10 = stablehlo.multiply"))
    assert partir_opt([str(source), "-p", 'partir-declare-mesh{axes="batch=4","model=2"}']) == 1
    err = capsys.readouterr().err
    assert "stablehlo.all_reduce" in err and "partir keeps jax.lax.psum, pmax and pmin" in err
