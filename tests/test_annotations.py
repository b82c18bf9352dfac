"""JAX's own shardings in the program are actions (`partir.Annotations`).

Programs written the way JAX users write them, on the 4x2 CPU mesh: a
`with_sharding_constraint` (a `NamedSharding`, or a bare `PartitionSpec`
under `jax.set_mesh`), a `reshard` under an explicit mesh, an optax step
with a scalar argument; each partitions with jax.jit's numbers, splits the
annotated value as annotated, and lists the annotation with its line.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from dialects.context import make_context
from dialects.parser import PartirParser
from dialects.sdy import ShardingAttr, ShardingConstraintOp
from partir.annotations import states_replication
from partir.importer import import_lowered
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
AUTO = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)
EXPLICIT = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(AxisType.Explicit,) * 2)
RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def line_of(fn, text: str) -> int:
    """The line of `fn`'s source that holds `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def annotated(lowered) -> list:
    return [s for s in lowered.report().selections if s.tactic == "Annotations"]


# --- the sdy dialect ---------------------------------------------------------


def test_shardy_text_parses_and_prints_back():
    text = """builtin.module {
  sdy.mesh @mesh = <["batch"=4, "model"=2]>
  func.func @main(%0: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"batch", ?}p1, {}]>}) -> tensor<8x4xf32> {
    %1 = sdy.sharding_constraint %0 <@mesh, [{}, {"model"}], replicated={"batch"}> : tensor<8x4xf32>
    func.return %1 : tensor<8x4xf32>
  }
}"""
    module = PartirParser(make_context(), text).parse_module()
    module.verify()
    assert str(module) == text
    (op,) = [op for op in module.walk() if isinstance(op, ShardingConstraintOp)]
    assert op.sharding.dims == [(), ("model",)] and op.sharding.axes == ["model", "batch"]


def test_a_scalar_argument_and_a_constraint_import():
    """JAX tags a scalar argument `#sdy.sharding<@empty_mesh, []>`: it
    imports (it was an xDSL ParseError), and the constraint is an op."""

    def f(x, lr):
        return jax.lax.with_sharding_constraint(x * lr, NamedSharding(AUTO, P("batch")))

    module = partir.import_jax(f, rand(8, 4), 0.5)
    (op,) = [op for op in module.walk() if isinstance(op, ShardingConstraintOp)]
    assert op.sharding == ShardingAttr("mesh", [("batch",), ()])


def test_an_unreadable_attribute_is_a_partir_error_naming_the_op():
    from jax._src.interpreters import mlir

    text = """module {
  sdy.mesh @mesh = <["x"=4]>
  func.func public @main(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x":(1)2}]>}) -> tensor<8xf32> {
    return %arg0 : tensor<8xf32>
  }
}"""
    with mlir.make_ir_context():
        from jaxlib.mlir import ir

        module = ir.Module.parse(text)
        with pytest.raises(partir.PartirError, match=r"func.func.*sub-axis of \"x\""):
            import_lowered(module)


# --- with_sharding_constraint ---------------------------------------------------


def mlp(x, w1, w2):
    h = jnp.tanh(x @ w1)
    h = jax.lax.with_sharding_constraint(h, NamedSharding(AUTO, P("batch", "model")))
    return h @ w2


def test_with_sharding_constraint_splits_the_value_as_annotated():
    args = (rand(8, 16), rand(16, 32), rand(32, 4))
    fn = partir.jit(mlp, mesh=MESH)
    assert_leaves_close(fn(*args), jax.jit(mlp)(*args))
    lowered = fn.lower(*args)
    assert [s.name for s in lowered.stages] == ["import", "Annotations", "spmd"]
    # the tanh (and the matmul before it) hold an 2x16 part per device
    assert "stablehlo.tanh %" in lowered.stage("spmd")
    assert "tensor<2x16xf32>" in lowered.stage("spmd")
    # in the core stage, the tanh runs on a 2x16 part inside the loops
    assert "stablehlo.tanh %6 : tensor<2x16xf32>" in lowered.stage("Annotations")
    (batch, model) = annotated(lowered)
    line = line_of(mlp, "with_sharding_constraint")
    assert (batch.dim, batch.axis, model.dim, model.axis) == (0, "batch", 1, "model")
    assert batch.reason == f"with_sharding_constraint at test_annotations.py:{line}"
    assert batch.leaf.startswith("@jit(mlp)/tanh at test_annotations.py:")


