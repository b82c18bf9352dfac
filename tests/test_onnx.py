"""ONNX interop (issue 18): export partitioned programs with the multi-device
proposal's sharding specs, import annotated models as partitioned programs.

The exported models pass `onnx.checker` at IR version 11, onnxruntime runs
them (ignoring the annotations, as the proposal allows) with `jax.jit`'s
numbers, and they re-import to the same collectives. Hand-annotated models
(one built with `onnx.helper`, one exported from JAX by jax2onnx with
annotations added here) are partitioned as annotated and match onnxruntime.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import jax
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import partir
from examples import block_forward, mlp_forward
from partir.onnx_interop.cli import main as export_main
from partir.onnx_interop.sharding import OnnxShardingError

MESH = partir.Mesh({"batch": 4, "model": 2})
TACTICS = [partir.BatchParallel("batch"), partir.Megatron("model")]
ROOT = Path(__file__).resolve().parent.parent
BATCH_GROUPS = [[0, 1], [2, 3], [4, 5], [6, 7]]  # devices row-major over (batch, model)
MODEL_GROUPS = [[0, 2, 4, 6], [1, 3, 5, 7]]


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def summary(collectives) -> list[tuple[str, tuple[str, ...], int]]:
    return [(c.kind, c.axes, c.bytes_per_device) for c in collectives]


def spec(tensor: str, shards: dict[int, int], devices: list[list[int]]) -> onnx.ShardingSpecProto:
    """A ShardingSpecProto written by hand: `shards` per axis, one device list per shard
    (a list of several is a device group: the shard duplicated on them)."""
    proto = onnx.ShardingSpecProto(tensor_name=tensor)
    for axis, count in shards.items():
        proto.sharded_dim.add(axis=axis).simple_sharding.add(num_shards=count)
    for group in devices:
        if len(group) == 1:
            proto.device.append(group[0])
        else:
            key = -1 - len(proto.index_to_device_group_map)
            proto.device.append(key)
            proto.index_to_device_group_map.add(key=key, value=group)
    return proto


def annotate(node: onnx.NodeProto, *specs: onnx.ShardingSpecProto, config: str = "mesh8") -> None:
    node.device_configurations.add(configuration_id=config).sharding_spec.extend(specs)


# --- export ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=[mlp_forward, block_forward], ids=["mlp", "block"])
def exported(request):
    example = request.param
    args = example.make_args()
    lowered = partir.jit(example.program, mesh=MESH, tactics=TACTICS).lower(*args)
    model = lowered.to_onnx()
    leaves = jax.tree_util.tree_leaves(args)
    feeds = dict(zip([i.name for i in model.graph.input], leaves, strict=True))
    return example, args, lowered, model, feeds


def test_the_export_passes_the_checker_at_ir_version_11(exported):
    _, _, _, model, _ = exported
    assert model.ir_version == 11
    onnx.checker.check_model(model, full_check=True)
    (config,) = model.configuration
    assert config.num_devices == 8 and list(config.device)[:2] == ["batch=0,model=0", "batch=0,model=1"]
    annotated = [n for n in model.graph.node if n.device_configurations]
    assert len(annotated) > len(model.graph.node) // 2
    assert all(c.configuration_id == config.name for n in annotated for c in n.device_configurations)


def test_onnxruntime_runs_the_export_as_jax_jit(exported):
    example, args, _, model, feeds = exported
    (got,) = run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got, jax.jit(example.program)(*args), rtol=1e-5, atol=1e-5)


def test_the_specs_are_what_partir_decided():
    """The MLP under DP+Megatron: the first matmul reads x split over "batch"
    (dim 0 in 4 shards, each on the 2 devices of a model group) and w1 split over
    "model" (dim 1 in 2 shards, each on 4 devices); the bias add after the row
    matmul reads its partial sum summed (the all-reduce the lowering inserted)."""
    lowered = partir.jit(mlp_forward.program, mesh=MESH, tactics=TACTICS).lower(
        *mlp_forward.make_args()
    )
    model = lowered.to_onnx()
    first = model.graph.node[0]
    assert first.op_type == "MatMul"
    specs = {s.tensor_name: s for s in first.device_configurations[0].sharding_spec}
    x, w1 = specs["x"], specs["params['w1']"]
    assert [(d.axis, d.simple_sharding[0].num_shards) for d in x.sharded_dim] == [(0, 4)]
    groups = {e.key: list(e.value) for e in x.index_to_device_group_map}
    assert [groups[d] for d in x.device] == BATCH_GROUPS
    assert [(d.axis, d.simple_sharding[0].num_shards) for d in w1.sharded_dim] == [(1, 2)]
    groups = {e.key: list(e.value) for e in w1.index_to_device_group_map}
    assert [groups[d] for d in w1.device] == MODEL_GROUPS
    out = specs[first.output[0]]
    assert [(d.axis, d.simple_sharding[0].num_shards) for d in out.sharded_dim] == [(0, 4), (1, 2)]
    assert list(out.device) == list(range(8))
    second = [n for n in model.graph.node if n.op_type == "MatMul"][1]
    row = [s for s in second.device_configurations[0].sharding_spec if s.tensor_name == second.output[0]]
    assert [(d.axis, d.simple_sharding[0].num_shards) for d in row[0].sharded_dim] == [(0, 4)]


def test_the_export_reimports_to_the_same_collectives(exported):
    _, _, lowered, model, feeds = exported
    program = partir.from_onnx(model)
    assert program.mesh == MESH
    again = program.jit().lower(feeds, {})
    assert summary(again.collectives) == summary(lowered.collectives)
    assert again.conflicts == []


def test_the_reimported_mlp_runs_partitioned_as_jax_jit():
    args = mlp_forward.make_args()
    model = partir.jit(mlp_forward.program, mesh=MESH, tactics=TACTICS).lower(*args).to_onnx()
    leaves = jax.tree_util.tree_leaves(args)
    feeds = dict(zip([i.name for i in model.graph.input], leaves, strict=True))
    (got,) = partir.from_onnx(model).jit()(feeds, {}).values()
    np.testing.assert_allclose(got, jax.jit(mlp_forward.program)(*args), rtol=1e-5, atol=1e-5)


def test_to_onnx_writes_a_private_file(tmp_path):
    lowered = partir.jit(mlp_forward.program, mesh=MESH, tactics=TACTICS).lower(
        *mlp_forward.make_args()
    )
    path = tmp_path / "mlp.onnx"
    lowered.to_onnx(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def test_partir_export_onnx_writes_the_cli_pipeline(tmp_path, capsys):
    out = tmp_path / "mlp.onnx"
    pipeline = (
        'partir-declare-mesh{axes="batch=4","model=2"},partir-batch-parallel{axis=batch},'
        "partir-megatron{axis=model}"
    )
    assert export_main([str(ROOT / "examples/mlp_train_step.mlir"), "-p", pipeline, "-o", str(out)]) == 0
    model = onnx.load(str(out))
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    onnx.checker.check_model(model, full_check=True)
    assert partir.from_onnx(model).mesh == MESH
    assert export_main([str(ROOT / "examples/mlp_train_step.mlir"), "-p",
                        pipeline + ",partir-lower-spmd", "-o", str(out)]) == 1
    assert "drop partir-lower-spmd" in capsys.readouterr().err


# --- import of hand-annotated models ---------------------------------------------


def hand_built_mlp(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """LayerNorm -> MatMul -> Add -> Gelu -> MatMul -> Add -> Softmax, weights as
    initializers, Megatron-style annotations over a 4x2 mesh it does not name."""
    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype(np.float32), name)

    nodes = [
        helper.make_node("LayerNormalization", ["X", "ln_scale", "ln_bias"], ["h0"], name="LayerNorm_0"),
        helper.make_node("MatMul", ["h0", "W1"], ["h1"], name="MatMul_1"),
        helper.make_node("Add", ["h1", "B1"], ["h2"], name="Add_2"),
        helper.make_node("Gelu", ["h2"], ["h3"], name="Gelu_3"),
        helper.make_node("MatMul", ["h3", "W2"], ["h4"], name="MatMul_4"),
        helper.make_node("Add", ["h4", "B2"], ["h5"], name="Add_5"),
        helper.make_node("Softmax", ["h5"], ["Y"], name="Softmax_6", axis=-1),
    ]
    initializers = [weight("ln_scale", 16), weight("ln_bias", 16), weight("W1", 16, 32),
                    weight("B1", 32), weight("W2", 32, 16), weight("B2", 16)]
    graph = helper.make_graph(
        nodes, "hand_mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8, 16])],
        initializers,
    )
    model = helper.make_model(graph, ir_version=11, opset_imports=[helper.make_opsetid("", 23)])
    model.configuration.add(name="mesh8", num_devices=8)
    by_name = {n.name: n for n in model.graph.node}
    annotate(by_name["MatMul_1"], spec("h0", {0: 4}, BATCH_GROUPS), spec("W1", {1: 2}, MODEL_GROUPS))
    annotate(by_name["MatMul_4"], spec("W2", {0: 2}, MODEL_GROUPS))
    onnx.checker.check_model(model, full_check=True)
    return model, {"X": rng.standard_normal((8, 16)).astype(np.float32)}


def test_a_model_built_with_onnx_helper_is_partitioned_as_annotated():
    model, feeds = hand_built_mlp(np.random.default_rng(0))
    program = partir.from_onnx(model, mesh=MESH)
    partitioned = program.jit()
    lowered = partitioned.lower(feeds, program.parameters)
    assert summary(lowered.collectives) == [("all_reduce", ("model",), 8 // 4 * 16 * 4)]
    spmd = lowered.stage("spmd")
    assert '%params_W1: !spmd.dtensor<16x32xf32, [{}, {"model"}]>' in spmd
    assert '%params_W2: !spmd.dtensor<32x16xf32, [{"model"}, {}]>' in spmd
    assert '%inputs_X: !spmd.dtensor<8x16xf32, [{"batch"}, {}]>' in spmd
    (got,) = partitioned(feeds, program.parameters).values()
    (want,) = run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


JAX2ONNX_MLP = ROOT / "tests" / "data" / "jax2onnx_mlp.onnx"
"""`jax2onnx_mlp()` as jax2onnx 0.17.1 exported it (its first export loads every
plugin, ~15 CPU-seconds: the slow test below checks the file is still what it writes)."""
MLP_SHAPES = [(8, 16), (16, 32), (32,), (32, 8), (8,)]


def jax2onnx_mlp_function(x, w1, b1, w2, b2):
    return jax.nn.softmax(jax.nn.gelu(x @ w1 + b1) @ w2 + b2, axis=-1)


def jax2onnx_mlp() -> onnx.ModelProto:
    from jax2onnx import to_onnx

    return to_onnx(jax2onnx_mlp_function, MLP_SHAPES, return_mode="proto")


@pytest.mark.slow
def test_the_stored_jax2onnx_model_is_what_jax2onnx_exports():
    """Long profile (jax2onnx's first export costs ~15 CPU-seconds); in CI,
    `test_a_jax2onnx_model_with_annotations_added_by_a_script` imports the
    stored model this checks."""
    stored = onnx.load(str(JAX2ONNX_MLP))
    assert onnx.printer.to_text(jax2onnx_mlp().graph) == onnx.printer.to_text(stored.graph)


def test_a_jax2onnx_model_with_annotations_added_by_a_script():
    model = onnx.load(str(JAX2ONNX_MLP))
    # the script: IR 11, a configuration, and Megatron specs on the two matmuls
    model.ir_version = 11
    model.configuration.add(name="mesh8", num_devices=8)
    first, second = [n for n in model.graph.node if n.op_type in ("Gemm", "MatMul")]
    x, w1 = first.input[:2]
    annotate(first, spec(x, {0: 4}, BATCH_GROUPS), spec(w1, {1: 2}, MODEL_GROUPS))
    annotate(second, spec(second.input[1], {0: 2}, MODEL_GROUPS))
    onnx.checker.check_model(model, full_check=True)

    rng = np.random.default_rng(1)
    args = [(0.5 * rng.standard_normal(s)).astype(np.float32) for s in MLP_SHAPES]
    program = partir.from_onnx(model, mesh=MESH)
    feeds = dict(zip(program.input_names, args, strict=True))
    partitioned = program.jit()
    lowered = partitioned.lower(feeds, program.parameters)
    assert summary(lowered.collectives) == [("all_reduce", ("model",), 2 * 8 * 4)]
    (got,) = partitioned(feeds, program.parameters).values()
    (want,) = run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, jax.jit(jax2onnx_mlp_function)(*args), rtol=1e-5, atol=1e-6)


def test_an_unannotated_model_imports_for_any_tactics():
    model, feeds = hand_built_mlp(np.random.default_rng(2))
    for node in model.graph.node:
        del node.device_configurations[:]
    program = partir.from_onnx(model)
    assert program.tactics == [] and program.mesh is None
    manual = partir.ManualPartition({"inputs/X": {0: "batch"}})
    got = program.jit(mesh=MESH, tactics=[manual])(feeds, program.parameters)["Y"]
    np.testing.assert_allclose(got, run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_conflicting_annotations_are_reported_naming_the_node():
    """MatMul_1 splits W1's columns over "model" (so h1's dim 1); Add_2 asks for
    h1's rows over "model": the earlier wins, and the conflict names Add_2."""
    model, feeds = hand_built_mlp(np.random.default_rng(3))
    add = next(n for n in model.graph.node if n.name == "Add_2")
    annotate(add, spec("h1", {0: 2}, MODEL_GROUPS))
    program = partir.from_onnx(model, mesh=MESH)
    lowered = program.jit().lower(feeds, program.parameters)
    text = " ".join(str(c) for c in lowered.conflicts)
    assert "ONNX node Add_2" in text, text
    (got,) = program.jit()(feeds, program.parameters).values()
    np.testing.assert_allclose(got, run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-6)


