"""The model libraries users bring (issue 12's real-client matrix): flax
linen, haiku and equinox transformer blocks, and flax and equinox stacks of
them under a scan, trained with optax's Adam (`tests/client_models.py`),
partitioned by the stock tactics and checked against `jax.jit` (numbers: the
SPMD stage on the reference interpreter for every strategy, the emitted
program on JAX for data parallelism) and against the collectives a
hand-written strategy has.

Their parameter trees carry the libraries' own names (`params/Dense_0/kernel`,
`params['mlp/~/linear_0']['w']`, `params.attention.query_proj.weight`) and
optax's state its own (`opt_state[0].mu[...]`): `BatchParallel` and `ZeRO`
find the data, the parameters and the optimizer state by the program's
structure (`partir.roles`), not by those names.

Per block (12 parameter leaves; mesh {"batch": 4, "model": 2}):

| strategy | collectives |
|---|---|
| DP | AR(batch)×13: the 12 gradients and the loss |
| DP + Megatron | AR(model)×3 of activations: 2 forward, 1 backward (the gradient reaching the second norm); the first norm's input needs no gradient (it is the data), so its scale and bias gradients, partial over "model", are summed over both axes at once, AR(batch, model)×2; AR(batch)×11, the other gradients and the loss |
| DP + ZeRO-1 | RS(batch)×12 of the gradients, AG(batch)×12 of the updated parameters, AR(batch)×1 (the loss) |
| DP + ZeRO-3 | AG(batch)×12 of the parameters, RS(batch)×12, AR(batch)×1 |

A stack of 2 blocks under `nn.scan` (flax) or `lax.scan` (equinox) has them
inside its loops, per layer and iteration: DP's gradient sums in the backward
loop; Megatron's AR(model)×4, 2 forward and 2 backward (the residual gradient
the loop carries to the layer below needs the first norm's too); ZeRO-3
gathers each layer's 12 parameters in the forward loop and the 8 the backward
pass reads (the matrices and the norm scales) in the backward loop.

ZeRO-1 returns the updated parameters as they came, whole: the step
all-gathers each update's shards once, AG(batch)×12 (ZeRO-2 would return
them split); ZeRO-3 returns them split, as they came.

Default `Megatron` plans the hand-written split of flax's and haiku's blocks
(heads, not head_dim). A Flax NNX GPT (its state in one argument,
`nnx.split((model, optimizer))`, or in two) runs under DP, Megatron, ZeRO-1/2/3
and `Automatic` with `jax.jit`'s numbers; default Megatron there moves no
more bytes than the hand-written heads split.
"""

from __future__ import annotations

import collections
import functools
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import pytest

import partir
from dialects.interpreter.spmd import run_spmd
from lowering.collectives import Collective, collectives
from partir.importer import entry_function
from partir.keys import KeyBoundary
from partir.opt import main as partir_opt
from partir.plan import ProgramView
from partir.report import parse_module
from partir.selectors import display_path
from tests import client_models
from tests.jaxpr_collectives import emitted_collectives
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
DATA = partir.BatchParallel("batch")

BLOCKS: dict[str, tuple[str, Callable[[], client_models.Client]]] = {
    "flax": ("flax", client_models.flax_block),
    "haiku": ("haiku", client_models.haiku_block),
    "equinox": ("equinox", client_models.equinox_block),
}
STACKS: dict[str, tuple[str, Callable[[], client_models.Client]]] = {
    "flax nn.scan": ("flax", client_models.flax_scanned_stack),
    "equinox lax.scan": ("equinox", client_models.equinox_scanned_stack),
}
MODELS = {**BLOCKS, **STACKS}
PIPELINED: dict[str, tuple[str, Callable[[], client_models.Client]]] = {
    **STACKS,
    "haiku hk.layer_stack": ("haiku", client_models.haiku_layer_stack),
}
"""The libraries' own ways to stack layers, which `Pipeline` splits over stages."""
BY_MODEL = [pytest.param(name, marks=pytest.mark.xdist_group(name)) for name in sorted(MODELS)]
"""Each model's tests run on one worker (`make test`'s `--dist loadgroup`),
which builds the model, its arguments and `jax.jit`'s result once."""

