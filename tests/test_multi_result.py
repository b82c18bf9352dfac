"""Ops with several results keep their tiling (issue 35, item 4).

`jnp.argmax`/`argmin` (a reduce of values and indices), `lax.top_k` and
`jnp.argsort`/`lax.sort` by keys have two results each: each result gets a
loop of its own (`rewrites.tiling.tile_results`), so the dims they do not
work along stay split. Along a split dim, argmax and top_k are regrouped
(`OpRule.regroup`): each device picks from its part, with global indices,
and only the picks (1 or k per device and row) are gathered before the
final pick; a sort along a split dim still gathers its operands.
Data with few distinct values makes ties common: the picks must be the
lowest indices among equals, as jax.jit's are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from dialects.interpreter.spmd import run_spmd
from tests.decision_check import compare

MESH = partir.Mesh({"batch": 4, "model": 2})


def grid(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Few distinct values: many ties."""
    return np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float32)


def routed(x):
    """Probabilities, their top 2 and the gates renormalised (a router)."""
    gates, experts = lax.top_k(jax.nn.softmax(x, axis=-1), 2)
    return gates / jnp.sum(gates, axis=-1, keepdims=True), experts + 1


PROGRAMS = {
    "router": routed,
    "argmax": lambda x: jnp.argmax(x, axis=1),
    "argmin": lambda x: jnp.argmin(x, axis=-1),
    "max and argmax": lambda x: (jnp.max(x, axis=1), jnp.argmax(x, axis=1)),
    "top_k": lambda x: lax.top_k(x, 3),
    "top_1": lambda x: lax.top_k(x * 2.0, 1),
    "argsort": lambda x: jnp.argsort(x, axis=1),
    "sort by key": lambda x: lax.sort((x, -x), dimension=1, num_keys=1),
}

ROWS = partir.BatchParallel("batch", inputs="x")
BOTH = partir.ManualPartition({"x": {0: "batch", 1: "model"}})


def assert_same(got, want) -> None:
    """Indices and picked values exactly; computed floats (a router's
    softmax, summed in another order) to rounding."""
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_split_rows_are_picked_from_on_their_devices(name):
    fn, x = PROGRAMS[name], grid((8, 16))
    compiled = partir.jit(fn, mesh=MESH, tactics=[ROWS])
    assert_same(compiled(x), jax.jit(fn)(x))
    lowered = compiled.lower(x)
    assert lowered.collectives == [], lowered.collectives
    assert_same(run_spmd(lowered.module, [x]), jax.jit(fn)(x))


PICKS = {"argmax": 1, "argmin": 1, "top_k": 3, "top_1": 1}
"""Programs that pick along the split dim, and how many per row."""


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_picking_along_a_split_dim_gathers_the_picks_not_the_rows(name):
    fn, x = PROGRAMS[name], grid((8, 16), seed=1)
    compiled = partir.jit(fn, mesh=MESH, tactics=[BOTH])
    assert_same(compiled(x), jax.jit(fn)(x))
    collectives = compiled.lower(x).collectives
    assert collectives and all(c.axes == ("model",) for c in collectives), collectives
    rows = 8 // 4
    if name in PICKS:  # (value, index) picks of each of the 2 parts
        assert all(c.kind == "all_gather" for c in collectives)
        assert max(c.bytes_per_device for c in collectives) == rows * 2 * PICKS[name] * 4
    else:  # a max reduce (a softmax's too) or a sort along the split dim gathers the rows
        assert max(c.bytes_per_device for c in collectives) == rows * 16 * 4


@pytest.mark.parametrize("shape", [(6, 16), (8, 15), (8, 20)], ids=["rows-6", "cols-15", "cols-20"])
@pytest.mark.parametrize("name", ["argmax", "top_k", "argsort"])
def test_uneven_sizes_give_jax_jits_numbers(name, shape):
    """Rows or columns the axis does not divide (padded), or columns split
    into parts of 10 (top_k's groups hold more than k)."""
    fn, x = PROGRAMS[name], grid(shape, seed=2)
    compiled = partir.jit(fn, mesh=MESH, tactics=[BOTH])
    assert_same(compiled(x), jax.jit(fn)(x))


def test_the_last_of_equal_values_is_never_picked_first():
    """All ties: every part's first element equals the whole's maximum."""
    x = np.zeros((8, 16), np.float32)
    x[:, 5] = x[:, 12] = 1.0  # equal maxima in the two parts
    for fn in (PROGRAMS["argmax"], PROGRAMS["top_k"], lambda x: lax.top_k(-x, 4)):
        compiled = partir.jit(fn, mesh=MESH, tactics=[BOTH])
        assert_same(compiled(x), jax.jit(fn)(x))


STEPS, VOCAB = 4, 32


def greedy_decode(params, tokens):
    """Greedy decoding: logits = h @ lm_head, the next token their argmax."""

    def step(i, carry):
        out, last = carry
        h = jnp.tanh(params["embed"][last] @ params["w_up"])
        logits = h @ params["lm_head"]  # [batch, vocab]
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return out.at[:, i].set(token), token

    out = jnp.zeros((tokens.shape[0], STEPS), jnp.int32)
    return lax.fori_loop(0, STEPS, step, (out, tokens))[0]