def _with(node_name: str, *specs: onnx.ShardingSpecProto, config: str = "mesh8"):
    model, _ = hand_built_mlp(np.random.default_rng(4))
    node = next(n for n in model.graph.node if n.name == node_name)
    annotate(node, *specs, config=config)
    return model


@pytest.mark.parametrize(
    ("model", "mesh", "message"),
    [
        (lambda: _with("Add_2", spec("h1", {0: 4}, BATCH_GROUPS), config="gpus"), MESH,
         r'ONNX node Add_2: annotation names device configuration "gpus", which the model does not define'),
        (lambda: _with("Add_2", spec("h1", {1: 3}, [[0, 1], [2, 3], [4, 5, 6, 7]])), MESH,
         r"ONNX node Add_2: tensor h1: axis 1 in 3 shards on these devices cannot be realised on the mesh"),
        (lambda: _with("Softmax_6", spec("Y", {0: 16}, [[d] for d in range(16)])), MESH,
         r"ONNX node Softmax_6: tensor Y: axis 0 has size 8 but 16 shards"),
        (lambda: _with("Add_2", spec("h1", {0: 2}, [[0, 1, 4, 5], [2, 3, 6, 7]])), MESH,
         r"ONNX node Add_2: tensor h1: axis 0 in 2 shards on these devices cannot be realised"),
        (lambda: _with("Add_2", spec("W1", {0: 2}, MODEL_GROUPS)), MESH,
         r"ONNX node Add_2: tensor W1 is neither an input nor an output of the node"),
        (lambda: _with("Add_2", spec("h1", {2: 2}, MODEL_GROUPS)), MESH,
         r"ONNX node Add_2: tensor h1: sharded axis 2 is out of range for a tensor of shape \[8, 32\]"),
        (lambda: _with("Add_2", spec("h1", {0: 2}, [[0, 2, 4, 6], [1, 3, 5]])), MESH,
         r"ONNX node Add_2: tensor h1: devices \[7\] hold no shard"),
        (lambda: hand_built_mlp(np.random.default_rng(5))[0], None,
         r'device configuration "mesh8" has 8 devices but no mesh axes: pass mesh='),
        (lambda: hand_built_mlp(np.random.default_rng(5))[0], {"batch": 2},
         r'device configuration "mesh8" has 8 devices, the mesh'),
    ],
    ids=["unknown-configuration", "unrealisable-shards", "more-shards-than-elements",
         "wrong-device-order", "not-on-the-node", "axis-out-of-range", "device-missing",
         "no-mesh", "mesh-size"],
)
def test_bad_annotations_are_clear_errors(model, mesh, message):
    with pytest.raises(OnnxShardingError, match=message):
        partir.from_onnx(model(), mesh=mesh)