STRATEGIES: dict[str, Callable[[client_models.Client], list[partir.Tactic]]] = {
    "DP": lambda client: [DATA],
    "DP+Megatron": lambda client: [DATA, client.megatron],
    "ZeRO-1": lambda client: [DATA, partir.ZeRO("batch", stage=1)],
    "ZeRO-3": lambda client: [DATA, partir.ZeRO("batch", stage=3)],
}
CLI_STRATEGIES = {
    "DP": "partir-batch-parallel{axis=batch}",
    "ZeRO-3": "partir-batch-parallel{axis=batch},partir-zero{axis=batch stage=3}",
}
"""The same tactics as `partir-opt` passes (Megatron needs the names JAX's text lacks)."""


@functools.cache
def _client(name: str) -> client_models.Client:
    library, build = {**MODELS, **PIPELINED}[name]
    pytest.importorskip(library, reason=f"the {name} model needs {library}")
    pytest.importorskip("optax", reason="the client models train with optax")
    return build()


@functools.cache
def _case(name: str) -> tuple[tuple[Any, ...], Any]:
    """The model's arguments and `jax.jit`'s result on them."""
    client = _client(name)
    args = client.make_args()
    return args, jax.jit(client.step)(*args)


@functools.cache
def jax_text(name: str) -> str:
    """`jax.jit(step).lower(*args).as_text()`: MLIR's pretty syntax."""
    return jax.jit(_client(name).step).lower(*_case(name)[0]).as_text()


@functools.cache
def lowered(name: str, strategy: str) -> partir.Lowered:
    """The step partitioned by the strategy (kept for the `partir-opt` test to compare)."""
    client = _client(name)
    tactics = STRATEGIES[strategy](client)
    return partir.jit(client.step, mesh=MESH, tactics=tactics).lower(*_case(name)[0])


def run_and_check(name: str, strategy: str) -> partir.Lowered:
    """The partitioned step: its SPMD stage, run on the reference interpreter
    (every device simulated, each collective as it moves data), equals
    `jax.jit`; it has no conflicts; and the emitted program's jaxpr holds
    the SPMD stage's collectives. (XLA takes seconds to compile each emitted
    step; `test_data_parallel...` runs each model's on JAX.)"""
    args, want = _case(name)
    program = lowered(name, strategy)
    got = run_spmd(program.module, jax.tree.leaves(args))
    assert_leaves_close(got, jax.tree.leaves(want), what=f"{name} step, {strategy}")
    assert program.conflicts == []
    assert emitted_collectives(program.compile(), args) == kinds(program.collectives)
    return program


def kinds(found: list[Collective]) -> collections.Counter:
    return collections.Counter((c.kind, c.axes) for c in found)


def moved(collective: Collective) -> int:
    """Elements a collective moves per device: the larger of its local
    operand and result (a gradient shard summed, a parameter gathered whole)."""
    op = collective.op
    return max(math.prod(op.operands[0].type.get_shape()), math.prod(op.results[0].type.get_shape()))


def loop_of(collective: Collective) -> int | None:
    """Which `stablehlo.while` of the function runs the collective (0: the
    first in program order, the forward scan; 1: the backward), or None."""
    op = collective.op.parent_op()
    while op is not None and op.name != "stablehlo.while":
        op = op.parent_op()
    if op is None:
        return None
    loops = [w for w in collective.op.get_toplevel_object().walk() if w.name == "stablehlo.while"]
    return loops.index(op)


def sizes(found: list[Collective]) -> list[int]:
    return sorted(moved(c) for c in found)