def decode_args(batch=8, width=16, hidden=24):
    rng = np.random.default_rng(3)
    params = {
        "embed": rng.standard_normal((VOCAB, width)).astype(np.float32),
        "w_up": rng.standard_normal((width, hidden)).astype(np.float32),
        "lm_head": rng.standard_normal((hidden, VOCAB)).astype(np.float32),
    }
    return params, rng.integers(0, VOCAB, batch).astype(np.int32)


def test_greedy_decoding_gathers_no_logits():
    """BatchParallel + Megatron with the vocabulary split over "model": each
    token's argmax gathers one (logit, token) pair per device and row, never
    the [batch, vocab] logits (256 bytes per device here)."""
    args = decode_args()
    tactics = [partir.BatchParallel("batch"), partir.Megatron("model", column=["params/lm_head"])]
    compiled = partir.jit(greedy_decode, mesh=MESH, tactics=tactics)
    assert_same(compiled(*args), jax.jit(greedy_decode)(*args))
    collectives = compiled.lower(*args).collectives
    logits = (8 // 4) * VOCAB * 4
    assert all(c.bytes_per_device < logits // 4 for c in collectives), collectives
    assert sorted((c.kind, c.axes, c.bytes_per_device) for c in collectives) == [
        ("all_gather", ("model",), 16)
    ] * 2  # the (value, index) pairs, inside the loop


def test_the_moe_routers_top_k_runs_on_the_local_batch():
    from tests.test_expert_parallel import EXPERTS, layer_top_k, make_args

    args = make_args()
    compiled = partir.jit(layer_top_k, mesh=MESH, tactics=[partir.BatchParallel("batch"), EXPERTS])
    lowered = compiled.lower(*args)
    top_ks = [op for op in lowered.module.walk() if op.name == "chlo.top_k"]
    groups = args[1].shape[0]
    assert top_ks  # one per result used (the same op on the same part: XLA merges them)
    for top_k in top_ks:  # the groups are split over every device
        assert top_k.operands[0].type.get_shape()[0] == groups // MESH.size
    assert not [c for c in lowered.collectives if c.kind == "all_gather" and "batch" in c.axes]


@pytest.mark.parametrize("name", ["argmax", "router", "argsort", "sort by key"])
def test_the_decisions_equal_the_rewrite_engines(name):
    found = compare(partir.import_jax(PROGRAMS[name], grid((8, 16))), MESH, [ROWS])
    assert found.ops > 0
    assert not found.mismatched, found.mismatched
    assert not found.arguments, found.arguments


@pytest.mark.parametrize("tactics", [[ROWS], [BOTH]], ids=["rows", "rows-and-picks"])
@pytest.mark.parametrize("name", ["argmax", "router", "argsort"])
def test_the_decided_engine_gives_the_rewrite_engines_program(name, tactics, rewrite_engine_runs):
    """The decided path builds a split op of several results (a copy per
    used result, as the engine's loop per result) and regroups a pick along
    a split dim before deciding again, without the rewrite engine: the
    engine's numbers and collectives, or fewer bytes (the router's top 2
    regrouped once gathers one pick array where the engine's two loops
    gather one each)."""
    from tests.test_build_core import check_against_engine

    check_against_engine(PROGRAMS[name], (grid((8, 16)),), tactics, fewer_bytes=True)
    assert len(rewrite_engine_runs) == 1  # the reference's own partition only


def test_the_decisions_equal_the_rewrite_engines_in_a_decoding_loop():
    """The argmax inside a `fori_loop`, on each device's rows (the vocabulary
    whole: an argmax along a split dim is the rewrite engine's alone, see
    `rewrites.factor_propagation`)."""
    module = partir.import_jax(greedy_decode, *decode_args())
    found = compare(module, MESH, [partir.BatchParallel("batch")])
    assert found.ops > 0
    assert not found.mismatched, found.mismatched
    assert not found.arguments, found.arguments


def test_the_decisions_equal_the_rewrite_engines_picking_along_a_split_dim():
    """Every value of the program is sharded alike; only how the engine
    computes the pick (regrouped) is its own: `decide` keeps the op whole,
    and the default path regroups it in the module and decides again
    (`factor_propagation.regroup_ops`)."""
    found = compare(partir.import_jax(PROGRAMS["max and argmax"], grid((8, 16))), MESH, [BOTH])
    assert found.ops > 0
    assert not found.mismatched, found.mismatched


@pytest.mark.parametrize("name", ["argmax", "router"])
def test_asking_whether_a_pick_regroups_leaves_the_program_as_it_was(name):
    """`would_regroup` answers by making the regrouped ops: it erases them,
    so the operands it read keep the uses they had (an op made and left
    would stay a use of the program's values)."""
    from partir.partition import decide_partition
    from rewrites.buildable import would_regroup

    module = partir.import_jax(PROGRAMS[name], grid((8, 16)))
    decision = decide_partition(module, MESH, [BOTH])
    graph = decision.graph
    asked = [
        o for o, rule in enumerate(graph.rules)
        if rule is not None and rule.regroup is not None
    ]
    before = [[sum(1 for _ in v.uses) for v in graph.ops[o].operands] for o in asked]
    answers = [would_regroup(decision, o, graph.rules[o]) for o in asked]
    assert any(answers)
    assert [[sum(1 for _ in v.uses) for v in graph.ops[o].operands] for o in asked] == before
    module.verify()