def test_user_names_are_escaped_in_errors():
    model, _ = hand_built_mlp(np.random.default_rng(6))
    node = next(n for n in model.graph.node if n.name == "Add_2")
    node.name = 'Add "2"\nnext'
    annotate(node, spec("h1", {0: 4}, BATCH_GROUPS), config="gpus")
    with pytest.raises(OnnxShardingError) as caught:
        partir.from_onnx(model, mesh=MESH)
    assert 'ONNX node "Add \\222\\22\\0Anext"' in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_op_without_a_conversion_names_the_node():
    model, _ = hand_built_mlp(np.random.default_rng(7))
    model.graph.node[3].op_type = "Mish"
    with pytest.raises(partir.UnsupportedError, match=r"ONNX node Gelu_3: op Mish has no conversion"):
        partir.from_onnx(model, mesh=MESH)


@pytest.mark.parametrize("axes", [{"batch": 4, "model": 2}, {"a": 2, "b": 2, "c": 2}, {"x": 8}])
def test_every_distribution_reads_back_from_its_spec(axes):
    """`sharding_spec` and `distribution_of` are inverse on every layout of a
    rank-2 value over the mesh (each axis on dim 0, dim 1 or neither, in
    every order): the proposal's formalism says what partir's distribution says."""
    import itertools

    from dialects.distribution import Distribution
    from partir.onnx_interop.sharding import distribution_of, sharding_spec

    mesh = partir.Mesh(axes)
    names = list(axes)
    seen = 0
    for places in itertools.product((0, 1, None), repeat=len(names)):
        for order in itertools.permutations(names):
            dims = tuple(tuple(a for a in order if places[names.index(a)] == d) for d in (0, 1))
            dist = Distribution(dims)
            proto = sharding_spec("t", dist, mesh, (8, 16))
            assert distribution_of(proto, (8, 16), mesh, "test") == dist
            seen += 1
    assert seen == 3 ** len(names) * len(list(itertools.permutations(names)))


