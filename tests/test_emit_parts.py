"""The emitted body in parts (`lowering.jax_parts`): bounded functions, one per
repeated shape, and the same compiled program as one function would give."""

from __future__ import annotations

import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from benchmarks.hlo_stats import collective_stats
from examples import block_train_step, stack_train_step
from lowering import jax_parts
from lowering.loader import load_source
from lowering.to_jax import emit_jax
from tests.numerics import assert_close

MESH = partir.Mesh({"batch": 4, "model": 2})
TACTICS = [partir.BatchParallel("batch"), partir.Megatron("model")]
CASES = {
    "block step": (block_train_step.program, block_train_step.make_args),
    "3-layer stack step": (stack_train_step.program, lambda: stack_train_step.make_args(layers_=3)),
}


@dataclass(frozen=True)
class Name:
    """Stands in for an op: `split_ops` reads only the name."""

    name: str


def test_repeated_layers_are_cut_at_the_same_places():
    rng = np.random.default_rng(0)
    layer = [Name(f"op{k}") for k in rng.integers(0, 12, size=90)]
    ops = [Name(f"head{i}") for i in range(40)] + layer * 60 + [Name("tail")] * 10
    parts = jax_parts.split_ops(ops)
    assert [op for part in parts for op in part] == ops
    assert all(jax_parts.PART_MIN <= len(p) <= jax_parts.PART_MAX for p in parts[:-1])
    middle = parts[2:-2]
    assert len(middle) >= 3 and all(p == middle[0] for p in middle), [len(p) for p in parts]


def _statements(source: str) -> dict[str, int]:
    """Top-level statements of each `_part_k` function."""
    counts: dict[str, int] = {}
    name = None
    for line in source.splitlines():
        if match := re.match(r"def (_part_\d+)\(", line):
            name = match.group(1)
            counts[name] = 0
        elif name and re.match(r"    \S", line) and not line.startswith("    return"):
            counts[name] += 1
        elif not line.startswith(" ") and line:
            name = None
    return counts


def _run(source: str, leaves: list) -> tuple[dict, list[np.ndarray]]:
    program = load_source(source, "parts")
    compiled = program.build(program.make_mesh()).lower(*leaves).compile()
    return collective_stats(compiled.as_text()), [np.asarray(x) for x in compiled(*leaves)]


@pytest.mark.parametrize("case", CASES)
def test_parts_compile_to_the_same_program(case, monkeypatch):
    program, make_args = CASES[case]
    args = make_args()
    leaves = jax.tree_util.tree_leaves(args)
    module = partir.jit(program, mesh=MESH, tactics=TACTICS).lower(*args).module

    monkeypatch.setattr(jax_parts, "PART_MAX", 10**9)
    whole = emit_jax(module)
    monkeypatch.setattr(jax_parts, "PART_MIN", 4)
    monkeypatch.setattr(jax_parts, "PART_MAX", 40)
    small = emit_jax(module)
    assert not _statements(whole), "one part is emitted in _body itself"
    sizes = _statements(small)
    assert len(sizes) > 10 and max(sizes.values()) <= 40, sizes
    assert min(sizes.values()) > 0, "a part of aliases only is no function"
    calls = re.findall(r"= (_part_\d+)\(", small)
    if case.startswith("3-layer"):
        assert len(calls) > len(sizes), "repeated layers share functions"
    assert small.count(", inline=True)") == len({c for c in calls if calls.count(c) > 1})

    collectives, outputs = _run(whole, leaves)
    assert collectives["total"]["count"] > 0
    small_collectives, small_outputs = _run(small, leaves)
    assert small_collectives == collectives
    reference = jax.tree_util.tree_leaves(jax.jit(program)(*args))
    for i, (got, same, ref) in enumerate(zip(small_outputs, outputs, reference, strict=True)):
        np.testing.assert_array_equal(got, same, err_msg=f"output {i}")
        assert_close(got, np.asarray(ref), what=f"output {i}")


def test_layers_named_apart_still_share_a_function(monkeypatch):
    """Each op's statement is commented with where it came from, but the
    comments are not part of a part's text: layers whose name stacks differ
    (`layer0/...`, `layer1/...`) share one function, whose statements name
    the first layer and count the others."""

    def program(ws, x):
        for i, w in enumerate(ws):
            with jax.named_scope(f"layer{i}"):
                x = jnp.tanh(x @ w) * 0.5 + x
        return x

    ws = tuple(np.full((16, 16), 0.001 * i, np.float32) for i in range(32))
    x = np.ones((8, 16), np.float32)
    lowered = partir.jit(
        program, mesh=MESH, tactics=[partir.BatchParallel("batch", inputs="x")]
    ).lower(ws, x)
    monkeypatch.setattr(jax_parts, "PART_MIN", 4)
    monkeypatch.setattr(jax_parts, "PART_MAX", 12)
    source = emit_jax(lowered.module)
    calls = re.findall(r"= (_part_\d+)\(", source)
    shared = {c for c in calls if calls.count(c) > 1}
    assert shared, calls
    first = re.search(rf"def {min(shared)}\(.*?\n\n\n", source, re.S)
    assert first is not None
    noted = [line for line in first.group(0).splitlines() if "lax.tanh(" in line]
    assert noted and all(
        re.search(r"  # \S+test_emit_parts\.py:\d+ jit\(program\)/layer\d+/tanh \(and \d+ other places?\)$", line)
        for line in noted
    ), noted
    _, (got,) = _run(source, [*ws, x])
    assert_close(got, np.asarray(jax.jit(program)(ws, x)), what="output")