def test_a_bare_partition_spec_under_set_mesh():
    def f(x, w):
        h = jax.lax.with_sharding_constraint(jnp.sin(x @ w), P(None, "model"))
        return h * 2

    args = (rand(8, 16), rand(16, 8))
    with jax.set_mesh(AUTO):
        want = jax.jit(f)(*args)
        fn = partir.jit(f, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
        lowered = fn.lower(*args)
        got = fn(*args)
    assert_leaves_close(got, want)
    assert "tensor<2x4xf32>" in lowered.stage("spmd")  # rows over batch, columns over model
    assert [(s.dim, s.axis) for s in annotated(lowered)] == [(1, "model")]


def test_the_annotations_win_and_a_disagreeing_tactic_is_a_reported_conflict():
    """The constraint splits x's rows over "model"; a tactic asking for its
    columns over "model" loses, and the conflict is in `lowered.conflicts`
    and the report."""

    def f(x, w):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(AUTO, P("model", None)))
        return jnp.tanh(x @ w).sum(1)

    args = (rand(8, 16), rand(16, 8))
    fn = partir.jit(f, mesh=MESH, tactics=[partir.ManualPartition({"x": {1: "model"}})])
    assert_leaves_close(fn(*args), jax.jit(f)(*args))
    lowered = fn.lower(*args)
    (conflict,) = lowered.conflicts
    assert conflict.axis == "model" and conflict.values == ("x",)
    assert conflict.winner == "the earlier tiling" and "ManualPartition" in conflict.loser
    report = lowered.report()
    assert report.conflicts == lowered.conflicts and "conflicts       1" in str(report)
    assert "tensor<4x16xf32>" in lowered.stage("spmd")  # x's rows over "model", as annotated


def _hidden_kept_whole_on_dim_1(spec):
    def layer(inputs, proj, out):
        hidden = jax.nn.relu(inputs @ proj)
        hidden = jax.lax.with_sharding_constraint(hidden, NamedSharding(AUTO, spec))
        return (hidden @ out).mean(1)

    return layer


def test_a_tactic_splitting_a_dim_an_annotation_keeps_whole_is_a_reported_conflict():
    """`P("batch", None)` keeps the hidden value's columns whole; a
    ManualPartition whose propagation splits them over "model" is reported,
    naming the annotation's line and the action that split it."""
    layer = _hidden_kept_whole_on_dim_1(P("batch", None))
    args = (rand(8, 12), rand(12, 6), rand(6, 3))
    fn = partir.jit(layer, mesh=MESH, tactics=[partir.ManualPartition({"proj": {1: "model"}})])
    assert_leaves_close(fn(*args), jax.jit(layer)(*args))
    lowered = fn.lower(*args)
    (conflict,) = lowered.conflicts
    line = line_of(layer, "with_sharding_constraint")
    assert conflict.op == "annotation" and conflict.axis == "model"
    assert conflict.loser == f"with_sharding_constraint at test_annotations.py:{line}"
    assert "ManualPartition of proj" in conflict.winner
    assert "P('batch', None) keeps dim 1 whole" in conflict.detail
    assert conflict.values[0].startswith("@jit(layer)/jit(relu)/max at test_annotations.py:")
    assert lowered.report().conflicts == lowered.conflicts


def test_megatron_splitting_a_constrained_hidden_value_is_a_reported_conflict():
    """A pytree of parameters: Megatron's column split of `up` reaches the
    hidden value the constraint keeps whole on its columns."""

    def block(params, x):
        hidden = jnp.tanh(x @ params["up"])
        hidden = jax.lax.with_sharding_constraint(hidden, NamedSharding(AUTO, P("batch", None)))
        return hidden @ params["down"]

    args = ({"up": rand(10, 8), "down": rand(8, 5)}, rand(4, 10))
    tactic = partir.Megatron("model", column=("params/up",), row=("params/down",))
    fn = partir.jit(block, mesh=MESH, tactics=[tactic])
    assert_leaves_close(fn(*args), jax.jit(block)(*args))
    (conflict,) = fn.lower(*args).conflicts
    line = line_of(block, "with_sharding_constraint")
    assert conflict.loser == f"with_sharding_constraint at test_annotations.py:{line}"
    assert "Megatron" in conflict.winner and conflict.axis == "model"