def parameter_sizes(name: str) -> list[int]:
    """Elements of each parameter leaf (of one layer, for a stack)."""
    params = _case(name)[0][0]
    per_layer = 1 if name in BLOCKS else client_models.LAYERS
    return sorted(leaf.size // per_layer for leaf in jax.tree.leaves(params))


def minus(items: list[int], removed: list[int]) -> list[int]:
    return sorted((collections.Counter(items) - collections.Counter(removed)).elements())


ACTIVATION = client_models.BATCH // MESH.axes["batch"] * client_models.SEQ * client_models.WIDTH
"""Elements of one device's residual stream: its sequences, whole."""

NORM = client_models.WIDTH
"""Elements of a norm's scale (or bias)."""


@pytest.mark.parametrize(
    "name",
    # equinox's scanned stack (60 s on 2 cores) keeps its ZeRO, pipeline and
    # partir-opt tests in the CI profile; its data parallelism runs with -m slow
    [pytest.param(name, marks=[pytest.mark.slow, pytest.mark.xdist_group(name)])
     if name == "equinox lax.scan" else pytest.param(name, marks=pytest.mark.xdist_group(name))
     for name in sorted(MODELS)],
)
def test_data_parallel_sums_each_gradient_and_the_loss_only(name):
    """Default `BatchParallel`: x and y are split (optax's state and the
    parameters come back updated, so they are state); every collective is an
    all-reduce over "batch" of one parameter's gradient, or of the loss. The
    emitted program runs on JAX equal to `jax.jit`. In a stack, each layer's gradients are summed inside the backward loop (the
    scan stays a loop) and only the loss outside it."""
    program = run_and_check(name, "DP")
    args, want = _case(name)
    assert_leaves_close(program.compile()(*args), want, what=f"{name} step on JAX")
    params = parameter_sizes(name)
    assert kinds(program.collectives) == {("all_reduce", ("batch",)): len(params) + 1}
    assert sizes(program.collectives) == sorted([*params, 1])
    if name in STACKS:
        assert "stablehlo.while" in program.stage("import")
        in_loops = [c for c in program.collectives if loop_of(c) is not None]
        assert sizes(in_loops) == params


@pytest.mark.parametrize("name", BY_MODEL)
def test_megatron_all_reduces_activations_over_model(name):
    """Each library's Megatron: flax's `ManualPartition` (attention kernels
    split on their heads dim), haiku's `Megatron` with its modules' paths,
    equinox's default `Megatron` (its names fit the conventions; its `[out,
    in]` weights are split on the right dims). Over "model", only whole
    activations are summed (see the module docstring for which); over
    "batch", the gradients and the loss, as without Megatron."""
    program = run_and_check(name, "DP+Megatron")
    params = parameter_sizes(name)
    over_model = [c for c in program.collectives if c.axes == ("model",)]
    if name in BLOCKS:
        assert kinds(program.collectives) == {
            ("all_reduce", ("batch",)): len(params) - 1,
            ("all_reduce", ("model",)): 3,
            ("all_reduce", ("batch", "model")): 2,
        }
        both = [c for c in program.collectives if c.axes == ("batch", "model")]
        assert sizes(both) == [NORM, NORM]  # the first norm's scale and bias
        over_batch = [c for c in program.collectives if c.axes == ("batch",)]
        # the gradients as each device holds them: the Megatron-split leaves
        # (the matrices and the MLP's first bias, HIDDEN elements or more) half
        split = client_models.HIDDEN
        held = [n // 2 if n >= split else n for n in minus(params, [NORM, NORM])]
        assert sizes(over_batch) == sorted([*held, 1])
    else:
        assert kinds(program.collectives) == {
            ("all_reduce", ("batch",)): len(params) + 1,
            ("all_reduce", ("model",)): 4,
        }
        assert all(loop_of(c) is not None for c in over_model)
    assert {moved(c) for c in over_model} == {ACTIVATION}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xdist_group(name))
    for name in ("flax", "flax nn.scan", "haiku")
])
def test_default_megatron_is_the_hand_written_split(name):
    """Default `Megatron` on flax's names (`MultiHeadDotProductAttention_0/
    query/kernel` `[in, heads, head_dim]`, `Dense_0`/`Dense_1`, with a
    stack's layer dim under `nn.scan`) and haiku's (`'multi_head_attention/
    query'` and `linear` in one key with their module, `'mlp/~/linear_0'`)
    plans the tiles of the hand-written strategy (`client.megatron`): heads,
    the output projection on heads, the MLP column then row."""
    client = _client(name)
    module = partir.import_jax(client.step, *_case(name)[0])
    view = ProgramView.of(entry_function(module))

    def tiles(tactic: partir.Tactic) -> set[tuple[str, int, str]]:
        return {(t.leaf.name, t.dim % len(t.leaf.shape), t.axis) for t in tactic.plan(view, MESH)}

    assert tiles(partir.Megatron("model")) == tiles(client.megatron)


