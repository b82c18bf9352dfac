"""`partir.jit` end to end on the 8-device CPU mesh: numbers, collectives, errors."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from dialects.interpreter.spmd import run_spmd
from examples import block_forward, block_train_step, mlp_train_step, stack_train_step
from lowering.emittable import unemittable_ops
from lowering.to_jax import UnsupportedOpError
from tests.jaxpr_collectives import emitted_collectives
from tests.numerics import assert_close

MESH = partir.Mesh({"batch": 4, "model": 2})
def run_and_check(program, args, tactics, mesh=MESH):
    """Run under partir.jit; results equal jax.jit per leaf. Returns the lowering."""
    fn = partir.jit(program, mesh=mesh, tactics=tactics)
    lowered = fn.lower(*args)
    compiled = lowered.compile()
    got = compiled(*args)
    ref = jax.jit(program)(*args)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(ref)
    for i, (g, r) in enumerate(zip(jax.tree_util.tree_leaves(got),
                                   jax.tree_util.tree_leaves(ref), strict=True)):
        assert isinstance(g, jax.Array)
        assert_close(np.asarray(g), np.asarray(r), what=f"leaf {i}")
    return lowered, compiled


@pytest.mark.parametrize("tactics", [
    [partir.BatchParallel("batch")],
    [partir.Megatron("model")],
    [partir.BatchParallel("batch"), partir.Megatron("model")],
    [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)],
], ids=["dp", "tp", "dp+tp", "zero3"])
def test_mlp_train_step(tactics):
    run_and_check(mlp_train_step.program, mlp_train_step.make_args(), tactics)


def test_block_train_step_with_adam_on_4x2():
    args = block_train_step.make_args()
    lowered, compiled = run_and_check(block_train_step.program, args,
                                      [partir.BatchParallel("batch"), partir.Megatron("model")])
    # The SPMD interpreter agrees with the JAX run.
    got = run_spmd(lowered.module, jax.tree_util.tree_leaves(args))
    ran = jax.tree_util.tree_leaves(compiled(*args))
    for g, r in zip(got, ran, strict=True):
        assert_close(g, np.asarray(r))


def test_two_layer_stack_train_step():
    run_and_check(stack_train_step.program, stack_train_step.make_args(layers_=2),
                  [partir.BatchParallel("batch"), partir.Megatron("model")])


def test_megatron_block_forward_has_exactly_two_all_reduces():
    args = block_forward.make_args()
    _, compiled = run_and_check(block_forward.program, args, [partir.Megatron("model")])
    assert emitted_collectives(compiled, args) == {("all_reduce", ("model",)): 2}


def test_batch_parallel_mlp_step_only_all_reduces_over_batch():
    args = mlp_train_step.make_args()
    _, compiled = run_and_check(mlp_train_step.program, args, [partir.BatchParallel("batch")])
    counts = emitted_collectives(compiled, args)
    assert set(counts) == {("all_reduce", ("batch",))}
    assert counts[("all_reduce", ("batch",))] == 5  # 4 gradients + the loss


def test_zero3_gathers_parameters_and_reduce_scatters_gradients():
    args = mlp_train_step.make_args()
    _, compiled = run_and_check(mlp_train_step.program, args,
                                [partir.BatchParallel("batch"), partir.ZeRO("batch", 3)],
                                partir.Mesh({"batch": 4}))
    counts = emitted_collectives(compiled, args)
    assert counts[("all_gather", ("batch",))] == 4
    assert counts[("reduce_scatter", ("batch",))] == 4
    assert counts[("all_reduce", ("batch",))] == 1  # the loss only


RNG = np.random.default_rng(1)
X = RNG.standard_normal((8, 16)).astype(np.float32)
W = RNG.standard_normal((16, 4)).astype(np.float32)
Z = RNG.standard_normal((8, 4)).astype(np.float32)


@pytest.mark.parametrize(("name", "program", "args", "spec", "expected"), [
    ("P->B", lambda x, w: x @ w, (X, W), {"x": {1: "model"}, "w": {0: "model"}},
     {("all_reduce", ("model",)): 1}),
    ("P->S", lambda x, w, z: x @ w + z, (X, W, Z),
     {"x": {1: "batch"}, "w": {0: "batch"}, "z": {0: "batch"}},
     {("reduce_scatter", ("batch",)): 1}),
    ("S->B", lambda x: jnp.max(jnp.exp(x), axis=0), (X,), {"x": {0: "batch"}},
     {("all_gather", ("batch",)): 1}),
    ("Si->Sj", lambda x, y: jnp.exp(x) + y, (X, X), {"x": {0: "batch"}, "y": {1: "batch"}},
     {("all_to_all", ("batch",)): 1}),
    ("B->S", lambda x, y: (x + y, jnp.sum(y)), (X, X), {"x": {0: "batch"}}, {}),
])
def test_distpar_conversions(name, program, args, spec, expected):
    lowered, compiled = run_and_check(program, args, [partir.ManualPartition(spec)])
    assert emitted_collectives(compiled, args) == expected, name
    if name == "B->S":  # a local slice by axis index: no communication at all
        assert "lax.axis_index" in lowered.source


def test_lower_exposes_every_stage():
    fn = partir.jit(mlp_train_step.program, mesh=MESH,
                    tactics=[partir.BatchParallel("batch"), partir.Megatron("model")])
    lowered = fn.lower(*mlp_train_step.make_args())
    assert [s.name for s in lowered.stages] == ["import", "BatchParallel", "Megatron", "spmd"]
    assert "partir.loop" in lowered.stage("Megatron") and "partir.loop" not in lowered.stage("import")
    assert "spmd.all_reduce" in lowered.stage("spmd")
    assert "jax.shard_map" in lowered.source and lowered.source_path.read_text() == lowered.source
    kinds = collections.Counter((c.kind, c.axes) for c in lowered.collectives)
    assert kinds[("all_reduce", ("batch",))] == 5
    assert all(c.bytes_per_device > 0 for c in lowered.collectives)
    assert lowered.conflicts == []


def test_calls_are_cached_per_signature():
    fn = partir.jit(mlp_train_step.program, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    args = mlp_train_step.make_args()
    fn(*args)
    fn(*args)
    assert len(fn._compiled) == 1
    fn(*mlp_train_step.make_args(batch=8))
    assert len(fn._compiled) == 2


def test_a_call_after_lower_runs_that_lowering(monkeypatch):
    """`f.lower(*args)` then `f(*args)` partitions once, also from abstract shapes."""
    import partir.api

    made = []
    real = partir.api.lower
    monkeypatch.setattr(partir.api, "lower", lambda *a, **k: made.append(1) or real(*a, **k))
    fn = partir.jit(mlp_train_step.program, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    args = mlp_train_step.make_args()
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    lowered = fn.lower(*shapes)
    got = fn(*args)
    fn(*args)
    assert len(made) == 1 and fn._lowered == {}
    for g, r in zip(jax.tree_util.tree_leaves(got),
                    jax.tree_util.tree_leaves(lowered.compile()(*args)), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


def test_the_first_call_runs_without_the_stages(monkeypatch):
    """The first call lets go of its `Lowered` (the xDSL modules) before the
    emitted program is traced and compiled, and still gives jax.jit's numbers."""
    import weakref

    from partir.lowered import Lowered

    alive = []
    real = Lowered.compile

    def compile_(self):
        compiled = real(self)
        module, run = weakref.ref(self.module), compiled.run
        compiled.run = lambda *leaves: alive.append(module() is not None) or run(*leaves)
        return compiled

    monkeypatch.setattr(Lowered, "compile", compile_)
    args = mlp_train_step.make_args(batch=8)
    fn = partir.jit(mlp_train_step.program, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    got = fn(*args)
    assert alive == [False]
    for g, r in zip(jax.tree_util.tree_leaves(got),
                    jax.tree_util.tree_leaves(jax.jit(mlp_train_step.program)(*args)),
                    strict=True):
        assert_close(np.asarray(g), np.asarray(r))


def test_a_jax_mesh_is_accepted():
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    mesh = jax.sharding.Mesh(devices, ("batch", "model"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
    run_and_check(mlp_train_step.program, mlp_train_step.make_args(),
                  [partir.BatchParallel("batch")], mesh)


def test_unknown_axis_and_dims_smaller_than_the_axis_are_clear_errors():
    args = mlp_train_step.make_args(batch=12)
    with pytest.raises(partir.TacticError, match='unknown mesh axis "data"'):
        partir.jit(mlp_train_step.program, mesh=MESH,
                   tactics=[partir.BatchParallel("data")])(*args)
    few = mlp_train_step.make_args(batch=4)
    with pytest.raises(partir.TacticError, match=r'has size 4, fewer elements than mesh axis "batch"'):
        partir.jit(mlp_train_step.program, mesh=partir.Mesh({"batch": 8}),
                   tactics=[partir.BatchParallel("batch")])(*few)


def test_a_mesh_larger_than_the_devices_is_a_clear_error():
    fn = partir.jit(mlp_train_step.program, mesh=partir.Mesh({"batch": 4, "model": 4}),
                    tactics=[partir.BatchParallel("batch")])
    with pytest.raises(ValueError, match=r"needs 16 devices, but jax.devices\(\) has 8"):
        fn(*mlp_train_step.make_args())


def test_an_op_the_lowering_cannot_emit_is_named():
    def spectrum(x):
        return jnp.fft.fft(x).real

    fn = partir.jit(spectrum, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")])
    with pytest.raises(UnsupportedOpError, match=r"stablehlo\.fft"):
        fn(X)


def test_keyword_arguments_bind_to_their_positions():
    fn = partir.jit(mlp_train_step.program, mesh=MESH, tactics=[partir.BatchParallel("batch")])
    params, x, y = mlp_train_step.make_args()
    got = fn(params, y=y, x=x)
    ref = jax.jit(mlp_train_step.program)(params, x, y)
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref), strict=True):
        assert_close(np.asarray(g), np.asarray(r))
    assert fn.lower(params, x=x, y=y).stages[0].name == "import"


@pytest.mark.parametrize("update", ["set", "add", "mul", "max", "min"])
def test_scatter_forms_run(update):
    def fn(x, i, v):
        return getattr(x.at[i], update)(v)

    x = RNG.standard_normal((8, 4)).astype(np.float32)
    i = np.array([1, 3, 3, 9], np.int32)  # a repeated index, and one out of bounds
    v = RNG.standard_normal((4, 4)).astype(np.float32)
    run_and_check(fn, (x, i, v), [])


def test_embedding_training_step_under_batch_parallel():
    """The gradient of an embedding lookup is a scatter-add."""

    def loss(p, ids, y):
        return jnp.mean((jnp.mean(p["emb"][ids], axis=1) @ p["w"] - y) ** 2)

    def step(params, ids, y):
        value, grads = jax.value_and_grad(loss)(params, ids, y)
        return value, jax.tree.map(lambda a, b: a - 0.1 * b, params, grads)

    params = {"emb": RNG.standard_normal((50, 16)).astype(np.float32),
              "w": RNG.standard_normal((16, 4)).astype(np.float32)}
    ids = RNG.integers(0, 50, (8, 5)).astype(np.int32)
    y = RNG.standard_normal((8, 4)).astype(np.float32)
    lowered, compiled = run_and_check(step, (params, ids, y), [partir.BatchParallel("batch")],
                                      partir.Mesh({"batch": 4}))
    assert "lax.scatter_add" in lowered.source
    # Each shard scatters its own updates; the gradients (embedding included)
    # and the loss are all-reduced, as in any data-parallel step: no gathers.
    assert emitted_collectives(compiled, (params, ids, y)) == {("all_reduce", ("batch",)): 3}


@pytest.mark.parametrize("kind", ["scan", "fori_loop"])
def test_loops_run_replicated(kind):
    """`stablehlo.while` (and the dynamic_update_slice a scan writes with)."""
    from dialects.interpreter import run_function

    def scan(x):
        return jax.lax.scan(lambda c, r: (c * 0.5 + r, jnp.tanh(c)), jnp.zeros(16), x)

    def fori(x):
        return jax.lax.fori_loop(0, jnp.int32(x.shape[0]), lambda i, c: c + jnp.sin(x[i]),
                                 jnp.zeros(16, jnp.float32))

    program = scan if kind == "scan" else fori
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    run_and_check(program, (x,), [partir.BatchParallel("batch", inputs="x")])
    module = partir.import_jax(program, x)
    for g, r in zip(run_function(module, [x]), jax.tree_util.tree_leaves(jax.jit(program)(x)),
                    strict=True):
        assert_close(g, np.asarray(r))


def test_reverse_of_a_tiled_dim_is_refused_by_the_fuzzers_repro_no_more():
    """Fuzzer repro (fuzz-findings.md): `a0[::-1]` with the kept dim 1 tiled
    over {x: 8}. The reversed dim stays whole; dim 1 is tiled, with no
    communication at all."""
    def f(a0):
        return (a0[::-1],)

    a0 = RNG.standard_normal((4, 8)).astype(np.float32)
    assert unemittable_ops(partir.import_jax(f, a0)) == []  # not refused before partitioning
    lowered, compiled = run_and_check(f, (a0,), [partir.ManualPartition({"a0": {1: "x"}})],
                                      partir.Mesh({"x": 8}))
    assert "lax.rev(" in lowered.source
    assert emitted_collectives(compiled, (a0,)) == collections.Counter()


def test_reverse_and_its_gradient_with_the_kept_dim_tiled():
    """`jnp.flip` along dim 1 and the gradient of a reversed slice (also a
    reverse), batch-parallel over dim 0: per-device reversal along the whole
    dim is the global one; the loss is all-reduced as usual."""
    def loss(w, x):
        y = jnp.flip(x @ w, axis=1)
        return jnp.sum(jnp.tanh(y[:, 5:1:-1]) * y[:, :4])

    def step(w, x):
        return jax.value_and_grad(loss, argnums=(0, 1))(w, x)

    w = RNG.standard_normal((16, 6)).astype(np.float32)
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    assert "stablehlo.reverse" in str(partir.import_jax(step, w, x))
    lowered, compiled = run_and_check(step, (w, x), [partir.BatchParallel("batch", inputs="x")],
                                      partir.Mesh({"batch": 4}))
    assert lowered.source.count("lax.rev(") >= 2
    assert set(emitted_collectives(compiled, (w, x))) == {("all_reduce", ("batch",))}


def _graph_step(params, nodes, edge_index, target):
    """A message-passing step with PyG's `edge_index [2, E]` (senders, receivers)."""
    def loss(params):
        h = nodes @ params["w_in"]
        sent = h[edge_index[0]] @ params["w_msg"]
        messages = jax.ops.segment_sum(sent, edge_index[1], num_segments=nodes.shape[0])
        return jnp.mean((jnp.tanh(h + messages) @ params["w_out"] - target) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def _graph_args(nodes=16, edges=48, width=8):
    rng = np.random.default_rng(0)
    shapes = {"w_in": (width, width), "w_msg": (width, width), "w_out": (width, 4)}
    params = {k: (rng.normal(size=s) * 0.3).astype(np.float32) for k, s in shapes.items()}
    return (params, rng.normal(size=(nodes, width)).astype(np.float32),
            rng.integers(0, nodes, (2, edges)).astype(np.int32),
            rng.normal(size=(nodes, 4)).astype(np.float32))


def test_batch_parallels_advice_on_a_graph_step_runs():
    """The data share no leading dim: the error names the inputs= and, for
    `edge_index [2, E]`, the dim= that split them; that schedule runs."""
    args = _graph_args()
    with pytest.raises(partir.TacticError) as info:
        partir.jit(_graph_step, mesh=MESH, tactics=[partir.BatchParallel("batch")]).lower(*args)
    assert "inputs=['nodes', 'target']; edge_index's dim 0 has 2 elements, fewer than 4 " \
        "devices: add a BatchParallel of its own with inputs=['edge_index'], dim=1" in str(info.value)
    lowered, _ = run_and_check(_graph_step, args, [
        partir.BatchParallel("batch", inputs=["nodes", "target"]),
        partir.BatchParallel("batch", inputs=["edge_index"], dim=1),
    ])
    assert lowered.conflicts == []


def test_zero1_returns_the_parameters_as_they_came():
    """ZeRO-1 shards Adam's state; the updated parameters come back whole
    (the sharding the parameters came with), gathered inside the step, where
    `.collectives` and the estimate count it; ZeRO-2 returns them split."""
    args = block_train_step.make_args(batch=8)
    ref = jax.jit(block_train_step.program)(*args)
    estimates = {}
    for stage in (1, 2):
        tactics = [partir.BatchParallel("batch"), partir.ZeRO("batch", stage)]
        lowered, compiled = run_and_check(block_train_step.program, args, tactics)
        _, params, state = compiled(*args)
        specs = {tuple(p.sharding.spec) for p in jax.tree.leaves(params)}
        gathered = [c for c in lowered.collectives if c.kind == "all_gather"]
        leaves = jax.tree.leaves(ref[1])
        if stage == 1:
            assert specs == {()}
            assert sorted(c.bytes_per_device for c in gathered) == sorted(
                p.size * p.dtype.itemsize for p in leaves)
        else:
            assert all("batch" in spec for spec in specs) and gathered == []
        assert all("batch" in tuple(m.sharding.spec) for m in jax.tree.leaves(state["m"]))
        estimates[stage] = lowered.estimate("h100-8").comm_seconds
    assert estimates[1] > estimates[2]


def _experts_step(params, velocity, x):
    """Two expert matrices `[experts, in, out]`, every token through every
    expert, and a momentum update (its velocity mirrors the parameters)."""
    def loss(params):
        inputs = x @ params["proj"] if "proj" in params else x
        h = jnp.tanh(jnp.einsum("bd,edh->beh", inputs, params["experts"]["w_up"]))
        return jnp.mean(jnp.einsum("beh,ehd->bd", h, params["experts"]["w_down"]) ** 2)

    grads = jax.grad(loss)(params)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    return jax.tree.map(lambda p, v: p - 0.1 * v, params, velocity), velocity


def _experts_args(experts=4, width=8, hidden=16, batch=16, proj=True):
    rng = np.random.default_rng(0)
    params = {"proj": rng.normal(size=(width, width)).astype(np.float32),
              "experts": {"w_up": rng.normal(size=(experts, width, hidden)).astype(np.float32),
                          "w_down": rng.normal(size=(experts, hidden, width)).astype(np.float32)}}
    if not proj:
        del params["proj"]
    return params, jax.tree.map(np.zeros_like, params), rng.normal(size=(batch, width)).astype(np.float32)


EXPERTS_OVER_MODEL = partir.ManualPartition({"params/experts/*": {0: "model"}})


def test_zero_after_an_expert_split_picks_its_dim_per_device():
    """4 experts over "model" leave 2 per device, fewer than "batch"'s 4: ZeRO
    splits the next dim of the parameters and of their velocity (which
    propagation split like them), not dim 0 (it was an ActionError)."""
    args = _experts_args()
    tactics = [partir.BatchParallel("batch"), EXPERTS_OVER_MODEL, partir.ZeRO("batch", 3)]
    lowered, _ = run_and_check(_experts_step, args, tactics)
    zero = [s for s in lowered.report().selections if s.tactic == "ZeRO-3(batch)" and s.dim is not None]
    assert {(s.leaf.split("[")[0], s.dim) for s in zero if "experts" in s.leaf} == {
        ("params", 1), ("velocity", 1), ("result", 1)}
    assert {s.dim for s in zero if "proj" in s.leaf} == {0}


def test_zero_on_the_axis_an_earlier_tactic_split_leaves_those_leaves_be():
    args = _experts_args()
    tactics = [partir.BatchParallel("batch"), EXPERTS_OVER_MODEL, partir.ZeRO("model", 3)]
    lowered, _ = run_and_check(_experts_step, args, tactics)
    chosen = [s for s in lowered.report().selections if s.tactic == "ZeRO-3(model)"]
    kept = {s.leaf: s.reason for s in chosen if s.dim is None}
    assert "already split over \"model\" by the tactics before" in kept["params['experts']['w_up']"]
    assert {s.leaf for s in chosen if s.dim == 0} >= {"params['proj']", "velocity['proj']"}
    with pytest.raises(partir.TacticError, match=r"ZeRO: nothing to shard: the tactics before split "
                       r"every leaf it would .* over \"model\" already; give ZeRO another axis"):
        partir.jit(_experts_step, mesh=MESH, tactics=[EXPERTS_OVER_MODEL, partir.ZeRO("model", 3)]
                   ).lower(*_experts_args(proj=False))


def test_zero_given_leaves_an_earlier_tactic_split_too_finely_is_a_clear_error():
    with pytest.raises(partir.TacticError, match=r"ZeRO: params\['experts'\]\['w_up'\]'s dim 0 is "
                       r"already split over \"model\" by the tactics before, 2 elements per device.*"
                       "leave params"):
        partir.jit(_experts_step, mesh=MESH, tactics=[
            EXPERTS_OVER_MODEL, partir.ZeRO("batch", 3, params="params/experts/w_up")]).lower(*_experts_args())


def test_zero1_returns_parameters_an_earlier_tactic_split_over_its_axis_split():
    """"As they came": a parameter split over the ZeRO axis by the tactics
    before comes back split over it, not gathered."""
    from tests.test_bad_inputs import _momentum

    args = ({"w": np.ones((4, 8), np.float32)}, {"w": np.zeros((4, 8), np.float32)},
            np.ones((8, 4), np.float32))
    tactics = [partir.ManualPartition({"p/w": {0: "model"}}), partir.ZeRO("model", stage=1)]
    lowered, compiled = run_and_check(_momentum, args, tactics)
    assert [tuple(o.sharding.spec) for o in jax.tree.leaves(compiled(*args))] == [("model",)] * 2
    assert not [c for c in lowered.collectives if c.kind == "all_gather"]