def test_an_unconstrained_dim_may_be_split():
    """`P.UNCONSTRAINED` leaves the dim to partir: no conflict."""
    layer = _hidden_kept_whole_on_dim_1(P("batch", P.UNCONSTRAINED))
    args = (rand(8, 12), rand(12, 6), rand(6, 3))
    fn = partir.jit(layer, mesh=MESH, tactics=[partir.ManualPartition({"proj": {1: "model"}})])
    assert_leaves_close(fn(*args), jax.jit(layer)(*args))
    lowered = fn.lower(*args)
    assert lowered.conflicts == []
    assert "tensor<2x3xf32>" in lowered.stage("spmd")  # rows over batch, columns over model


def _kept_whole(x, w):
    hidden = jnp.tanh(x @ w)
    hidden = jax.lax.with_sharding_constraint(hidden, NamedSharding(AUTO, P(None, None)))
    return hidden.sum(axis=1)


def test_a_fully_replicated_constraint_is_honoured_a_split_of_it_reported():
    """`P(None, None)` keeps the whole value on every device: BatchParallel
    splitting its rows over "batch" is a reported conflict naming the
    annotation and its line, not silently resolved (the numbers stay jax.jit's)."""
    args = (rand(8, 6), rand(6, 4))
    fn = partir.jit(_kept_whole, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    assert_leaves_close(fn(*args), jax.jit(_kept_whole)(*args))
    lowered = fn.lower(*args)
    assert [s.name for s in lowered.stages] == ["import", "Annotations", "BatchParallel", "spmd"]
    (conflict,) = lowered.conflicts
    line = line_of(_kept_whole, "with_sharding_constraint")
    assert conflict.op == "annotation" and conflict.axis == "batch"
    assert conflict.loser == f"with_sharding_constraint at test_annotations.py:{line}"
    assert "BatchParallel" in conflict.winner
    assert "P(None, None) keeps dim 0 whole" in conflict.detail


def test_a_fully_replicated_constraint_no_tactic_splits_is_no_conflict():
    """Splitting what the constraint does not reach (the sum's result) is no conflict."""
    args = (rand(8, 6), rand(6, 4))
    fn = partir.jit(_kept_whole, mesh=MESH, tactics=[partir.ManualPartition({"x": {1: "model"}})])
    assert_leaves_close(fn(*args), jax.jit(_kept_whole)(*args))
    assert fn.lower(*args).conflicts == []


def test_jax_s_own_replicated_constraints_are_no_conflicts():
    """Under an explicit mesh JAX types every op's result, so a random draw
    (`jax.random`'s helpers) and each op around it carry replicated
    constraints JAX wrote, not the user ("the sharding in add's type"):
    BatchParallel splits through them with no conflict."""

    def f(x, key_data):
        key = jax.random.wrap_key_data(key_data)
        return (x + jax.random.normal(key, x.shape)) * 2.0

    x = rand(8, 4)
    key_data = np.asarray(jax.random.key_data(jax.random.key(0)))
    with jax.set_mesh(EXPLICIT):
        fn = partir.jit(f, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
        lowered = fn.lower(x, key_data)
        got = lowered.compile()(x, key_data)
        want = jax.jit(f)(x, key_data)
    assert_leaves_close(got, want)
    with jax.set_mesh(EXPLICIT):
        module = partir.import_jax(f, x, key_data)
    jax_s = [op for op in module.walk() if isinstance(op, ShardingConstraintOp)]
    assert len(jax_s) > 10 and not any(any(op.sharding.dims) for op in jax_s)
    assert not any(states_replication(op) for op in jax_s)
    assert [s.name for s in lowered.stages] == ["import", "BatchParallel", "spmd"]
    assert lowered.conflicts == []
    assert "tensor<2x4xf32>" in lowered.stage("spmd")  # split over batch through them


def test_a_tactic_splitting_a_dim_an_argument_type_keeps_whole_is_a_reported_conflict():
    """Under an explicit mesh, `x` typed `P("batch")` keeps its columns
    whole: a ManualPartition splitting them over "model" is reported."""

    def f(x, w):
        return jnp.sin(x) @ w

    with jax.set_mesh(EXPLICIT):
        x, w = jax.device_put(rand(8, 6), P("batch")), jax.device_put(rand(6, 3), P())
        want = jax.jit(f)(x, w)
        fn = partir.jit(f, mesh=MESH, tactics=[partir.ManualPartition({"x": {1: "model"}})])
        lowered = fn.lower(x, w)
        got = lowered.compile()(x, w)
    assert_leaves_close(got, want)
    # x's type, and the type JAX gives sin(x) (a constraint at the user's line)
    (argument, typed) = lowered.conflicts
    assert (argument.values, argument.axis, argument.loser) == (("x",), "model", "argument sharding")
    line = line_of(f, "jnp.sin")
    assert typed.loser == f"the sharding in sin's type at test_annotations.py:{line}"
    for conflict in (argument, typed):
        assert "ManualPartition of x" in conflict.winner and "keeps dim 1 whole" in conflict.detail


def test_an_annotation_on_another_mesh_names_both_meshes():
    other = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2)

    def f(x):
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(other, P("data")))

    with pytest.raises(partir.PartirError) as err:
        partir.jit(f, mesh=MESH).lower(rand(8, 4))
    message = str(err.value)
    assert '"data"=2' in message and '"batch"=4, "model"=2' in message
    assert f"test_annotations.py:{line_of(f, 'with_sharding_constraint')}" in message


