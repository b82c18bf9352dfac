"""Every `benchmarks/vs_jit.py` row moves what it moved under the rewrite engine, or less.

The decided path (`partition()`'s default) and the rewrite engine (the
reference, `engine="rewrite"`) partition each row's program (small shapes)
with the row's tactics; their SPMD lowerings must have the same collectives
(kind, axes, count and local type, so the same bytes per device), or
move fewer bytes per device (the CNN's output-channel split: its second
convs' partial sums are reduce-scattered onto their channels). Rows the
decided path hands to the rewrite engine (ZeRO after another tactic, a
padded dim) pass trivially, and stay listed so that a row that starts being
built shows here first. One row runs in the default suite, all of them in
the long profile (`-m slow`).
"""

from __future__ import annotations

import pytest

import partir
from benchmarks import vs_jit
from partir.partition import partition
from tests.test_build_core import _bytes, collectives


def _rows() -> dict[str, tuple]:
    rows = {}
    for name, (fn, args) in vs_jit.programs(True).items():
        for strategy, tactics in vs_jit.STRATEGIES.items():
            rows[f"{name}/{strategy}"] = (fn, args, tactics)
    for table, (fn, args) in (
        (vs_jit.SCANNED_STRATEGIES, vs_jit.scanned(True)),
        (vs_jit.CNN_STRATEGIES, vs_jit.cnn(True)),
    ):
        label = "scanned" if table is vs_jit.SCANNED_STRATEGIES else "cnn"
        for strategy, tactics in table.items():
            rows[f"{label}/{strategy}"] = (fn, args, tactics)
    return rows


ROWS = _rows()
FAST = {"block step/DP+TP"}
"""The default suite's row: built by the decided path, both axes in play."""


@pytest.mark.parametrize(
    "row",
    [r if r in FAST else pytest.param(r, marks=pytest.mark.slow) for r in ROWS],
)
def test_a_vs_jit_row_has_the_rewrite_engines_collectives(row: str) -> None:
    fn, args, tactics = ROWS[row]
    decided = partir.import_jax(fn, *args)
    engine = partir.import_jax(fn, *args)
    partition(decided, vs_jit.MESH, list(tactics))
    partition(engine, vs_jit.MESH, list(tactics), engine="rewrite")
    ours, theirs = collectives(decided), collectives(engine)
    if ours != theirs:  # a better plan of the decided path's own: fewer bytes moved
        assert _bytes(decided) < _bytes(engine), (ours, theirs)


def test_the_rows_are_the_benchmarks() -> None:
    assert FAST <= set(ROWS)
    assert len(ROWS) == len(vs_jit.programs(True)) * len(vs_jit.STRATEGIES) + len(
        vs_jit.SCANNED_STRATEGIES
    ) + len(vs_jit.CNN_STRATEGIES)