def test_pipeline_stages_given_go_on_every_node_of_the_op():
    """export_module writes the stages it is given (op number -> stage) on
    every node of the op (the pipelined export below gives them per layer)."""
    from partir.onnx_interop.export import export_module
    from partir.partition import partition

    lowered = partir.jit(mlp_forward.program, mesh=MESH, tactics=TACTICS).lower(
        *mlp_forward.make_args()
    )
    model = export_module(
        lowered.imported, MESH, lambda m: partition(m, MESH, TACTICS) and None,
        pipeline_stages={0: 1, 1: 2},
    )
    onnx.checker.check_model(model, full_check=True)
    stages = [
        c.pipeline_stage for n in model.graph.node for c in n.device_configurations
        if c.HasField("pipeline_stage")
    ]
    assert stages[:2] == [1, 2] and len(stages) == 2


def test_a_training_step_exports_runs_and_round_trips():
    """The MLP's training step (gradients, Adam) under DP+Megatron: onnxruntime
    gives every output as jax.jit does, and the re-import its collectives."""
    from examples import mlp_train_step

    args = mlp_train_step.make_args()
    lowered = partir.jit(mlp_train_step.program, mesh=MESH, tactics=TACTICS).lower(*args)
    model = lowered.to_onnx()
    leaves = jax.tree_util.tree_leaves(args)
    feeds = {i.name: np.asarray(v) for i, v in zip(model.graph.input, leaves, strict=True)}
    got = run_onnxruntime(model, feeds)
    want = jax.tree_util.tree_leaves(jax.jit(mlp_train_step.program)(*args))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    again = partir.from_onnx(model).jit().lower(feeds, {})
    assert sorted(summary(again.collectives)) == sorted(summary(lowered.collectives))