def test_annotations_placed_in_the_schedule_run_there():
    """`Annotations` in the schedule is not prepended again: placed after
    BatchParallel, the batch split comes first and the annotation refines."""
    args = (rand(8, 16), rand(16, 32), rand(32, 4))
    tactics = [partir.BatchParallel("batch", inputs="x"), partir.Annotations()]
    fn = partir.jit(mlp, mesh=MESH, tactics=tactics)
    assert_leaves_close(fn(*args), jax.jit(mlp)(*args))
    lowered = fn.lower(*args)
    assert [s.name for s in lowered.stages] == ["import", "BatchParallel", "Annotations", "spmd"]
    assert "tensor<2x16xf32>" in lowered.stage("spmd")
    # the hidden value is computed per batch part by then: BatchParallel's split
    # stands, and the report says the annotation's batch split was not applied
    (conflict,) = lowered.conflicts
    assert conflict.axis == "batch" and "BatchParallel" in conflict.winner
    assert "Annotations" in conflict.loser and "place Annotations first" in conflict.detail
    assert "sdy.sharding_constraint" in lowered.stage("BatchParallel")
    assert "sdy." not in lowered.stage("Annotations")


def test_check_runs_the_stages_that_hold_annotations():
    args = (rand(8, 16), rand(16, 32), rand(32, 4))
    tactics = [partir.BatchParallel("batch", inputs="x"), partir.Annotations()]
    fn = partir.jit(mlp, mesh=MESH, tactics=tactics, check=True)
    assert_leaves_close(fn(*args), jax.jit(mlp)(*args))


def test_an_annotation_that_cannot_apply_is_a_partir_error_with_its_line():
    def f(x):
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(AUTO, P(None, "batch")))

    with pytest.raises(partir.PartirError) as err:
        partir.jit(f, mesh=MESH).lower(rand(8, 2))
    line = line_of(f, "with_sharding_constraint")
    assert f"with_sharding_constraint at test_annotations.py:{line}" in str(err.value)
    assert 'smaller than mesh axis "batch"' in str(err.value)


def test_a_scalar_argument_alone_adds_no_stage():
    """JAX's `@empty_mesh` tag on a scalar splits nothing: no Annotations stage."""

    def f(x, lr):
        return x * lr

    lowered = partir.jit(f, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")]).lower(
        rand(8, 4), 0.5
    )
    assert [s.name for s in lowered.stages] == ["import", "BatchParallel", "spmd"]
    assert "sdy" not in lowered.stage("BatchParallel")


# --- explicit mode ---------------------------------------------------------------


