"""What each tactic selected, and why (issue 12): every tactic's plan records,
for each leaf it looked at, the dim and axis it splits (or that it leaves it
as it is), the role it took the leaf for and the reason. The tactic passes
write them on the module (`#partir.selection`), so `Lowered.report()`,
`partir-inspect` on a stage's IR file and its JSON show them, with one line
per tactic.

Checked on programs whose parameters are not called `params`: a Llama-style
step with its parameters under `p` (a list of `layers` inside) and Adam's
`m` and `v` beside them, and a momentum step whose parameters' root is
`layers` itself.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from dialects.interpreter.spmd import run_spmd
from partir.inspect import main as partir_inspect
from partir.report import build_report, parse_module
from partir.selections import Selection, recorded_selections
from tests import test_partial_sums as llama
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})
DP, TP = partir.BatchParallel("batch"), partir.Megatron("model")


@pytest.fixture(scope="module")
def llama_report():
    args = llama.make_args(batch=8, seq=4, width=16, hidden=16, layers=2)
    tactics = [DP, TP, partir.ZeRO("batch", stage=3)]
    lowered = partir.jit(llama.step, mesh=MESH, tactics=tactics).lower(*args)
    return lowered, args


def test_each_tactic_has_one_line_saying_what_it_split(llama_report):
    """p holds 2 layers of 9 leaves and a final norm: 19 leaves, mirrored by
    Adam's m and v (57 state leaves in all, beside the data x and y)."""
    lowered, _ = llama_report
    assert lowered.report().tactic_lines() == [
        "BatchParallel(batch): 2 data leaves on dim 0, 57 state leaves not split",
        "Megatron(model): 10 column weight leaves on dim 1, 4 row weight leaves on dim 0, "
        "5 parameter leaves not split",
        "ZeRO-3(batch): 38 optimizer state leaves on dim 0, 19 parameter leaves on dim 0, "
        "57 update leaves on dim 0, 1 update leaf not split",
    ]


def test_each_leaf_says_why(llama_report):
    lowered, _ = llama_report
    chosen = {(s.tactic, s.leaf): s for s in lowered.report().selections}
    assert chosen["BatchParallel(batch)", "x"] == Selection(
        "BatchParallel(batch)", "x", 0, "batch", "data",
        "not returned updated; shares leading dim 8 with y")
    assert chosen["BatchParallel(batch)", "m['final_norm']"] == Selection(
        "BatchParallel(batch)", "m['final_norm']", None, "", "state",
        "returned updated as result/2")
    assert chosen["Megatron(model)", "p['layers'][1]['q_proj']"] == Selection(
        "Megatron(model)", "p['layers'][1]['q_proj']", 1, "model", "column weight",
        "named q_proj, a q/k/v or MLP-in weight: split on its output dim")
    assert chosen["Megatron(model)", "p['layers'][0]['down_proj']"] == Selection(
        "Megatron(model)", "p['layers'][0]['down_proj']", 0, "model", "row weight",
        "named down_proj, an attention-out or MLP-out weight: split on its input dim")
    assert chosen["Megatron(model)", "p['layers'][0]['mlp_norm']"].reason == (
        "not named like a Megatron weight")
    assert chosen["ZeRO-3(batch)", "v['layers'][0]['up_proj']"].reason == (
        "under v, which mirrors the parameters p")
    assert chosen["ZeRO-3(batch)", "p['final_norm']"].reason == (
        "under p, mirrored by the optimizer state m, v")
    assert chosen["ZeRO-3(batch)", "result[0]"].reason == "returned by the step; a scalar, left whole"
    # in schedule order (each tactic's leaves grouped by decision and reason)
    tactics = [s.tactic for s in lowered.report().selections]
    assert tactics == sorted(tactics, key=["BatchParallel(batch)", "Megatron(model)",
                                           "ZeRO-3(batch)"].index)


def test_the_report_tables_and_json_hold_them(llama_report):
    lowered, _ = llama_report
    report = lowered.report()
    text = report.to_text()
    summary = text[: text.index("\n\n")]
    assert "tactic          Megatron(model): 10 column weight leaves on dim 1" in summary
    table = text[text.index("== what each tactic selected =="):].split("\n\n")[0]
    assert "Megatron(model)       p['layers'][1]['q_proj']" in table
    assert len(table.splitlines()) == 3 + len(report.selections)
    data = report.to_json()
    assert [t["tactic"] for t in data["tactics"]] == [
        "BatchParallel(batch)", "Megatron(model)", "ZeRO-3(batch)"]
    assert {"tactic": "Megatron(model)", "leaf": "p['layers'][0]['k_proj']", "dim": 1,
            "axis": "model", "role": "column weight",
            "reason": "named k_proj, a q/k/v or MLP-in weight: split on its output dim",
            } in data["selections"]


