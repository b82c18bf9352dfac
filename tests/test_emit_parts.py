"""The emitted body in parts (`lowering.jax_parts`): bounded functions, one per
repeated shape, and the same compiled program as one function would give.

The bounds are a parameter of `emit_jax`, so these programs of a few thousand
ops are cut into parts of at most 40 ops: the parted path, nested loops and
conditionals included, runs on small programs."""

from __future__ import annotations

import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partir
from benchmarks.hlo_stats import collective_stats
from examples import block_train_step, scanned_stack, stack_train_step
from lowering import jax_parts
from lowering.loader import load_source
from lowering.to_jax import emit_jax
from tests.numerics import assert_close
from tests.test_conditionals import clipped_step

MESH = partir.Mesh({"batch": 4, "model": 2})
TACTICS = [partir.BatchParallel("batch"), partir.Megatron("model")]
CASES = {
    "block step": (block_train_step.program, block_train_step.make_args),
    "3-layer stack step": (stack_train_step.program, lambda: stack_train_step.make_args(layers_=3)),
    "scanned step (lax.scan)": (
        scanned_stack.train_step,
        lambda: scanned_stack.make_args(layers_=2),
    ),
    "clipped step (lax.cond)": (clipped_step, block_train_step.make_args),
}
NESTED = {"scanned step (lax.scan)": "lax.while_loop(", "clipped step (lax.cond)": "lax.switch("}
WHOLE = jax_parts.PartBounds(min=10**9, max=2 * 10**9)
SMALL = jax_parts.PartBounds(min=4, max=40, radius=8)


@dataclass(frozen=True)
class Name:
    """Stands in for an op: `split_ops` reads only the name."""

    name: str


def test_repeated_layers_are_cut_at_the_same_places():
    rng = np.random.default_rng(0)
    layer = [Name(f"op{k}") for k in rng.integers(0, 12, size=90)]
    ops = [Name(f"head{i}") for i in range(40)] + layer * 60 + [Name("tail")] * 10
    bounds = jax_parts.PartBounds()
    parts = jax_parts.split_ops(ops, bounds)
    assert [op for part in parts for op in part] == ops
    assert all(bounds.min <= len(p) <= bounds.max for p in parts[:-1])
    middle = parts[2:-2]
    assert len(middle) >= 3 and all(p == middle[0] for p in middle), [len(p) for p in parts]


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.integers(0, 5), max_size=600),
    smallest=st.integers(1, 40),
    extra=st.integers(0, 100),
    radius=st.integers(1, 80),
)
def test_parts_cover_the_ops_in_order_within_the_bounds(names, smallest, extra, radius):
    bounds = jax_parts.PartBounds(min=smallest, max=2 * smallest + extra, radius=radius)
    ops = [Name(f"op{k}") for k in names]
    parts = jax_parts.split_ops(ops, bounds)
    assert [op for part in parts for op in part] == ops
    assert all(part for part in parts)
    assert all(len(part) <= bounds.max for part in parts)
    assert all(len(part) >= bounds.min for part in parts[:-1])


def test_bounds_that_cannot_be_met_are_refused():
    with pytest.raises(ValueError, match="2 \\* min <= max"):
        jax_parts.PartBounds(min=40, max=60)


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


def _part_functions(source: str) -> str:
    """The text of the `_part_k` functions (up to `_body`)."""
    return source[source.index("\ndef _part_") : source.index("\ndef _body(")]


@pytest.mark.parametrize("case", CASES)
def test_parts_compile_to_the_same_program(case):
    program, make_args = CASES[case]
    args = make_args()
    leaves = jax.tree_util.tree_leaves(args)
    module = partir.jit(program, mesh=MESH, tactics=TACTICS).lower(*args).module

    whole = emit_jax(module, part_bounds=WHOLE)
    small = emit_jax(module, part_bounds=SMALL)
    assert not _statements(whole), "one part is emitted in _body itself"
    if case in NESTED:
        assert NESTED[case] in _part_functions(small), "the region's op runs inside a part"
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


def test_layers_named_apart_still_share_a_function():
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
    source = emit_jax(lowered.module, part_bounds=jax_parts.PartBounds(min=4, max=12, radius=4))
    calls = re.findall(r"= (_part_\d+)\(", source)
    shared = {c for c in calls if calls.count(c) > 1}
    assert shared, calls
    layer = max(shared, key=calls.count)
    first = re.search(rf"def {layer}\(.*?\n\n\n", source, re.S)
    assert first is not None
    noted = [line for line in first.group(0).splitlines() if "lax.tanh(" in line]
    assert noted and all(
        re.search(r"  # \S+test_emit_parts\.py:\d+ jit\(program\)/layer\d+/tanh \(and \d+ other places?\)$", line)
        for line in noted
    ), noted
    _, (got,) = _run(source, [*ws, x])
    assert_close(got, np.asarray(jax.jit(program)(ws, x)), what="output")


def test_a_deeper_stack_calls_the_same_functions_more_often():
    """With the default bounds, the parts of a 2-layer step are all a
    3-layer step needs: its third layer is calls, not new statements."""
    emitted = {}
    for layers_ in (2, 3):
        args = stack_train_step.make_args(layers_=layers_)
        lowered = partir.jit(stack_train_step.program, mesh=MESH, tactics=TACTICS).lower(*args)
        emitted[layers_] = emit_jax(lowered.module)
    two, three = (_statements(emitted[n]) for n in (2, 3))
    assert sum(three.values()) == sum(two.values()), (two, three)
    assert max(three.values()) <= jax_parts.PartBounds().max
    calls = re.findall(r"= (_part_\d+)\(", emitted[3])
    assert len(calls) > len(re.findall(r"= (_part_\d+)\(", emitted[2])) > len(three)