def test_reshard_under_an_explicit_mesh():
    def f(x, w):
        h = x @ w
        h = jax.sharding.reshard(h, P("batch", "model"))
        return jnp.tanh(h)

    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(rand(8, 16), P("batch", None))
        w = jax.device_put(rand(16, 8), P(None, None))
        want = jax.jit(f)(x, w)
        fn = partir.jit(f, mesh=MESH)
        lowered = fn.lower(x, w)
        got = fn(x, w)
    assert_leaves_close(got, want)
    spmd = lowered.stage("spmd")
    assert "tensor<2x4xf32>" in spmd and lowered.collectives == []
    assert lowered.conflicts == []  # the type of x @ w, then the reshard: both the user's
    picks = {(s.leaf, s.dim, s.axis, s.reason.split(" at ")[0]) for s in annotated(lowered)}
    assert ("x", 0, "batch", "argument sharding") in picks
    assert ("result", 1, "model", "result sharding") in picks
    assert any(p[3] == "the sharding in dot_general's type" for p in picks)
    line = line_of(f, "reshard(")
    assert any(s.reason == f"reshard at test_annotations.py:{line}" for s in annotated(lowered))
    # the result's explicit sharding is the emitted program's out_spec
    out_specs = lowered.source.split("OUT_SPECS = (", 1)[1].split(")\n", 1)[0]
    assert "P('batch', 'model')" in out_specs


def test_an_auto_mode_placement_is_not_an_annotation():
    """Where an array was put (`jax.device_put` on an auto mesh) is not part
    of the program: no action, the tactics decide."""
    x = jax.device_put(rand(8, 4), NamedSharding(AUTO, P("batch", "model")))
    lowered = partir.jit(lambda x: x * 2, mesh=MESH).lower(x)
    assert [s.name for s in lowered.stages] == ["import", "spmd"]
    assert "sdy" not in lowered.stage("import")


# --- a training step -------------------------------------------------------------


def test_an_optax_adam_step_with_a_constraint_imports_and_honours_it():
    optax = pytest.importorskip("optax")
    opt = optax.adam(1e-2)

    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"])
        h = jax.lax.with_sharding_constraint(h, NamedSharding(AUTO, P("batch", "model")))
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(params, opt_state, x, y):
        grads = jax.grad(loss)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    params = {"w1": rand(16, 32), "w2": rand(32, 4)}
    args = (params, opt.init(params), rand(8, 16), rand(8, 4))
    fn = partir.jit(step, mesh=MESH)
    assert_leaves_close(fn(*args), jax.jit(step)(*args))
    lowered = fn.lower(*args)
    assert "tensor<2x16xf32>" in lowered.stage("spmd")  # the hidden value, split as annotated
    line = line_of(loss, "with_sharding_constraint")
    assert {s.reason for s in annotated(lowered)} == {
        f"with_sharding_constraint at test_annotations.py:{line}"
    }


# --- a flax linen transformer with logical constraints --------------------------

LOGICAL_RULES = (
    ("batch", "batch"), ("length", None), ("embed", None), ("heads", "model"), ("kv", None),
    ("mlp", "model"), ("vocab", None),
)
"""MaxText's way: activations named by logical axes, mapped onto the mesh."""


def _linen_transformer():
    import flax.linen as nn

    heads, head_dim, hidden, vocab = 4, 8, 64, 16

    class Attention(nn.Module):
        @nn.compact
        def __call__(self, x):
            def project(name):
                y = nn.DenseGeneral((heads, head_dim), use_bias=False, name=name)(x)
                return nn.with_logical_constraint(y, ("batch", "length", "heads", "kv"))

            q, k, v = project("query"), project("key"), project("value")
            w = jax.nn.softmax(jnp.einsum("blhk,bmhk->bhlm", q, k) / np.sqrt(head_dim), axis=-1)
            o = nn.with_logical_constraint(
                jnp.einsum("bhlm,bmhk->blhk", w, v), ("batch", "length", "heads", "kv")
            )
            return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), use_bias=False, name="out")(o)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
            x = x + Attention()(nn.LayerNorm()(x))
            h = nn.gelu(nn.Dense(hidden)(nn.LayerNorm()(x)))
            h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
            return nn.with_logical_constraint(x + nn.Dense(x.shape[-1])(h),
                                              ("batch", "length", "embed"))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(vocab)(Block()(x))

    return Model(), Block