@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("name", BY_MODEL)
def test_zero_shards_the_optimizer_state_and_parameters(name, stage):
    """`ZeRO("batch", stage)` after `BatchParallel`: optax's `mu` and `nu`
    (and at stage 3 the parameters) are split over "batch". Each gradient is
    reduce-scattered once instead of all-reduced, each parameter all-gathered
    where it is used (stage 3), and the loss all-reduced: no activation
    moves. A leaf whose dim 0 is shorter than the 4 devices (flax's attention
    output kernel `[heads=2, head_dim, out]`, a stack's 2 layers) is split on
    its next dim, not left whole: in a stack, each layer is gathered inside
    the loops, once forward and again backward where the backward reads it."""
    program = run_and_check(name, f"ZeRO-{stage}")
    params = parameter_sizes(name)
    scattered = [c for c in program.collectives if c.kind == "reduce_scatter"]
    gathered = [c for c in program.collectives if c.kind == "all_gather"]
    assert [c.axes for c in program.collectives] == [("batch",)] * len(program.collectives)
    assert sizes(scattered) == params
    assert [moved(c) for c in program.collectives if c.kind == "all_reduce"] == [1]
    if stage == 1:  # each update gathered once: the parameters return as they came
        whole = sorted(leaf.size for leaf in jax.tree.leaves(_case(name)[0][0]))
        assert sizes(gathered) == whole and all(loop_of(c) is None for c in gathered)
    elif name in BLOCKS:
        assert sizes(gathered) == params
    else:
        matrices = [n for n in params if n >= client_models.WIDTH**2]
        matrices_and_scales = [*matrices, NORM, NORM]
        assert sizes([c for c in gathered if loop_of(c) == 0]) == params
        assert sizes([c for c in gathered if loop_of(c) == 1]) == sorted(matrices_and_scales)
        assert all(loop_of(c) == 1 for c in scattered)


# --------------------------------------------------------------------------
# partir-opt on JAX's text of each model


@pytest.mark.parametrize("strategy", sorted(CLI_STRATEGIES))
@pytest.mark.parametrize("name", BY_MODEL)
def test_partir_opt_partitions_the_jax_text_of_each_model(name, strategy, tmp_path):
    """`jax.jit(step).lower(*args).as_text()` through `partir-opt`: the
    arguments are only positions there (`%arg0`...), and the default
    `partir-batch-parallel` and `partir-zero` still tell the data, the state
    and the parameters apart by the program's structure. The SPMD stage it
    writes parses back, runs (on the reference interpreter) equal to
    `jax.jit`, and has the collectives of the Python path's."""
    args, want = _case(name)
    source, spmd = tmp_path / "step.mlir", tmp_path / "step.spmd.mlir"
    source.write_text(jax_text(name))
    pipeline = (
        f'inline-calls,partir-declare-mesh{{axes="batch=4","model=2"}},'
        f"{CLI_STRATEGIES[strategy]},partir-lower-spmd"
    )
    assert partir_opt([str(source), "-p", pipeline, "-o", str(spmd)]) == 0
    module = parse_module(spmd.read_text(), str(spmd))
    assert_leaves_close(run_spmd(module, jax.tree.leaves(args)), jax.tree.leaves(want),
                        what=f"{name} via partir-opt, {strategy}")

    def signature(found: list[Collective]) -> collections.Counter:
        return collections.Counter((c.kind, c.axes, c.operand, c.result) for c in found)

    assert signature(collectives(module)) == signature(lowered(name, strategy).collectives)


# --------------------------------------------------------------------------
# Pipeline over each library's stack


@pytest.mark.parametrize(("name", "axes"), [
    pytest.param("flax nn.scan", {"stage": 2, "batch": 2}, marks=pytest.mark.xdist_group("flax nn.scan")),
    # haiku's stack pipelines as flax's does (the same loop IR): the long profile
    pytest.param("haiku hk.layer_stack", {"stage": 2, "batch": 2}, marks=pytest.mark.slow),
    pytest.param("equinox lax.scan", {"stage": 2, "batch": 2, "model": 2},
                 marks=pytest.mark.xdist_group("equinox lax.scan")),
])
def test_pipeline_splits_each_library_s_stack_over_stages(name, axes):
    """`Pipeline` on the stacks the libraries make (flax's `nn.scan`, which
    fixes its layer count in its code: the IR splits the loop's trip count
    with its rows; haiku's `hk.layer_stack`; equinox's vmapped layers under
    `lax.scan`, with `Megatron` inside each stage): every stacked leaf and
    its optimizer state split over "stage" on the layer dim, and the loss,
    parameters and optax state are jax.jit's."""
    client = _client(name)
    args, want = _case(name)
    tactics = [partir.Pipeline("stage", 2), DATA]
    if "model" in axes:
        tactics.append(client.megatron)
    jitted = partir.jit(client.step, mesh=partir.Mesh(axes), tactics=tactics)
    lowered = jitted.lower(*args)
    leaves = jax.tree.leaves(args[:2])
    dists = [t.distribution for t in entry_function(lowered.module).function_type.inputs.data]
    for x, dist in zip(leaves, dists, strict=False):
        stacked = x.ndim > 0 and x.shape[0] == 2
        assert (dist.dims[0][:1] == ("stage",)) == stacked if x.ndim else not dist.axes
    assert_leaves_close(jax.tree.leaves(jitted(*args)), jax.tree.leaves(want),
                        what=f"{name}, pipelined")


