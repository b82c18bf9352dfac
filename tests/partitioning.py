"""Helpers for partitioning tests: run a schedule and check it on numbers."""

from __future__ import annotations

import collections
from typing import Any

import jax

import partir
from dialects.interpreter import run_function
from dialects.partir import LoopOp, SumAttr
from rewrites.projection import loop_axes
from tests.numerics import assert_leaves_close

MESH = partir.Mesh({"batch": 4, "model": 2})


def partition_and_check(program, args, tactics, mesh: partir.Mesh = MESH) -> partir.Partitioned:
    """Partition `program` at `args`, verify after each tactic, and check that
    the interpreter on the result equals `jax.jit(program)` leaf by leaf."""
    module = partir.import_jax(program, *args)
    result = partir.partition(module, mesh, tactics, verify=True)
    got = run_function(module, jax.tree_util.tree_leaves(args))
    assert_leaves_close(got, jax.jit(program)(*args), what="result")
    return result


def loop_counts(module: Any) -> collections.Counter[tuple[str, str]]:
    """(axis, "tile" | "sum") -> number of loops."""
    return collections.Counter(
        (op.axis_name, "sum" if isinstance(op.action, SumAttr) else "tile")
        for op in module.walk() if isinstance(op, LoopOp)
    )


enclosing_loop_axes = loop_axes