def test_a_flax_transformer_with_logical_constraints_partitions_with_annotations_only():
    """Only `Annotations`: the logical constraints split the activations over
    "batch" and the heads and MLP units over "model", propagation decides
    the rest, the numbers are jax.jit's, and partir moves no more bytes than
    jax.jit's compiled program on the same mesh."""
    pytest.importorskip("flax")
    import flax.linen as nn
    import optax  # type: ignore[import-untyped]

    from benchmarks.hlo_stats import collective_stats

    model, block = _linen_transformer()
    opt = optax.adam(1e-3)

    def step(params, opt_state, x, y):
        def loss(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    x, y = rand(8, 8, 32), RNG.integers(0, 16, (8, 8)).astype(np.int32)
    with jax.set_mesh(AUTO), nn.logical_axis_rules(LOGICAL_RULES):
        params = jax.jit(model.init)(jax.random.key(0), x)
        # two steps in: Adam's first update is the gradient's sign, which
        # turns a rounding difference near zero into a whole step
        state = (params, opt.init(params))
        for _ in range(2):
            state = jax.jit(step)(*state, x, y)[1:]
        args = jax.tree.map(np.asarray, (*state, x, y))  # where jax.jit put them: no matter
        compiled = jax.jit(step).lower(*args).compile()
        want = compiled(*args)
        jit_bytes = collective_stats(compiled.as_text() or "")["total"]
        lowered = partir.jit(step, mesh=MESH).lower(*args)
        got = lowered.compile()(*args)
    assert_leaves_close(got, want)
    assert [s.name for s in lowered.stages] == ["import", "Annotations", "spmd"]
    partir_bytes = sum(c.bytes_per_device for c in lowered.collectives)
    assert partir_bytes <= jit_bytes["bytes"], (partir_bytes, jit_bytes)
    spmd = lowered.stage("spmd")
    assert "tensor<2x8x2x8xf32>" in spmd  # q, k, v: rows over batch, heads over model
    assert "tensor<2x8x32xf32>" in spmd  # the MLP's hidden units over model
    line = line_of(block, '("batch", "length", "mlp")')
    assert any(s.reason == f"with_sharding_constraint at test_annotations.py:{line}"
               and s.axis == "model" for s in annotated(lowered))


def test_an_annotated_program_exports_to_onnx():
    """The ONNX export reads the import stage, where the constraint still is:
    it is its value there, and the model runs with jax.jit's numbers."""
    ort = pytest.importorskip("onnxruntime")
    args = (rand(8, 16), rand(16, 32), rand(32, 4))
    model = partir.jit(mlp, mesh=MESH).lower(*args).to_onnx()
    session = ort.InferenceSession(model.SerializeToString())
    (got,) = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), args, strict=True)})
    assert_leaves_close(got, np.asarray(jax.jit(mlp)(*args)))


def test_an_explicit_mode_training_step():
    """A step written for an explicit mesh (arguments typed by their
    shardings, a `reshard`, a matmul with `out_sharding`) partitions with
    jax.jit's numbers and no tactic: the parameters stay split as typed, the
    gradients are summed over "batch", and no more bytes move than in jax.jit."""
    optax = pytest.importorskip("optax")
    from benchmarks.hlo_stats import collective_stats

    opt = optax.sgd(1e-2)

    def loss(params, x, y):
        h = jax.sharding.reshard(jnp.tanh(x @ params["w1"]), P("batch", "model"))
        out = jnp.matmul(h, params["w2"], out_sharding=P("batch", None))
        return jnp.mean((out - y) ** 2)

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    with jax.set_mesh(EXPLICIT):
        params = {
            "w1": jax.device_put(rand(16, 32), P(None, "model")),
            "w2": jax.device_put(rand(32, 4), P("model", None)),
        }
        x, y = jax.device_put(rand(8, 16), P("batch")), jax.device_put(rand(8, 4), P("batch"))
        args = (params, opt.init(params), x, y)
        compiled = jax.jit(step).lower(*args).compile()
        want = compiled(*args)
        lowered = partir.jit(step, mesh=MESH).lower(*args)
        got = lowered.compile()(*args)
    assert_leaves_close(got, want)
    assert [s.name for s in lowered.stages] == ["import", "Annotations", "spmd"]
    assert lowered.conflicts == []
    in_specs = lowered.source.split("IN_SPECS = (", 1)[1].split(")\n", 1)[0]
    assert "P(None, 'model'),  # a0 params['w1']" in in_specs
    assert ("all_reduce", ("batch",)) in {(c.kind, c.axes) for c in lowered.collectives}
    jit_bytes = collective_stats(compiled.as_text() or "")["total"]["bytes"]
    assert sum(c.bytes_per_device for c in lowered.collectives) <= jit_bytes