# --------------------------------------------------------------------------
# Flax NNX: a GPT trained with nnx.Optimizer and optax's AdamW in NNX's
# functional form (`tests/client_models.py`), its state in one argument
# (`nnx.split((model, optimizer))`) or in two. Every leaf's path ends in
# NNX's `.value`, and dropout keeps RNG counters and keys beside the
# parameters: the tactics see through the one and leave the others whole.

NNX_FORMS: dict[str, Callable[[], client_models.NNXClient]] = {
    "nnx one state": client_models.nnx_gpt_one_state,
    "nnx split": client_models.nnx_gpt_split,
}
BY_NNX_FORM = [pytest.param(name, marks=pytest.mark.xdist_group(name)) for name in NNX_FORMS]
NNX_COMBINED_IN_CI = [
    pytest.param(name, marks=[pytest.mark.xdist_group(name)] + (
        [] if name == "nnx one state" else [pytest.mark.slow]))
    for name in NNX_FORMS
]
"""The combined state argument (the harder form) in CI, split arguments in
the long profile, where both forms of a test cost the same collectives:
`test_nnx_default_megatron_is_the_heads_split` runs both in CI."""

NNX_STRATEGIES: dict[str, Callable[[client_models.NNXClient], list[partir.Tactic]]] = {
    "DP": lambda client: [DATA],
    "DP+Megatron": lambda client: [DATA, partir.Megatron("model")],
    "DP+heads split": lambda client: [DATA, client.heads_split],
    "ZeRO-1": lambda client: [DATA, partir.ZeRO("batch", stage=1)],
    "ZeRO-2": lambda client: [DATA, partir.ZeRO("batch", stage=2)],
    "ZeRO-3": lambda client: [DATA, partir.ZeRO("batch", stage=3)],
    "Automatic": lambda client: [
        DATA, partir.Automatic(profile="cpu-host-8", progress=False, time_budget_s=30)
    ],
}


@functools.cache
def _nnx_case(name: str) -> tuple[client_models.NNXClient, Any]:
    """The NNX client and `jax.jit`'s result on its arguments."""
    pytest.importorskip("flax.nnx", reason="the NNX model needs flax")
    pytest.importorskip("optax", reason="the NNX model trains with optax")
    client = NNX_FORMS[name]()
    return client, jax.jit(client.step)(*client.args)


def raw_leaves(tree: Any) -> list[Any]:
    """The leaves as partir's program takes them: typed keys as their data."""
    return jax.tree.leaves(KeyBoundary.of((tree,)).raw((tree,)))


@functools.cache
def nnx_lowered(name: str, strategy: str) -> partir.Lowered:
    client, _ = _nnx_case(name)
    tactics = NNX_STRATEGIES[strategy](client)
    return partir.jit(client.step, mesh=MESH, tactics=tactics).lower(*client.args)


def nnx_run_and_check(name: str, strategy: str) -> partir.Lowered:
    """The NNX step's SPMD stage equals `jax.jit` on the reference
    interpreter (loss, parameters, AdamW's state, the RNG counters and
    keys), with no conflicts."""
    client, want = _nnx_case(name)
    program = nnx_lowered(name, strategy)
    got = run_spmd(program.module, raw_leaves(client.args))
    assert_leaves_close(got, raw_leaves(want), what=f"{name} step, {strategy}")
    assert program.conflicts == []
    return program


def nnx_parameters(name: str) -> list[int]:
    """Elements of each trained leaf (the optimizer's `mu` mirrors them)."""
    client, _ = _nnx_case(name)
    opt_state = client.args[0][1] if name == "nnx one state" else client.args[1]
    return sorted(leaf.size for leaf in jax.tree.leaves(opt_state["opt_state"][0]["mu"]))