def test_partir_inspect_reads_them_from_the_ir(llama_report, tmp_path, capsys):
    """The SPMD stage's text alone says what each tactic chose: the module
    attribute prints, parses back equal, and partir-inspect shows it."""
    lowered, _ = llama_report
    path = tmp_path / "step.spmd.mlir"
    path.write_text(lowered.stage("spmd"))
    parsed = parse_module(path.read_text(), str(path))
    assert recorded_selections(parsed) == lowered.report().selections
    assert partir_inspect([str(path)]) == 0
    text = capsys.readouterr().out
    for line in lowered.report().tactic_lines():
        assert line in text
    assert partir_inspect([str(path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["selections"]) == len(lowered.report().selections)


def momentum_step(layers, velocity, x, y):
    """Two MLP layers in a list that is the parameters' root, trained with
    momentum SGD (the velocity mirrors `layers`)."""

    def loss(layers):
        h = x
        for layer in layers:
            h = jnp.tanh(h @ layer["w_in"]) @ layer["w_out"]
        return jnp.mean((h - y) ** 2)

    value, grads = jax.value_and_grad(loss)(layers)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    layers = jax.tree.map(lambda w, v: w - 0.1 * v, layers, velocity)
    return value, layers, velocity


def momentum_args():
    rng = np.random.default_rng(1)
    layers = [{"w_in": rng.standard_normal((16, 32)).astype(np.float32) / 4,
               "w_out": rng.standard_normal((32, 16)).astype(np.float32) / 6} for _ in range(2)]
    velocity = jax.tree.map(lambda w: w * 0.01, layers)
    x, y = (rng.standard_normal((8, 16)).astype(np.float32) for _ in range(2))
    return layers, velocity, x, y


def test_a_parameters_root_named_layers():
    """The conventions apply under whatever root holds the parameters
    (`layers/**/w_in`), and ZeRO-1 finds the velocity by its mirroring the
    parameters' tree: the lines say so, and the numbers are `jax.jit`'s."""
    args = momentum_args()
    tactics = [DP, TP, partir.ZeRO("batch", stage=1)]
    lowered = partir.jit(momentum_step, mesh=MESH, tactics=tactics).lower(*args)
    assert_leaves_close(run_spmd(lowered.module, jax.tree.leaves(args)),
                        jax.tree.leaves(jax.jit(momentum_step)(*args)), what="momentum step")
    report = lowered.report()
    assert report.tactic_lines() == [
        "BatchParallel(batch): 2 data leaves on dim 0, 8 state leaves not split",
        "Megatron(model): 2 column weight leaves on dim 1, 2 row weight leaves on dim 0",
        "ZeRO-1(batch): 4 optimizer state leaves on dim 0, "
        "4 updated parameter leaves returned whole",
    ]
    chosen = {(s.tactic, s.leaf): s.reason for s in report.selections}
    assert chosen["ZeRO-1(batch)", "velocity[1]['w_out']"] == (
        "under velocity, which mirrors the parameters layers")
    assert chosen["BatchParallel(batch)", "layers[0]['w_in']"] == "returned updated as result/1"


def test_zero_says_which_dim_it_split_and_why():
    """A stack of 2 layers over 4 devices: dim 0 is too short, and no dim
    divides by 4, so the first long enough is split, padded."""
    params = {"blocks": {"w": np.ones((2, 6, 10), np.float32)}}
    opt = {"m": jax.tree.map(np.zeros_like, params), "count": np.zeros((), np.int32)}

    def step(params, opt, x):
        g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["blocks"]["w"][0].T)))(params)
        m = jax.tree.map(lambda m, g: m + g, opt["m"], g)
        return jax.tree.map(lambda p, m: p - m, params, m), {"m": m, "count": opt["count"] + 1}

    module = partir.import_jax(step, params, opt, np.ones((8, 10), np.float32))
    partir.partition(module, partir.Mesh({"batch": 4}), [partir.ZeRO("batch", stage=1)])
    report = build_report(module)
    assert report.tactic_lines() == [
        "ZeRO-1(batch): 1 optimizer state leaf on dim 1, 1 optimizer state leaf not split, "
        "1 updated parameter leaf returned whole"]
    returned = [s for s in report.selections if s.role == "updated parameter"]
    assert [(s.leaf, s.split) for s in returned] == [
        ("result[0]['blocks']['w']", "returned whole over batch")]
    state = [s for s in report.selections if s.role != "updated parameter"]
    split, whole = sorted(state, key=lambda s: s.dim is None)
    assert split.reason == ("under opt, which mirrors the parameters params; "
                            "dim 0 has 2 elements, fewer than 4 devices, dim 1 padded 6 -> 8")
    assert (whole.leaf, whole.reason) == (
        "opt['count']", "under opt, which mirrors the parameters params; a scalar, left whole")


def test_user_names_stay_strings_on_every_printed_path(tmp_path, capsys):
    """A key holding a quote and a newline: a string literal in the IR
    (parsed back equal), one escaped row in partir-inspect."""
    weird = 'w"1\nx'
    params = {weird: np.ones((16, 8), np.float32)}

    def step(params, x):
        return jax.tree.map(lambda w: w - 0.1 * x.T @ (x @ w), params)

    module = partir.import_jax(step, params, np.ones((8, 16), np.float32))
    partir.partition(module, partir.Mesh({"batch": 4}), [DP])
    path = tmp_path / "core.mlir"
    path.write_text(str(module))
    assert recorded_selections(parse_module(path.read_text())) == recorded_selections(module)
    assert partir_inspect([str(path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "  state  " in line]
    # JAX's path form escapes the newline (`\n`); the table escapes the rest
    assert len(rows) == 1 and '"params[\'w\\221\\\\nx\']"' in rows[0]
