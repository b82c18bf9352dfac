"""Expert parallelism in GShard's layout: tokens split over every device,
the experts over "model", tokens sent to their experts by all-to-all.

The layer is GShard's top-2 MoE with capacity: router logits, top-2 gates,
a one-hot dispatch mask [groups, tokens, experts, capacity], the experts'
inputs [experts, groups, capacity, d], a per-expert MLP with stacked weights
[experts, d, h], and the combine back to [groups, tokens, d]. The groups are
split over "batch" and "model"; the dispatched tokens are split on their
group dim and the weights on their expert dim, so each expert einsum either
gathers the weights or exchanges the tokens: propagation takes the cheaper
by bytes (`rewrites.conflicts.cheaper_exchange`) and the conflict says so.
jax.jit, given the same shardings, gathers the weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from benchmarks.hlo_stats import collective_stats
from benchmarks.vs_jit import baseline
from dialects.interpreter.spmd import run_spmd
from lowering.collectives import collectives
from partir.opt import main as partir_opt
from partir.report import parse_module
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})


def top2_by_top_k(probs):
    """The two largest gates and their experts one-hot [..., 2, experts]."""
    gates, experts = jax.lax.top_k(probs, 2)
    return gates, jax.nn.one_hot(experts, probs.shape[-1], dtype=probs.dtype)


def top2_by_max(probs):
    """The same by max and compare (GShard's argmax, then masking the first)."""
    first_gate = jnp.max(probs, axis=-1, keepdims=True)
    first = (probs == first_gate).astype(probs.dtype)
    rest = jnp.where(first > 0, -1.0, probs)
    second_gate = jnp.max(rest, axis=-1, keepdims=True)
    second = (rest == second_gate).astype(probs.dtype)
    return jnp.concatenate([first_gate, second_gate], -1), jnp.stack([first, second], -2)


def gshard_moe(router, w_in, w_out, x, top2, b_in=None, activation=jax.nn.gelu):
    """x: [groups, tokens, d]; each expert takes up to 2 * tokens / experts per group."""
    groups, tokens, _ = x.shape
    experts = router.shape[-1]
    capacity = 2 * tokens // experts
    probs = jax.nn.softmax(jnp.einsum("gsd,de->gse", x, router), axis=-1)
    gates, chosen = top2(probs)  # [g, s, 2], [g, s, 2, e]
    # Each token's place in its expert's buffer: first choices before second ones.
    order = chosen.transpose(0, 2, 1, 3).reshape(groups, 2 * tokens, experts)
    place = ((jnp.cumsum(order, axis=1) - 1.0) * order).reshape(groups, 2, tokens, experts)
    place = place.transpose(0, 2, 1, 3)
    kept = chosen * (place < capacity)
    slot = jax.nn.one_hot(jnp.sum(place * kept, axis=-1).astype(jnp.int32), capacity)
    combine = jnp.einsum("gsk,gske,gskc->gsec", gates, kept, slot)
    dispatch = (combine > 0).astype(x.dtype)
    expert_inputs = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    hidden = jnp.einsum("egcd,edh->egch", expert_inputs, w_in)
    if b_in is not None:
        hidden = hidden + b_in[:, None, None, :]
    outputs = jnp.einsum("egch,ehd->egcd", activation(hidden), w_out)
    return jnp.einsum("gsec,egcd->gsd", combine, outputs)


def layer(params, x):
    return gshard_moe(params["router"], params["w_in"], params["w_out"], x, top2_by_max)


def layer_top_k(params, x):
    return gshard_moe(params["router"], params["w_in"], params["w_out"], x, top2_by_top_k)


def make_args(experts=4, width=16, hidden=32, groups=8, tokens=16, seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "router": rng.standard_normal((width, experts)).astype(np.float32),
        "w_in": (rng.standard_normal((experts, width, hidden)) * 0.2).astype(np.float32),
        "w_out": (rng.standard_normal((experts, hidden, width)) * 0.2).astype(np.float32),
    }
    return params, rng.standard_normal((groups, tokens, width)).astype(np.float32)


EXPERTS = partir.ExpertParallel("model", experts=["params/w_in", "params/w_out"])


def jit_bytes(program, args, compiled) -> tuple[int, int]:
    """Collective bytes per device of partir's program and of jax.jit's with
    the same input and output shardings, both from XLA's compiled HLO."""
    reference, in_shardings = baseline(program, args, compiled)
    inputs = [jax.device_put(a, s)
              for a, s in zip(jax.tree_util.tree_leaves(args), in_shardings, strict=True)]
    ours = collective_stats(compiled.run.lower(*inputs).compile().as_text())
    theirs = collective_stats(reference.lower(*inputs).compile().as_text())
    return ours["total"]["bytes"], theirs["total"]["bytes"]


def gathered(lowered, weights: set[str]) -> list:
    """The all-gathers of `weights` (the collectives their actions caused)."""
    return [c for c in lowered.report().collectives
            if c.kind == "all_gather" and c.value in weights]


WEIGHTS = {"params['w_in']", "params['w_out']"}


SHARDINGS = partir.ManualPartition(
    {"x": {0: "model"}, "params/w_in": {0: "model"}, "params/w_out": {0: "model"}}
)
"""The same layout as a user's shardings: propagation makes the same choice."""


@pytest.mark.parametrize("experts", [
    EXPERTS, pytest.param(SHARDINGS, marks=pytest.mark.slow),
], ids=["ExpertParallel", "shardings"])
def test_a_gshard_layer_sends_tokens_to_the_experts_and_back_by_all_to_all(experts):
    args = make_args()
    compiled = partir.jit(layer, mesh=MESH, tactics=[partir.BatchParallel("batch"), experts])
    assert_leaves_close(compiled(*args), jax.jit(layer)(*args), what="GShard layer")
    lowered = compiled.lower(*args)
    kinds = sorted((c.kind, c.axes) for c in lowered.collectives)
    assert kinds == [("all_to_all", ("model",))] * 2, kinds  # dispatch, combine
    exchanged = [c for c in lowered.conflicts if "the later action wins by exchanging" in c.detail]
    assert [c.winner for c in exchanged] == [f"action 3 ({experts.name} of params['w_in'])"]
    assert "instead of all-gathering operand 1" in exchanged[0].detail

    ours, theirs = jit_bytes(layer, args, lowered.compile())
    assert ours <= theirs, (ours, theirs)


@pytest.mark.slow  # the training step below routes by top_k too
def test_a_top_k_router_dispatches_by_all_to_all_and_never_gathers_the_experts():
    """`lax.top_k` runs on each device's tokens (`tests/test_multi_result.py`);
    the dispatch is an all-to-all, and the experts are never gathered."""
    args = make_args()
    compiled = partir.jit(layer_top_k, mesh=MESH, tactics=[partir.BatchParallel("batch"), EXPERTS])
    assert_leaves_close(compiled(*args), jax.jit(layer_top_k)(*args), what="top_k layer")
    lowered = compiled.lower(*args)
    assert gathered(lowered, WEIGHTS) == []
    assert any(c.kind == "all_to_all" for c in lowered.collectives)
    ours, theirs = jit_bytes(layer_top_k, args, lowered.compile())
    assert ours <= theirs, (ours, theirs)


def nested_layer(params, x):
    """Another program: its own names and tree, 8 experts with a bias, relu."""
    moe = params["moe"]
    return gshard_moe(
        params["gate"]["kernel"], moe["experts_w1"], moe["experts_w2"], x, top2_by_top_k,
        b_in=moe["experts_b1"], activation=jax.nn.relu,
    )


def train_step(params, x, y):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((nested_layer(p, x) - y) ** 2))(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss


def test_a_training_step_through_the_experts_keeps_them_split():
    rng = np.random.default_rng(1)
    experts, width, hidden = 8, 8, 16
    params = {
        "gate": {"kernel": rng.standard_normal((width, experts)).astype(np.float32)},
        "moe": {
            "experts_w1": (rng.standard_normal((experts, width, hidden)) * 0.3).astype(np.float32),
            "experts_b1": (rng.standard_normal((experts, hidden)) * 0.1).astype(np.float32),
            "experts_w2": (rng.standard_normal((experts, hidden, width)) * 0.3).astype(np.float32),
        },
    }
    x = rng.standard_normal((8, 16, width)).astype(np.float32)
    y = rng.standard_normal((8, 16, width)).astype(np.float32)
    args = (params, x, y)
    tactics = [partir.BatchParallel("batch"), partir.ExpertParallel("model")]  # names find them
    compiled = partir.jit(train_step, mesh=MESH, tactics=tactics)
    assert_leaves_close(compiled(*args), jax.jit(train_step)(*args), what="MoE training step")

    lowered = compiled.lower(*args)
    report = lowered.report()
    split = {s.leaf for s in report.selections if s.role == "expert weight"}
    assert split == {f"params['moe']['{n}']" for n in ("experts_b1", "experts_w1", "experts_w2")}
    assert gathered(lowered, split) == []
    # Forward dispatch, and the output gradient sent to the experts (x
    # takes no gradient).
    assert sum(c.kind == "all_to_all" for c in lowered.collectives) >= 2
    # The experts' gradients stay split: summed over "batch" only.
    model_sums = [c for c in lowered.collectives if c.kind == "all_reduce" and "model" in c.axes]
    assert all(c.bytes_per_device <= 4 * width * experts for c in model_sums), model_sums
    ours, theirs = jit_bytes(train_step, args, lowered.compile())
    assert ours <= theirs, (ours, theirs)


def test_tiny_experts_are_gathered_when_that_moves_fewer_bytes():
    """Many tokens, small experts: gathering the weights is cheaper than
    exchanging the tokens, so the weights are gathered, and the conflict
    gives both costs."""
    args = make_args(experts=2, width=4, hidden=4, groups=8, tokens=64)
    compiled = partir.jit(layer, mesh=MESH, tactics=[partir.BatchParallel("batch"), EXPERTS])
    assert_leaves_close(compiled(*args), jax.jit(layer)(*args), what="tiny experts")
    lowered = compiled.lower(*args)
    assert {c.value for c in gathered(lowered, WEIGHTS)} == WEIGHTS
    kept = [c for c in lowered.conflicts if "no more than exchanging" in c.detail]
    assert kept and all(c.winner == "action 2 (ExpertParallel of x)" for c in kept), kept
    ours, theirs = jit_bytes(layer, args, lowered.compile())
    assert ours <= theirs, (ours, theirs)


def test_expert_parallel_names_what_to_pass():
    args = make_args()
    with pytest.raises(partir.TacticError, match=r"no parameter is named like an expert.*experts="):
        partir.jit(layer, mesh=MESH, tactics=[partir.ExpertParallel("model")]).lower(*args)
    experts = partir.ExpertParallel("model", experts="params/*")
    with pytest.raises(partir.TacticError, match=r"disagree on the number of experts.*router"):
        partir.jit(layer, mesh=MESH, tactics=[experts]).lower(*args)


def test_partir_opt_runs_expert_parallel_on_jax_text(tmp_path):
    """The pass `partir-expert-parallel` on `jax.jit(layer)`'s text, whose
    arguments are positions (`args/1` is w_in): the same two all-to-alls,
    and the reference interpreter's numbers equal jax.jit's."""
    args = make_args()
    source, spmd = tmp_path / "layer.mlir", tmp_path / "layer.spmd.mlir"
    source.write_text(jax.jit(layer).lower(*args).as_text())
    pipeline = (
        'inline-calls,partir-declare-mesh{axes="batch=4","model=2"},'
        'partir-batch-parallel{axis=batch inputs="args/3"},'
        'partir-expert-parallel{axis=model experts="args/1","args/2" inputs="args/3"},'
        'partir-lower-spmd'
    )
    assert partir_opt([str(source), "-p", pipeline, "-o", str(spmd)]) == 0
    module = parse_module(spmd.read_text(), str(spmd))
    assert sorted(c.kind for c in collectives(module)) == ["all_to_all", "all_to_all"]
    assert_leaves_close(run_spmd(module, jax.tree.leaves(args)), [jax.jit(layer)(*args)],
                        what="GShard layer via partir-opt")