# --- a pipelined step: each node on its stage ------------------------------------


def _stages(model: onnx.ModelProto) -> list[int | None]:
    """Each node's `pipeline_stage`, or None where it has none."""
    found: list[int | None] = []
    for node in model.graph.node:
        stage = [c.pipeline_stage for c in node.device_configurations if c.HasField("pipeline_stage")]
        found.append(stage[0] if stage else None)
    return found


def _first_staged_producer(model: onnx.ModelProto, stages: list[int | None], tensor: str) -> int | None:
    """The stage of the nearest node with one among those `tensor` is made from
    (the loss: the head's last op, past the sums over microbatches)."""
    made_by = {out: k for k, node in enumerate(model.graph.node) for out in node.output}
    todo, seen = [tensor], set()
    while todo:
        k = made_by.get(todo.pop(0))
        if k is None or k in seen:
            continue
        seen.add(k)
        if stages[k] is not None:
            return stages[k]
        todo.extend(model.graph.node[k].input)
    return None


@pytest.mark.parametrize(
    ("name", "mesh", "chunks"),
    [
        ("mlp", {"stage": 4, "batch": 2}, 1),
        pytest.param("mlp", {"stage": 2}, 1, marks=pytest.mark.slow),
        pytest.param("block", {"stage": 4, "batch": 2}, 1, marks=pytest.mark.slow),
        pytest.param("mlp", {"stage": 4}, 2, marks=pytest.mark.slow),
    ],
)
def test_a_pipelined_step_exports_each_layer_on_its_stage(
    name: str, mesh: dict[str, int], chunks: int, tmp_path: Path
) -> None:
    """The 8-layer scanned stacks under Pipeline (1F1B, 4 microbatches; or
    interleaved with `chunks` virtual stages) through the IR
    `Lowered.to_onnx`: the graph is the global step with its layer loops
    unrolled; each read of layer l of a stacked parameter (a Slice of the
    graph's input at row l) is on stage l // (8 / stages) (interleaved: its
    chunk's, l // (8 / (stages chunks)) % stages), the head on
    the last stage as the pipelined program runs it; the stacked results are
    split over the stages; onnxruntime gives jax.jit's numbers."""
    from examples import scanned_stack
    from partir.onnx_interop.sharding import distribution_of

    if name == "mlp":
        step, args = scanned_stack.mlp_train_step, scanned_stack.mlp_train_args(layers_=8, batch=16)
    else:
        step, args = scanned_stack.train_step, scanned_stack.make_args(layers_=8, batch=16)
    schedule = "1f1b" if chunks == 1 else "interleaved"
    tactics: list[partir.Tactic] = [partir.Pipeline("stage", 4, schedule, virtual_stages=chunks)]
    tactics += [partir.BatchParallel("batch")] if "batch" in mesh else []
    lowered = partir.jit(step, mesh=partir.Mesh(mesh), tactics=tactics).lower(*args)
    path = tmp_path / "step.onnx"
    model = lowered.to_onnx(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    onnx.checker.check_model(model, full_check=True)
    stages = _stages(model)
    per_chunk = 8 // (mesh["stage"] * chunks)
    assert set(stages) == {None, *range(mesh["stage"])}
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rows = 0
    for node, stage in zip(model.graph.node, stages, strict=True):
        source = node.input[0] if node.input else ""
        if node.op_type == "Slice" and source in shapes and shapes[source][:1] == [8]:
            layer = int(constants[node.input[1]][0])
            assert stage == layer // per_chunk % mesh["stage"], (node.name, source, layer)
            rows += 1
    assert rows >= 2 * 8  # each layer's parameters, read by its forward and its backward
    assert _first_staged_producer(model, stages, model.graph.output[0].name) == mesh["stage"] - 1
    assert stages.count(None) > 0  # the update runs on every stage, each on its layers
    # the stacked results (updated layers, their Adam state) are split over the stages
    outputs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    split = {
        spec.tensor_name: distribution_of(
            spec, outputs[spec.tensor_name], partir.Mesh(mesh), spec.tensor_name
        )
        for node in model.graph.node
        if node.op_type == "Identity"
        for c in node.device_configurations
        for spec in c.sharding_spec
        if spec.tensor_name in outputs
    }
    stacked = {o for o, shape in outputs.items() if shape[:1] == [8]}
    assert stacked and stacked <= set(split)
    for output, dist in split.items():
        on_stage = [d for d, axes in enumerate(dist.dims) if "stage" in axes]
        assert on_stage == ([0] if output in stacked else []), (output, dist)
        assert output not in stacked or dist.dims[0] == ("stage",)
    feeds = {
        i.name: np.asarray(v)
        for i, v in zip(model.graph.input, jax.tree_util.tree_leaves(args), strict=True)
    }
    got = run_onnxruntime(model, feeds)
    want = jax.tree_util.tree_leaves(jax.jit(step)(*args))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, np.asarray(w), rtol=2e-4, atol=1e-5)