@pytest.mark.parametrize("name", NNX_COMBINED_IN_CI)
def test_nnx_data_parallel_sums_each_gradient_and_the_loss_only(name):
    """Default `BatchParallel`: the tokens and targets are the data (the
    state comes back updated, RNG counters included); every collective is
    one parameter's gradient or the loss summed over "batch", and the
    emitted program runs on JAX equal to `jax.jit`, keys and all."""
    program = nnx_run_and_check(name, "DP")
    client, want = _nnx_case(name)
    assert_leaves_close(raw_leaves(program.compile()(*client.args)), raw_leaves(want),
                        what=f"{name} step on JAX")
    assert kinds(program.collectives) == {("all_reduce", ("batch",)): len(nnx_parameters(name)) + 1}
    assert sizes(program.collectives) == sorted([*nnx_parameters(name), 1])
    data = [s for s in program.report().selections if s.role == "data"]
    assert [display_path(s.leaf) for s in data] == ["tokens", "targets"]


@pytest.mark.parametrize("name", BY_NNX_FORM)
def test_nnx_default_megatron_is_the_heads_split(name):
    """Default `Megatron` on NNX's names (`attn/query/kernel.value`, `up`,
    `down`): q/k/v `[in, heads, head_dim]` split on heads, `out` `[heads,
    head_dim, out]` on heads, the MLP pair column then row, the RNG
    counters and keys left alone. It moves no more bytes per device than the
    hand-written heads split (`NNXClient.heads_split`), with no conflicts,
    and the report says why each leaf was split where it was."""
    default = nnx_run_and_check(name, "DP+Megatron")
    by_hand = nnx_run_and_check(name, "DP+heads split")
    moved_bytes = sum(c.bytes_per_device for c in default.collectives)
    assert moved_bytes <= sum(c.bytes_per_device for c in by_hand.collectives)
    assert kinds(default.collectives) == kinds(by_hand.collectives)
    assert ("all_reduce", ("model",)) in kinds(default.collectives)
    split = {
        display_path(s.leaf).split("/", 2 if name == "nnx one state" else 1)[-1]: s
        for s in default.report().selections if s.tactic == "Megatron(model)" and s.dim is not None
    }
    assert {leaf: s.dim for leaf, s in split.items() if "blocks/0/" in leaf} == {
        "blocks/0/attn/query/kernel": 1, "blocks/0/attn/key/kernel": 1,
        "blocks/0/attn/value/kernel": 1, "blocks/0/attn/out/kernel": 0,
        "blocks/0/up/kernel": 1, "blocks/0/up/bias": 0, "blocks/0/down/kernel": 0,
    }
    assert len(split) == 2 * 7
    assert split["blocks/1/attn/query/kernel"].reason.endswith("split on its heads dim")
    assert split["blocks/1/attn/out/kernel"].role == "row weight"
    assert "the MLP pair up/kernel [16, 32] then down/kernel [32, 16]" in (
        split["blocks/1/down/kernel"].reason)


@pytest.mark.parametrize("stage", [1, pytest.param(2, marks=pytest.mark.slow), 3])
@pytest.mark.parametrize("name", NNX_COMBINED_IN_CI)
def test_nnx_zero_finds_the_optimizer_state(name, stage):
    """`ZeRO("batch", stage)` after `BatchParallel`: AdamW's `mu` and `nu`
    are found by their mirroring the model's parameters, inside the one
    state argument as across two, and split over "batch" (at stage 3 the
    parameters too, the RNG counters and keys beside them left whole); the
    numbers are `jax.jit`'s, every collective is over "batch", and each
    gradient is reduce-scattered."""
    program = nnx_run_and_check(name, f"ZeRO-{stage}")
    zero = [s for s in program.report().selections if s.tactic == f"ZeRO-{stage}(batch)"]
    moments = [s for s in zero if s.role == "optimizer state" and s.dim is not None]
    assert len(moments) == 2 * len(nnx_parameters(name))
    assert all(re.search("/(mu|nu)/", display_path(s.leaf)) for s in moments)
    assert all(c.axes == ("batch",) for c in program.collectives)
    assert "reduce_scatter" in {c.kind for c in program.collectives}
    if stage == 3:
        rngs = [s for s in zero if "/rngs/" in display_path(s.leaf) and s.leaf.startswith(
            "state[0]" if name == "nnx one state" else "params")]
        assert len(rngs) == 2 * client_models.LAYERS
        assert all(s.dim is None and "not trained" in s.reason for s in rngs)


@pytest.mark.slow
@pytest.mark.parametrize("name", BY_NNX_FORM[:1])
def test_nnx_automatic_searches_the_model_axis(name):
    """`Automatic` after `BatchParallel` searches "model" on the one-state
    step (Megatron's heads split among its candidates) and keeps `jax.jit`'s
    numbers."""
    program = nnx_run_and_check(name, "Automatic")
    (search,) = program.searches
    assert search.chosen is not None
