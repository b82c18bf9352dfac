"""JAX's own StableHLO text (`jax.jit(f).lower(...).as_text()`, MLIR's pretty
syntax) reads back: compact reduces (`applies stablehlo.add across
dimensions = [1]`) and pretty convolutions (`dim_numbers = ..., window =
{...}`) included. Checked on numbers for every example, and partitioned."""

from __future__ import annotations

import importlib
import subprocess
import sys

import jax
import pytest

import partir
from dialects.context import make_context
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from dialects.parser import PartirParser
from examples import ALL as EXAMPLES
from lowering.to_spmd import lower_to_spmd
from rewrites.inline_calls import InlineCallsPass
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})


def pretty_module(program, args):
    """JAX's text of `program`, parsed, its private functions inlined."""
    text = jax.jit(program).lower(*args).as_text()
    module = PartirParser(make_context(), text, "jax.mlir").parse_module()
    InlineCallsPass().apply(make_context(), module)
    module.verify()
    return module, text


@pytest.mark.parametrize("name", [*EXAMPLES, "cnn_train_step"])
def test_jax_text_of_every_example_reads_back_and_runs(name):
    example = importlib.import_module(f"examples.{name}")
    args = example.make_args()
    module, _ = pretty_module(example.program, args)
    got = run_function(module, jax.tree_util.tree_leaves(args))
    assert_leaves_close(got, jax.jit(example.program)(*args), what=name)


def test_the_compact_forms_are_what_jax_prints():
    example = importlib.import_module("examples.cnn_train_step")
    _, text = pretty_module(example.program, example.make_args())
    assert "applies stablehlo.add across dimensions" in text
    assert "stablehlo.convolution(" in text and "window = {" in text


def test_jax_text_partitions_like_the_imported_program():
    """The CNN step's text, its data split over "batch" by position: the
    same collectives as the program partir imports itself."""
    example = importlib.import_module("examples.cnn_train_step")
    args = example.make_args()
    module, _ = pretty_module(example.program, args)
    leaves = jax.tree_util.tree_leaves(args)
    data = {f"args/{len(leaves) - 2}": {0: "batch"}, f"args/{len(leaves) - 1}": {0: "batch"}}
    partir.partition(module, MESH, [partir.ManualPartition(data)])
    lower_to_spmd(module)
    want = jax.tree_util.tree_leaves(jax.jit(example.program)(*args))
    assert_leaves_close(run_spmd(module, leaves), want, what="SPMD interpreter")
    kinds = {op.kind for op in module.walk() if hasattr(op, "kind") and op.name.startswith("spmd.")}
    assert kinds == {"all_reduce"}, kinds


@pytest.mark.parametrize("name", ["block_train_step", "cnn_train_step"])
def test_partir_opt_partitions_jax_text(name, tmp_path):
    """The CLI pipeline on a file of JAX's text: inline, declare the mesh,
    split the first data argument over "batch", propagate, lower, emit."""
    example = importlib.import_module(f"examples.{name}")
    args = example.make_args()
    text = jax.jit(example.program).lower(*args).as_text()
    path = tmp_path / f"{name}.mlir"
    path.write_text(text)
    data = len(jax.tree_util.tree_leaves(args)) - 2  # x / images
    pipeline = (
        'inline-calls,partir-declare-mesh{axes="batch=4"},'
        f"partir-tile{{value={data} dim=0 axis=batch}},partir-propagate,partir-lower-spmd"
    )
    done = subprocess.run(
        [sys.executable, "-m", "partir.opt", str(path), "-p", pipeline],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert 'spmd.all_reduce' in done.stdout and 'over ["batch"]' in done.stdout


def _more_programs():
    import jax.numpy as jnp

    from tests import test_moe, test_sorting

    x = test_sorting.data()
    return {
        "MoE step (chlo.top_k)": (test_moe.step, test_moe.make_args()),
        "argsort": (lambda x: jnp.argsort(x, axis=1), (x,)),
        "cumsum": (lambda x: jnp.cumsum(x, axis=1), (x,)),
    }


@pytest.mark.parametrize("name", sorted(_more_programs()))
def test_jax_text_of_other_programs_reads_back_and_runs(name):
    program, args = _more_programs()[name]
    module, _ = pretty_module(program, args)
    got = run_function(module, jax.tree_util.tree_leaves(args))
    assert_leaves_close(got, jax.jit(program)(*args), what=name)
