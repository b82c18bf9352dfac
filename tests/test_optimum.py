"""`benchmarks/optimum.py`'s lower bounds, derived from shapes and placement,
reproduce the hand-derived ones (issue 13's block step: two forward and one
backward activation sum over "model", the gradient sums over "batch")."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

from benchmarks.optimum import bound, rows


@pytest.mark.parametrize(("name", "expected"), [
    ("block step DP+TP", 2_369_028),
    ("block step TP", 3 * 8 * 128 * 256 * 4 + 2 * 256 * 4),
    ("MLP step DP", (512 * 2048 + 2048 + 2048 * 512 + 512) * 4 + 4),
])
def test_a_bound_is_the_hand_derived_one(name, expected):
    (row,) = [r for r in rows() if r.name == name]
    got = bound(row)
    assert got is not None and got[0] == expected, got
